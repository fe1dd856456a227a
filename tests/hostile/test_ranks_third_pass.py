"""Hostile ranks (`--processes`, torchrun, ranks started by hand): issue 45, items 4 to 6.

- A rank of another run that joins on the same port is refused by every rank, in one line naming
  what differs, and neither run writes anything.
- A launcher killed with SIGKILL leaves no log folder in the temporary directory.
- `WORLD_SIZE=1` under `--processes 4` is refused, a rank stopped by SIGSTOP is the one named, and a
  malformed or unresolvable MASTER_ADDR (or MASTER_PORT) is one line before torch sees it.

Every child gets a time limit (and the ranks a short `--peer-timeout`), so a hang fails the case
instead of stalling the suite.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clirun import sigint_default
from engine.ranks import free_port, rank_pid
from hostile.harness import Result, Sandbox, run_inprocess
from synth import llama_tensors, write_checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")

#: GPTQ on a few hundred tokens of the tiny model: a second or two per run once torch is imported.
GPTQ = ("--method", "gptq", "--group-size", "32", "--builtin", "code", "--tokens", "512", "--seq-len", "128")
#: Calibration long enough (128 sequences) that a rank is still running when the test acts on it.
CALIBRATE = ("--tokens", "4096", "--seq-len", "32")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny Llamas (different weights) with SmolLM2's tokenizer, each copied into a case's sandbox."""
    from fidelity.eval_checkpoints import TINY_LM_CONFIG, TOKENIZER_FILES
    from models import smollm2_fp32

    folder = tmp_path_factory.mktemp("ranks")
    for name, seed in (("base", 5), ("other", 6)):
        written = write_checkpoint(folder / name, llama_tensors(TINY_LM_CONFIG, seed=seed), TINY_LM_CONFIG)
        for file in TOKENIZER_FILES:
            shutil.copy(smollm2_fp32() / file, written / file)
    return folder


def _sources(sandbox: Sandbox, models: Path) -> tuple[Path, Path]:
    for name in ("base", "other"):
        shutil.copytree(models / name, sandbox.root / name)
    return sandbox.root / "base", sandbox.root / "other"


