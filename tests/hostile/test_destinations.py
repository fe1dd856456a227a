"""Destinations: nothing a user owns is ever destroyed, renamed or written through.

A leftover is only what a run of ours provably left (a partial folder holding our lock file, a
replaced folder carrying our marker that names that very folder), never a name, and never the
source of the run; `--force` replaces only what weightsmith wrote or an empty folder; no command
writes into its source; every file is created inside its destination without following a link;
names from inputs are never path components as they are; a full disk is one line.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hostile.harness import (
    Sandbox,
    changed_outside,
    copies,
    leftovers,
    run_inprocess,
    snapshot,
    tiny_pair,
    tiny_source,
)
from weightsmith.bench.config import parse_config
from weightsmith.bench.outdir import claim, own
from weightsmith.bench.report import write_results_file
from weightsmith.bench.results import PromptInfo, RequestRecord, VisitResult
from weightsmith.bench.runner import new_results
from weightsmith.core import files
from weightsmith.io.manifest import MANIFEST_FILE
from weightsmith.io.outputdir import LOCK_FILE

QUANTIZE = ("--scheme", "w4a16", "--group-size", "32", "--workers", "1", "--no-hash")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("pair"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _refused(capsys, monkeypatch, sandbox: Sandbox, *args: object) -> str:
    """`weightsmith ARGS`: exit 2, one line, and nothing in the sandbox changed."""
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, *args)
    line = result.error_line
    assert result.code == 2, result
    _unchanged_but(sandbox)
    return line


def _unchanged_but(sandbox: Sandbox, *allowed: str) -> None:
    """`Sandbox.assert_untouched` for cases whose user folders are named `*.partial-*` on purpose:
    those were there before, and must still be; no other appeared."""
    changed = changed_outside(sandbox.before, snapshot(sandbox.root), *allowed)
    assert not changed, f"changed outside {allowed}: {changed}"
    left = [p for p in leftovers(sandbox.root) if p not in sandbox.before]
    assert not left, f"left behind: {left}"


# --- leftovers are what our runs provably left, never the source -------------------------------------


@pytest.mark.parametrize("kind", ["partial", "replaced"])
def test_a_source_named_like_a_leftover_is_read_not_removed(capsys, monkeypatch, sandbox: Sandbox, kind: str) -> None:
    """`quantize m.partial-999999 m` once deleted its source; `m.replaced-999999` was moved to `m`.
    Here the source even holds our lock file (free) or marker: it is still the source, and is kept."""
    src = tiny_source(sandbox, f"m.{kind}-{_dead_pid()}")
    if kind == "partial":
        (src / LOCK_FILE).write_bytes(b"")
    out = sandbox.root / "m"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE)
    assert result.code == 0, result.err
    assert "removed" not in result.out and "restored" not in result.out
    assert (out / MANIFEST_FILE).is_file()
    _unchanged_but(sandbox, "m")


def test_a_users_folders_named_like_leftovers_are_left_alone(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """Folders named `OUT.partial-<pid>`/`OUT.replaced-<pid>` of a gone process, without our lock file
    or marker, are someone's: neither removed nor put back as OUT."""
    src = tiny_source(sandbox, "src")
    for kind in ("partial", "replaced"):
        mine = sandbox.root / f"out.{kind}-{_dead_pid()}"
        mine.mkdir()
        (mine / "notes.txt").write_text("mine\n")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", *QUANTIZE)
    assert result.code == 0, result.err
    _unchanged_but(sandbox, "out")


