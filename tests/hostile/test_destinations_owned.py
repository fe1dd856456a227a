"""Destinations, the second look: "ours" is proved, never a file name or an empty marker.

`--force` replaces a folder only when its `weightsmith.json` is a manifest of ours and it holds
nothing that manifest does not account for; a temporary file is made under a fresh name and only
that file is ever removed; `bench` and `demo` replace only what they provably wrote.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hostile.harness import Sandbox, copies, run_inprocess, tiny_pair, tiny_source
from weightsmith.core import files
from weightsmith.io import provenance
from weightsmith.io.manifest import MANIFEST_FILE

QUANTIZE = ("--scheme", "w4a16", "--group-size", "32", "--workers", "1", "--no-hash")


def _refused(capsys, monkeypatch, sandbox: Sandbox, *args: object) -> str:
    """`weightsmith ARGS`: exit 2, one line, and nothing in the sandbox changed."""
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, *args)
    line = result.error_line
    assert result.code == 2, result
    sandbox.assert_untouched()
    return line


# --- 1a: --force replaces only a folder its manifest accounts for --------------------------------------


def test_force_refuses_a_folder_with_an_empty_manifest(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """`{}` in weightsmith.json beside a thesis and photos once let --force delete them all."""
    src = tiny_source(sandbox, "src")
    dl = sandbox.root / "dl"
    (dl / "photos").mkdir(parents=True)
    (dl / MANIFEST_FILE).write_text("{}\n")
    (dl / "thesis.tex").write_text("x\n")
    (dl / "photos" / "1.jpg").write_text("p\n")
    line = _refused(capsys, monkeypatch, sandbox, "quantize", src, dl, *QUANTIZE, "--force")
    assert str(dl) in line and MANIFEST_FILE in line, line


def test_force_refuses_our_output_holding_a_users_file(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A real output of ours is still refused once it holds a file (or folder) no run of ours wrote."""
    src = tiny_source(sandbox, "src")
    (src / "tokenizer.json").write_text("{}\n")
    out = sandbox.root / "out"
    assert run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE).code == 0
    (out / "photos").mkdir()
    (out / "photos" / "1.jpg").write_text("p\n")
    line = _refused(capsys, monkeypatch, sandbox, "quantize", src, out, *QUANTIZE, "--force")
    assert "'photos'" in line, line
    (out / "photos" / "1.jpg").unlink()
    (out / "photos").rmdir()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE, "--force")  # all ours again
    assert result.code == 0, result.err
    assert (out / "tokenizer.json").is_file()


# --- 1c, 4b, 4c: a temporary file has a fresh name; only it is ever removed ------------------------------


def test_replace_file_never_removes_a_file_named_like_its_temporary(sandbox: Sandbox) -> None:
    """`.NAME.partial-<pid>` of the user's was unlinked before and after every write."""
    target = sandbox.root / "report.md"
    mine = sandbox.root / f".report.md.partial-{os.getpid()}"
    mine.write_text("precious\n")
    folder = sandbox.root / f".results.json.partial-{os.getpid()}"
    folder.mkdir()  # a folder there once made the write fail after the whole run
    files.replace_file(target, b"new\n")
    files.replace_file(sandbox.root / "results.json", b"{}\n")
    assert mine.read_text() == "precious\n" and folder.is_dir()
    assert sorted(p.name for p in sandbox.root.iterdir()) == sorted(
        [mine.name, folder.name, "report.md", "results.json"]
    )


def test_replace_file_keeps_the_mode_of_the_file_it_replaces(sandbox: Sandbox) -> None:
    target = sandbox.root / "config.json"
    target.write_text("{}\n")
    target.chmod(0o600)
    files.replace_file(target, b'{"a": 1}\n')
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == '{"a": 1}\n'


def test_calibration_write_never_removes_a_file_named_like_its_temporary(sandbox: Sandbox) -> None:
    from weightsmith.calibration import stats_file

    out = sandbox.root / "s7.safetensors"
    mine = sandbox.root / f".s7.safetensors.partial-{os.getpid()}"
    mine.write_text("precious\n")
    stats = stats_file.CalibrationStats(
        provenance.Provenance("sha256:x", 64, 2, 32, "t", "ab" * 32, "original"),
        {"model.layers.0.self_attn": (1.0, 2.0)},
        {},
    )
    stats_file.write(out, stats)
    assert mine.read_text() == "precious\n"
    assert stats_file.read(out).kv == stats.kv
    assert sorted(p.name for p in sandbox.root.iterdir()) == sorted([mine.name, out.name])