def _rank_env(rank: int, port: int | str, **more: str) -> dict[str, str]:
    """This environment as torchrun would set it for rank `rank` of 2 on this machine."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    return {**env, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "COLUMNS": "200", "NO_COLOR": "1", **more}  # fmt: skip


def _start(args: list[object], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "weightsmith", *map(str, args)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> Result:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return Result(proc.returncode, out, err)


def _gone(pids: list[int], timeout: float = 30) -> None:
    """Wait until none of `pids` runs (a killed launcher's ranks get SIGKILL from the kernel)."""
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        time.sleep(0.05)


# ---- 4: a rank of another run joins on the same port ------------------------------------------------


@pytest.mark.parametrize("differs", ["source", "output", "option", "command"])
def test_a_rank_of_another_run_is_refused_by_both_runs(sandbox: Sandbox, models: Path, differs: str) -> None:
    """Two runs given one MASTER_PORT: rank 0 of one, rank 1 of the other. Both end with the same line
    naming rank 1 and what differs; neither writes its output (before, both exited 0 and the first's
    Hessians held the second model's activations)."""
    base, other = _sources(sandbox, models)
    first, second = sandbox.root / "pa", sandbox.root / "pb"
    lead = ["quantize", base, first, *GPTQ]
    joining = {
        "source": ["quantize", other, first, *GPTQ],
        "output": ["quantize", base, second, *GPTQ],
        "option": ["quantize", base, first, *GPTQ, "--dampening", "0.05"],
        "command": ["calibrate", base, "--out", second / "s.safetensors"],
    }[differs]
    expected = {
        "source": f"source {other}, not rank 0's {base}",
        "output": f"output {second}, not rank 0's {first}",
        "option": "--dampening 0.05, not rank 0's 0.1",
        "command": "calibrate, not rank 0's quantize",
    }[differs]
    sandbox.freeze()
    port = free_port()
    ranks = [_start([*lead, "--peer-timeout", "20"], _rank_env(0, port)),
             _start([*joining, "--peer-timeout", "20"], _rank_env(1, port))]  # fmt: skip
    results = [_finish(rank) for rank in ranks]
    for result in results:
        assert result.code == 2, result.err
        assert result.error_line == f"error: rank 1 of 2 is running another job: {expected}; nothing was written"
    assert not first.exists() and not second.exists()
    sandbox.assert_untouched()


# ---- 5: a killed launcher's logs -----------------------------------------------------------------------


def test_a_killed_launcher_leaves_no_log_folder(sandbox: Sandbox, models: Path) -> None:
    """SIGKILL to the `--processes` launcher: its ranks die with it and its temporary directory holds
    nothing of it afterwards (before, `weightsmith-ranks-XXXX` stayed there for good)."""
    base, _ = _sources(sandbox, models)
    temp = sandbox.root / "tmp"
    temp.mkdir()
    sandbox.freeze()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")} | {"TMPDIR": str(temp)}
    launcher = _start(["calibrate", base, "--out", sandbox.root / "s.safetensors", *CALIBRATE, "--processes", "2"], env)
    try:
        ranks = [rank_pid(launcher.pid, rank) for rank in (0, 1)]
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(30)
        _gone(ranks)
    finally:
        _finish(launcher)
    assert sorted(os.listdir(temp)) == []
    sandbox.assert_untouched()


# ---- 6: three wrong or noisy reports ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["calibrate", "quantize"])
def test_world_size_one_in_the_environment_under_processes_is_refused(
    sandbox: Sandbox, models: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """An inherited WORLD_SIZE=1 and `--processes 4` contradict each other: one line, nothing run (before,
    the run went ahead as one process without a word)."""
    base, _ = _sources(sandbox, models)
    out = sandbox.root / "out"
    sandbox.freeze()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    args = ["calibrate", base, "--out", out, *CALIBRATE] if command == "calibrate" else ["quantize", base, out, *GPTQ]
    result = run_inprocess(capsys, monkeypatch, *args, "--processes", "4")
    assert result.code == 2, result.err
    assert result.error_line == (
        "error: --processes 4 asks for 4 ranks, but WORLD_SIZE=1 in the environment makes this process the only"
        " rank of its run (rank 0 of 1): unset WORLD_SIZE to start 4 ranks, or leave --processes out"
    )
    assert not out.exists()
    sandbox.assert_untouched()


def test_a_stopped_rank_is_the_one_named(sandbox: Sandbox, models: Path) -> None:
    """SIGSTOP on rank 1: rank 0 times out waiting for it, and the line names rank 1 and why (before, it
    named rank 0, the one that gave up waiting); the stopped rank does not outlive the launcher."""
    base, _ = _sources(sandbox, models)
    out = sandbox.root / "s.safetensors"
    sandbox.freeze()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    launcher = _start(["calibrate", base, "--out", out, *CALIBRATE, "--processes", "2", "--peer-timeout", "3"], env)
    try:
        stopped = rank_pid(launcher.pid, 1)
        os.kill(stopped, signal.SIGSTOP)
        result = _finish(launcher)
    finally:
        launcher.kill()
    assert result.code == 2
    assert result.error_line == (
        "error: rank 1 of 2 was suspended by SIGSTOP and did not answer; the other ranks were stopped"
    )
    _gone([stopped], timeout=5)
    assert not out.exists()
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("MASTER_ADDR", "node0\x1b[31m\r\n", "MASTER_ADDR 'node0\\x1b[31m\\r\\n' is not a host name or address"),
        ("MASTER_ADDR", "node0.invalid", "MASTER_ADDR 'node0.invalid' does not resolve"),
        ("MASTER_PORT", "2x", "MASTER_PORT '2x' is not a port"),
        ("MASTER_PORT", "70000", "MASTER_PORT '70000' is not a port"),
        ("MASTER_PORT", "0", "MASTER_PORT '0' is not a port"),
    ],
    ids=["escapes", "unresolvable", "port-letters", "port-range", "port-zero"],
)
def test_a_bad_master_address_is_one_line_before_torch(
    sandbox: Sandbox, models: Path, name: str, value: str, shown: str
) -> None:
    """Escape sequences in MASTER_ADDR gave 47 lines of torch's warnings with the raw escapes before the
    error; an unresolvable name the same; a bad port a line blaming the other ranks. Now one line naming
    the variable, this rank, and the value with its escapes written out, at once."""
    base, _ = _sources(sandbox, models)
    out = sandbox.root / "s.safetensors"
    sandbox.freeze()
    started = time.monotonic()
    args = ["calibrate", base, "--out", out, "--peer-timeout", "60"]
    result = _finish(_start(args, _rank_env(0, 29500, **{name: value})))
    assert result.code == 2
    line = result.error_line
    assert line.startswith(f"error: rank 0 of 2: {shown}"), line
    assert "\x1b" not in result.err
    assert time.monotonic() - started < 30  # not after the peer timeout (a slow resolver aside)
    assert not out.exists()
    sandbox.assert_untouched()