def test_a_marker_copied_into_another_folder_proves_nothing(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A replaced folder is ours only when its marker names that very folder (device and inode): a copy
    of a real leftover, marker included, is a user's folder."""
    from weightsmith.io.outputdir import REPLACED_MARKER

    src = tiny_source(sandbox, "src")
    copy = sandbox.root / f"out.replaced-{_dead_pid()}"
    copy.mkdir()
    (copy / "notes.txt").write_text("mine\n")
    record = {"pid": int(copy.name.rsplit("-", 1)[1]), "device": copy.stat().st_dev, "inode": copy.stat().st_ino + 1}
    (copy / REPLACED_MARKER).write_text(json.dumps(record))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", *QUANTIZE)
    assert result.code == 0, result.err
    sandbox.assert_untouched("out")


@pytest.mark.parametrize("kind", ["partial", "replaced"])
def test_a_folder_in_the_way_of_our_own_names_is_refused(capsys, monkeypatch, sandbox: Sandbox, kind: str) -> None:
    """`OUT.partial-<our pid>` was removed unasked before the run began; a user's folder of that name
    (or of the name OUT would be renamed aside to) now stops the run with one line instead."""
    src = tiny_source(sandbox, "src")
    out = sandbox.root / "out"
    if kind == "replaced":
        run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE)
    mine = sandbox.root / f"out.{kind}-{os.getpid()}"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    line = _refused(capsys, monkeypatch, sandbox, "quantize", src, out, *QUANTIZE, "--force")
    assert mine.name in line and "in the way" in line, line