def test_calibrate_refuses_a_name_too_long_before_its_run(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A 300-byte --out name failed with ENAMETOOLONG only after the whole calibration run."""
    from weightsmith.calibration import measure as calibrate

    def too_late(*args: object, **kwargs: object) -> None:
        raise AssertionError("the calibration run started before the name was checked")

    monkeypatch.setattr(calibrate, "calibration_tokens", too_late)
    src = tiny_source(sandbox, "src")
    out = sandbox.root / ("p" * 300)
    line = _refused(capsys, monkeypatch, sandbox, "calibrate", src, "--out", out, "--tokens", "64", "--seq-len", "32")
    assert "longer than 255 bytes" in line, line


# --- 1b, 4a: demo replaces only the draft it wrote, never through a link --------------------------------


def test_demo_refuses_a_users_folder_behind_an_empty_marker(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """An empty `.weightsmith-demo` once let `demo --dir` delete the user's draft-bf16/notes.txt."""
    d2 = sandbox.root / "d2"
    (d2 / "draft-bf16").mkdir(parents=True)
    (d2 / ".weightsmith-demo").touch()
    (d2 / "draft-bf16" / "notes.txt").write_text("mywork\n")
    line = _refused(capsys, monkeypatch, sandbox, "demo", "--dir", d2, "--workers", "1")
    assert str(d2 / "draft-bf16") in line, line


def test_demo_refuses_a_draft_folder_that_is_a_link(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A link as draft-bf16 was a 42-line traceback (rmtree on a link)."""
    d1, elsewhere = sandbox.root / "d1", sandbox.root / "elsewhere"
    d1.mkdir()
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}\n")
    (d1 / ".weightsmith-demo").touch()
    (d1 / "draft-bf16").symlink_to(elsewhere)
    line = _refused(capsys, monkeypatch, sandbox, "demo", "--dir", d1, "--workers", "1")
    assert str(d1 / "draft-bf16") in line, line


# --- 1e: bench report never rewrites its input, and writes only where bench may ---------------------------


def _results(folder: Path, name: str = "results.json") -> Path:
    """A results file as `bench run` writes it, one visit per arm, with a decode rate (so plots are drawn)."""
    from weightsmith.bench.config import parse_config
    from weightsmith.bench.report import write_results_file
    from weightsmith.bench.results import PromptInfo, RequestRecord, VisitResult
    from weightsmith.bench.runner import new_results

    config = parse_config({"repeats": 1, "arms": [{"name": a, "url": f"http://h:{i + 1}"} for i, a in enumerate("ab")]})
    results = new_results(config)
    results.prompts.append(PromptInfo("p80.0", 80, 0, "synthetic", 400))
    for position, arm in enumerate("ab"):
        record = RequestRecord("p80.0", 80, 0, ttft_s=0.1, decode_tok_s=50.0, e2e_s=0.5, completion_tokens=16)
        results.visits.append(VisitResult(arm=arm, repeat=0, position=position, requests=[record]))
    path = write_results_file(results, None, folder)
    return path.rename(folder / name)


def test_bench_report_refuses_a_folder_holding_another_runs_results(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """`bench report d2/quality-run.json` replaced d2/results.json, another run's, with its own data."""
    d2 = sandbox.root / "d2"
    _results(d2)
    path = _results(d2, "quality-run.json")
    _results(d2)
    line = _refused(capsys, monkeypatch, sandbox, "bench", "report", path)
    assert str(d2) in line and "results.json" in line, line


def test_bench_report_replaces_no_users_report_or_plot(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A downloaded results.json beside the user's report.md and ttft.png: both were replaced."""
    that = sandbox.root / "that"
    path = _results(that)
    (that / "report.md").write_text("my notes\n")
    (that / "ttft.png").write_bytes(b"mine")
    line = _refused(capsys, monkeypatch, sandbox, "bench", "report", path)
    assert str(that) in line and "report.md" in line, line
    (that / "report.md").unlink()  # a plot of the user's alone is not replaced either
    line = _refused(capsys, monkeypatch, sandbox, "bench", "report", path)
    assert str(that) in line and "'ttft.png'" in line, line


def test_bench_report_never_rewrites_its_input_and_says_where_it_wrote(capsys, monkeypatch, sandbox: Sandbox) -> None:
    run = sandbox.root / "run"
    path = _results(run)
    before = path.read_bytes()
    for _ in range(2):  # beside the file, then again into the folder it has become bench's
        result = run_inprocess(capsys, monkeypatch, "bench", "report", path)
        assert result.code == 0, result.err
        assert path.read_bytes() == before
        assert f"wrote {run / 'report.md'}" in result.out and str(run) in result.out, result.out


# --- 1f: bench's marker is a record; a file it does not name is never replaced or emptied ------------------


def _arms(sandbox: Sandbox) -> Path:
    arms = sandbox.root / "arms.toml"
    arms.write_text('repeats = 1\nwarmups = 0\n[workload]\nprompt_tokens = [80]\nprompts_per_length = 1\n'
                    'max_tokens = 4\n[determinism]\nreplicates = 0\n[[arms]]\nname = "a"\nkind = "vllm"\n'
                    'command = "false --port {port}"\nstartup_timeout_s = 5\n')  # fmt: skip
    return arms


def test_bench_run_refuses_a_folder_behind_an_empty_marker(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """An empty `.weightsmith-bench` once let `bench run` empty cache/a/ and replace the user's report.md."""
    from weightsmith.bench.outdir import MARKER

    out = sandbox.root / "out"
    (out / "cache" / "a").mkdir(parents=True)
    (out / MARKER).touch()
    (out / "cache" / "a" / "keep.txt").write_text("keep\n")
    (out / "report.md").write_text("mine\n")
    line = _refused(capsys, monkeypatch, sandbox, "bench", "run", _arms(sandbox), "--out", out, "-q")
    assert str(out) in line and "bench did not write" in line, line


def test_bench_run_leaves_alone_what_its_record_does_not_name(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """In a folder bench claimed, a cache folder or report it never wrote is neither emptied nor replaced."""
    from weightsmith.bench.outdir import claim

    out = sandbox.root / "out"
    claim(out)
    (out / "report.md").write_text("mine\n")
    line = _refused(capsys, monkeypatch, sandbox, "bench", "run", _arms(sandbox), "--out", out, "-q")
    assert str(out / "report.md") in line and "not written by bench" in line, line
    (out / "report.md").unlink()
    (out / "cache" / "a").mkdir(parents=True)
    (out / "cache" / "a" / "keep.txt").write_text("keep\n")
    result = run_inprocess(capsys, monkeypatch, "bench", "run", _arms(sandbox), "--out", out, "-q")
    said = " ".join(result.err.split())  # the console wraps its lines
    assert result.code == 1 and "cache/a was not written by bench; not used as a compile cache" in said, said
    assert (out / "cache" / "a" / "keep.txt").read_text() == "keep\n"


# --- 1d: card replaces only the files it provably wrote -----------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.mark.parametrize("name", ["verify.json", "inspect.json"])
def test_card_refuses_to_replace_a_users_file_without_force(capsys, monkeypatch, sandbox: Sandbox, pair, name) -> None:
    """`card out` overwrote the user's verify.json and inspect.json, --force or not."""
    _, quant = copies(sandbox, pair)
    assert run_inprocess(capsys, monkeypatch, "card", quant).code == 0
    assert run_inprocess(capsys, monkeypatch, "card", quant).code == 0  # its own files are replaced
    (quant / name).write_text("my notes\n")
    line = _refused(capsys, monkeypatch, sandbox, "card", quant)
    assert str(quant / name) in line and "--force" in line, line
    assert run_inprocess(capsys, monkeypatch, "card", quant, "--force").code == 0
    assert (quant / name).read_text() != "my notes\n"


# --- 1g: a file rewritten in place keeps its mode ------------------------------------------------------------


def test_transplant_in_place_keeps_the_mode_of_the_files_it_rewrites(
    capsys, monkeypatch, sandbox: Sandbox, pair
) -> None:
    """An in-place transplant made a private (600) config.json world-readable (644)."""
    orig, quant = copies(sandbox, pair)
    for path in quant.iterdir():
        path.chmod(0o600)
    before = {p.name: p.stat().st_ino for p in quant.iterdir()}
    args = ("transplant", orig, quant, "--select", "re:.*norm.*", "--replace")
    result = run_inprocess(capsys, monkeypatch, *args)
    assert result.code == 0, result.err
    rewritten = [p.name for p in quant.iterdir() if p.name in before and p.stat().st_ino != before[p.name]]
    assert rewritten, "nothing was rewritten in place"
    assert {name: stat.S_IMODE((quant / name).stat().st_mode) for name in rewritten} == dict.fromkeys(rewritten, 0o600)