# ---- 7: a peer that sends a pickle -----------------------------------------------------------------------

#: Rank 1 of weightsmith's own command (argv[2:]), so it passes the comparison of jobs, except that at one
#: exchange (argv[1]: `names`, calibrate's maxima; `outcome`, a GPTQ group it solved) it sends what
#: torch's object collectives send: a pickle, here one that creates the file MARKER when loaded. Then it
#: waits to be killed.
PICKLING_PEER = """
import os, pathlib, runpy, sys, time
import torch.distributed as dist
from weightsmith.engine import distributed, gptq

class Payload:
    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(os.environ["MARKER"]),))

def pickled_names(world, values):
    dist.all_gather_object([None] * world.size, Payload())
    time.sleep(600)

share = gptq._share
def pickled_outcome(solved, groups, owners, *rest):
    world = next(arg for arg in rest if isinstance(arg, distributed.World))
    for group in groups:
        if owners[group[0][0]] == world.rank:
            dist.broadcast_object_list([Payload()], src=world.rank)
            time.sleep(600)
        share(solved, [group], owners, *rest)

if sys.argv[1] == "names":
    distributed.World.max_reduce = pickled_names
else:
    gptq._share = pickled_outcome
sys.argv = ["weightsmith", *sys.argv[2:]]
runpy.run_module("weightsmith", run_name="__main__")
"""


@pytest.mark.parametrize("exchange", ["names", "outcome"])
def test_a_pickle_from_a_peer_is_never_loaded(sandbox: Sandbox, models: Path, exchange: str) -> None:
    """A peer running the same job sends, at one exchange, a pickle that would create a file when
    loaded. Rank 0 never loads it: the file is never created, and rank 0 ends with one line naming
    rank 1 and what it sent, writing nothing (before, rank 0 unpickled it, so the peer's code ran
    there: the file was created, then a traceback)."""
    base, _ = _sources(sandbox, models)
    marker = sandbox.root / "unpickled"
    args: list[object] = {
        "names": ["calibrate", base, "--out", sandbox.root / "s.safetensors", *CALIBRATE],
        "outcome": ["quantize", base, sandbox.root / "out", *GPTQ],
    }[exchange]
    args += ["--peer-timeout", "20"]
    sandbox.freeze()
    port = free_port()
    lead = _start(args, _rank_env(0, port))
    peer = subprocess.Popen(
        [sys.executable, "-c", PICKLING_PEER, exchange, *map(str, args)], env=_rank_env(1, port, MARKER=str(marker)),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=sigint_default,
    )  # fmt: skip
    try:
        result = _finish(lead)
    finally:
        peer.kill()
        peer.wait()
    assert not marker.exists(), "rank 0 loaded the peer's pickle"
    assert result.code == 2, result.err
    sent, form = {
        "names": ("the names of its maxima", "a JSON list of names"),
        "outcome": ("the outcome of model.layers.0.", "a JSON outcome of GPTQ"),  # the first module rank 1 solved
    }[exchange]
    line = result.error_line
    assert line.startswith(f"error: rank 1 of 2 sent {sent}"), line
    assert line.endswith(f" as something other than {form}"), line
    assert not (sandbox.root / "s.safetensors").exists() and not (sandbox.root / "out").exists()
    sandbox.assert_untouched()