def test_a_killed_replace_leaves_a_marker_that_the_next_run_clears(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A run killed after marking OUT but before renaming it aside: the marker names a gone process,
    so the next run for OUT removes it, and OUT is otherwise untouched."""
    from weightsmith.io.outputdir import REPLACED_MARKER, remove_stale

    src = tiny_source(sandbox, "src")
    out = sandbox.root / "out"
    assert run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE).code == 0
    sandbox.freeze()
    record = {"pid": _dead_pid(), "device": out.stat().st_dev, "inode": out.stat().st_ino}
    (out / REPLACED_MARKER).write_text(json.dumps(record))
    assert remove_stale(out) == []
    sandbox.assert_untouched()


# --- --force replaces only what weightsmith wrote, or an empty folder -----------------------------------


def test_force_refuses_a_folder_of_the_users_files(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = tiny_source(sandbox, "src")
    mine = sandbox.root / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    line = _refused(capsys, monkeypatch, sandbox, "quantize", src, mine, *QUANTIZE, "--force")
    assert str(mine) in line and MANIFEST_FILE in line, line


def test_force_replaces_an_empty_folder_or_our_own_output(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = tiny_source(sandbox, "src")
    out = sandbox.root / "out"
    out.mkdir()
    for _ in range(2):  # an empty folder, then the output the first run wrote
        result = run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE, "--force")
        assert result.code == 0, result.err
        assert (out / MANIFEST_FILE).is_file()
    assert sorted(p.name for p in sandbox.root.iterdir()) == ["out", "src"]


def test_gptq_refuses_a_users_folder_before_its_run(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """The GPTQ values take hours: an OUT that --force may not replace is refused before the first token."""
    from weightsmith.calibration import measure as calibrate

    def too_late(*args: object, **kwargs: object) -> None:
        raise AssertionError("the calibration run started before the destination was checked")

    monkeypatch.setattr(calibrate, "calibration_tokens", too_late)
    src = tiny_source(sandbox, "src")
    mine = sandbox.root / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    line = _refused(capsys, monkeypatch, sandbox, "quantize", src, mine, *QUANTIZE, "--method", "gptq", "--force")
    assert str(mine) in line and MANIFEST_FILE in line, line


def test_calibrate_force_refuses_a_file_that_is_not_statistics(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = tiny_source(sandbox, "src")
    weights = tiny_source(sandbox, "other") / "model.safetensors"
    line = _refused(capsys, monkeypatch, sandbox, "calibrate", src, "--out", weights, "--force")
    assert str(weights) in line and "not a weightsmith statistics file" in line, line


def test_bench_force_no_longer_writes_into_a_users_folder(capsys, monkeypatch, sandbox: Sandbox) -> None:
    out = sandbox.root / "out"
    out.mkdir()
    (out / "report.md").write_text("my own report\n")
    arms = sandbox.root / "arms.toml"
    arms.write_text('repeats = 1\n[determinism]\nreplicates = 0\n[[arms]]\nname = "a"\nurl = "http://127.0.0.1:9"\n')
    line = _refused(capsys, monkeypatch, sandbox, "bench", "run", arms, "--out", out, "--quiet", "--force")
    assert str(out) in line and "bench did not write" in line, line


# --- no command writes into its source --------------------------------------------------------------


@pytest.mark.parametrize("name", ["model.safetensors", "stats.safetensors"])
def test_calibrate_refuses_an_out_inside_the_source(capsys, monkeypatch, sandbox: Sandbox, name: str) -> None:
    """`--out SRC/model.safetensors --force` replaced the weights with 2 KB of statistics."""
    src = tiny_source(sandbox, "src")
    line = _refused(capsys, monkeypatch, sandbox, "calibrate", src, "--out", src / name, "--force")
    assert str(src / name) in line and "inside the source" in line, line


def test_calibrate_kv_refuses_an_out_inside_a_source(capsys, monkeypatch, sandbox: Sandbox, pair) -> None:
    orig, quant = copies(sandbox, pair)
    for args in ((quant, "--out", quant / "kv"), (quant, "--from", orig, "--out", orig / "kv")):
        line = _refused(capsys, monkeypatch, sandbox, "calibrate-kv", *args)
        assert "inside the source" in line, line


def test_transplant_refuses_an_out_inside_the_donor(capsys, monkeypatch, sandbox: Sandbox, pair) -> None:
    orig, quant = copies(sandbox, pair)
    line = _refused(capsys, monkeypatch, sandbox, "transplant", orig, quant, "--select", "re:.*norm.*",
                    "--replace", "--out", orig / "t")  # fmt: skip
    assert str(orig / "t") in line and "inside the source" in line, line


# --- bench report: no link followed, no name from the results file used as a path -----------------------


def _results(folder: Path, arms: tuple[str, ...] = ("a", "b")) -> Path:
    """A results.json as `bench run` writes it, one visit per arm, with a decode rate (so plots are drawn)."""
    config = parse_config({"repeats": 1, "arms": [{"name": a, "url": f"http://h:{i + 1}"} for i, a in enumerate(arms)]})
    results = new_results(config)
    results.prompts.append(PromptInfo("p80.0", 80, 0, "synthetic", 400))
    for position, arm in enumerate(arms):
        record = RequestRecord("p80.0", 80, 0, ttft_s=0.1, decode_tok_s=50.0, e2e_s=0.5, completion_tokens=16)
        results.visits.append(VisitResult(arm=arm, repeat=0, position=position, requests=[record]))
    return write_results_file(results, None, folder)


def test_bench_report_replaces_a_link_named_like_a_plot(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A plot bench wrote, swapped for a link, is replaced, not written through (a link bench did not
    write is not replaced at all: test_destinations_owned.py)."""
    path = _results(sandbox.root / "run")
    assert run_inprocess(capsys, monkeypatch, "bench", "report", path).code == 0
    victim = sandbox.root / "victim.txt"
    victim.write_text("a user's file\n")
    (sandbox.root / "run" / "ttft.png").unlink()
    (sandbox.root / "run" / "ttft.png").symlink_to(victim)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "bench", "report", path)
    assert result.code == 0, result.err
    plot = sandbox.root / "run" / "ttft.png"
    assert not plot.is_symlink() and plot.read_bytes().startswith(b"\x89PNG")
    sandbox.assert_untouched("run")


def test_bench_report_escapes_an_arm_name_holding_a_slash(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A sweep arm `x/y@k=1` made `sweep-x/y.png`: through a link `sweep-x -> elsewhere`, a file outside --out."""
    path = _results(sandbox.root / "run")
    data = json.loads(path.read_text())
    for arm, value in zip(data["arms"], (1, 2), strict=True):
        arm.update(name=f"x/y@k={value}", sweep_param="k", sweep_value=value)
    data["baseline"] = data["arms"][0]["name"]
    for visit, arm in zip(data["visits"], data["arms"], strict=True):
        visit["arm"] = arm["name"]
    data["config"] = {}
    path.write_text(json.dumps(data))
    elsewhere = sandbox.root / "elsewhere"
    elsewhere.mkdir()
    out = sandbox.root / "out"
    claim(out)
    (out / "sweep-x").symlink_to(elsewhere)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "bench", "report", path, "--out", out)
    assert result.code == 0, result.err
    plot = out / f"{files.file_part('sweep-x/y')}.png"
    assert plot.read_bytes().startswith(b"\x89PNG") and "/" not in plot.name
    assert f"]({plot.name})" in (out / "report.md").read_text()
    sandbox.assert_untouched("out")


def _bench_folder(sandbox: Sandbox, link: str, to: Path) -> tuple[Path, Path]:
    """(arms file, --out): an arm whose server (kind vllm, so it has a compile cache) exits at once, and a
    folder bench wrote in which `link` points at `to`."""
    arms = sandbox.root / "arms.toml"
    command = json.dumps([sys.executable, "-c", "pass", "{port}"])
    arms.write_text(f'repeats = 1\n[determinism]\nreplicates = 0\n[[arms]]\nname = "a"\nkind = "vllm"\n'
                    f"command = {command}\nstartup_timeout_s = 20\n")  # fmt: skip
    out = sandbox.root / "out"
    claim(out)
    own(out, link)  # a name bench wrote, swapped for a link since
    (out / link).parent.mkdir(parents=True, exist_ok=True)
    (out / link).symlink_to(to)
    return arms, out


@pytest.mark.parametrize("link", ["logs", "logs/a.r1.log", "cache"])
def test_bench_run_writes_no_log_or_cache_through_a_link(capsys, monkeypatch, sandbox: Sandbox, link: str) -> None:
    """A server's log was appended to through a link (`logs/a.r1.log -> ~/.bashrc`), and its compile
    cache emptied through one (`cache -> ~/work`): now the arm fails, naming the link, and nothing
    outside --out changes."""
    elsewhere = sandbox.root / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a").mkdir()
    (elsewhere / "a" / "work.txt").write_text("mine\n")
    victim = elsewhere / "bashrc"
    victim.write_text("mine\n")
    arms, out = _bench_folder(sandbox, link, victim if link.endswith(".log") else elsewhere)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "bench", "run", arms, "--out", out, "--quiet")
    assert result.code == 1 and "arm 'a' failed" in result.err, result.err
    assert "link" in result.err or "symbolic links" in result.err, result.err
    _unchanged_but(sandbox, "out")
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["a", "bashrc", "work.txt"]


@pytest.mark.parametrize(
    ("text", "part"),
    [("a", "a"), ("x/y", "x~2Fy"), ("..", "~2E."), (".", "~2E"), ("", "~"), ("~", "~7E"), ("é", "~C3~A9")],
)
def test_file_part_is_one_plain_part(text: str, part: str) -> None:
    assert files.file_part(text) == part and files.name_problem(part) is None
    long = files.file_part("/" * 1000)
    assert len(long) <= 200 and files.name_problem(long) is None and long != files.file_part("/" * 999)


# --- a full disk is one line, and leaves nothing looking finished ---------------------------------------


def _full_disk_for(monkeypatch: pytest.MonkeyPatch, fails: Callable[[str], bool]) -> None:
    """`files.write_new` writes half of a file whose name `fails` picks, then raises ENOSPC, as a full disk would."""
    real = files.write_new

    def write_new(folder: Path, name: str, data: bytes) -> None:
        if not fails(name):
            return real(folder, name, data)
        real(folder, name, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / name))

    monkeypatch.setattr(files, "write_new", write_new)


def test_card_on_a_full_disk_is_one_line(capsys, monkeypatch, sandbox: Sandbox, pair) -> None:
    _, quant = copies(sandbox, pair)
    _full_disk_for(monkeypatch, lambda name: "README.md" in name)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    assert result.code == 2, result
    line = result.error_line
    assert str(quant / "README.md") in line and "disk is full" in line, line
    assert not (quant / "README.md").exists()  # no card that looks finished
    sandbox.assert_untouched("quant")  # the copies the card cites are whole files


def test_bench_report_on_a_full_disk_is_one_line(capsys, monkeypatch, sandbox: Sandbox) -> None:
    path = _results(sandbox.root / "run")
    assert run_inprocess(capsys, monkeypatch, "bench", "report", path).code == 0
    _full_disk_for(monkeypatch, lambda name: True)
    line = _refused(capsys, monkeypatch, sandbox, "bench", "report", path)
    # the results file is its input, never rewritten: the first file written is a plot
    assert str(path.parent / "ttft.png") in line and "disk is full" in line, line


# --- a refusal names a remedy the command has -----------------------------------------------------------


def test_transplant_and_calibrate_kv_name_a_remedy_they_have(capsys, monkeypatch, sandbox: Sandbox, pair) -> None:
    """An existing --out was refused with "use --force to replace it": transplant has no --force, and
    calibrate-kv's replaces KV-cache scales, never the --out folder."""
    orig, quant = copies(sandbox, pair)
    taken = sandbox.root / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    for args in (
        ("transplant", orig, quant, "--select", "re:.*norm.*", "--replace", "--out", taken),
        ("calibrate-kv", quant, "--out", taken),
    ):
        line = _refused(capsys, monkeypatch, sandbox, *args)
        assert str(taken) in line and "already exists (choose another --out)" in line, line
        assert "--force" not in line, line


# --- a run killed at any instant leaves only what the next run provably removes -------------------------


def _killed(script: str, *args: object) -> None:
    """Run `script` (Python, `sys.argv[1:]` = ARGS) in a process of its own that kills itself (`os._exit(9)`,
    as `kill -9` would: nothing cleans up) at the instant it chooses."""
    src = Path(files.__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == 9, proc.stderr.decode()


_KILL_WHILE_STAGING = """
import fcntl, os, sys
from pathlib import Path
from weightsmith.io import outputdir

def die(*args, **kwargs):
    os._exit(9)

point, real_open = sys.argv[2], os.open
if point == "lock-file":  # the folder exists, its lock file not yet
    os.open = lambda path, *a, **k: die() if str(path).endswith(outputdir.LOCK_FILE) else real_open(path, *a, **k)
elif point == "lock":  # the lock file exists, not yet locked
    fcntl.flock = die
elif point == "rename":  # locked, not yet under its own name
    os.rename = die
with outputdir.staged(Path(sys.argv[1]), force=False):
    die()  # at work: locked, under its own name
"""


@pytest.mark.parametrize("point", ["lock-file", "lock", "rename", "work"])
def test_a_run_killed_while_making_its_partial_folder_leaves_nothing_for_good(sandbox: Sandbox, point: str) -> None:
    """A run killed between creating `OUT.partial-<pid>` and locking it left a folder without a lock,
    which no later run could prove its own, so it stayed forever. The folder now appears under that
    name already locked; whatever instant the run dies at, the next run for OUT removes what it left."""
    from weightsmith.io.outputdir import remove_stale

    out = sandbox.root / "out"
    sandbox.freeze()
    _killed(_KILL_WHILE_STAGING, out, point)
    left = [p.name for p in sandbox.root.iterdir()]
    assert len(left) == 1 and ".partial-" in left[0], left  # the kill came after the folder was made
    said = remove_stale(out)
    assert len(said) == 1 and left[0] in said[0], said
    sandbox.assert_untouched()


def test_a_partial_folder_made_under_a_private_name_keeps_the_usual_mode(sandbox: Sandbox) -> None:
    """The folder becomes OUT: it has the mode `mkdir` gives (the umask's), not a private 0700."""
    from weightsmith.io.outputdir import staged

    with staged(sandbox.root / "out", force=False) as folder:
        (folder / "a.txt").write_text("a\n")
    (sandbox.root / "plain").mkdir()
    assert (sandbox.root / "out").stat().st_mode == (sandbox.root / "plain").stat().st_mode


_KILL_IN_GPTQ = """
import os, sys
from pathlib import Path
from types import SimpleNamespace
from weightsmith.engine import gptq
from weightsmith.quantization import gptq as flow
from weightsmith.quantization.request import GptqOptions

def die(root, tokens, targets, work, **kwargs):
    (work / "model.layers.0.mlp.down_proj.npy").write_bytes(b"codes")  # GPTQ's values, hours of them
    os._exit(9)

gptq.run = die
asked = SimpleNamespace(output=Path(sys.argv[1]), workers=1, request=SimpleNamespace(force=False, hash_sources=False))
plan = SimpleNamespace(decisions=[], source=SimpleNamespace(root=Path(sys.argv[2])), request=asked)
flow.quantize(plan, GptqOptions(), [], None)
"""


def test_a_killed_gptq_runs_scratch_folder_is_removed_by_the_next_run(sandbox: Sandbox) -> None:
    """GPTQ's values waited in a temporary `OUT.partial-gptq-*` folder without a lock: a killed run's
    stayed forever. It is now a scratch folder locked as a partial folder is, which the next run removes."""
    from weightsmith.io.outputdir import remove_stale

    src = tiny_source(sandbox, "src")
    out = sandbox.root / "out"
    sandbox.freeze()
    _killed(_KILL_IN_GPTQ, out, src)
    left = sorted(p.name for p in sandbox.root.iterdir() if p.name.startswith("out.partial-gptq-"))
    assert len(left) == 1, left
    said = remove_stale(out, keep=[src])
    assert len(said) == 1 and left[0] in said[0], said
    sandbox.assert_untouched()


def test_a_gptq_scratch_folder_is_locked_while_its_run_lives(monkeypatch, sandbox: Sandbox) -> None:
    """While GPTQ works, its scratch folder holds our taken lock under a name of this run, so another
    run for the same OUT leaves it alone; it is gone once the run ends, however it ends."""
    from types import SimpleNamespace

    from weightsmith.engine import gptq
    from weightsmith.io.outputdir import remove_stale
    from weightsmith.quantization import gptq as flow
    from weightsmith.quantization.request import GptqOptions

    out = sandbox.root / "out"
    seen: dict[str, object] = {}

    def stopped(root: Path, tokens: object, targets: object, work: Path, **kwargs: object) -> None:
        (work / "codes.npy").write_bytes(b"codes")
        seen["name"] = work.name
        seen["lock"] = (work / LOCK_FILE).is_file()
        seen["stale"] = remove_stale(out)  # what another run for OUT would do
        seen["kept"] = (work / "codes.npy").is_file()
        raise KeyboardInterrupt

    monkeypatch.setattr(gptq, "run", stopped)
    asked = SimpleNamespace(output=out, workers=1, request=SimpleNamespace(force=False, hash_sources=False))
    plan = SimpleNamespace(decisions=[], source=SimpleNamespace(root=sandbox.root / "src"), request=asked)
    sandbox.freeze()
    with pytest.raises(KeyboardInterrupt):
        flow.quantize(plan, GptqOptions(), [], None)
    assert seen == {"name": f"out.partial-gptq-{os.getpid()}", "lock": True, "stale": [], "kept": True}
    sandbox.assert_untouched()
