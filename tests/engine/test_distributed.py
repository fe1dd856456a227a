"""`weightsmith calibrate` over several processes: the same file as one process, under `--processes` and
torchrun; a rank that dies or hangs ends the run with one line and no file.

Every child a test starts gets SIGINT's default disposition explicitly: a test run in the background
inherits SIGINT ignored, and a child would keep it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clirun import one_error_line, run, sigint_default
from engine.ranks import rank_pid
from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.distributed import PEER_LOST, World, joined

#: Tokens and sequence length of the runs compared: 10 sequences, shared 5/5 and 3/3/4.
ARGS = ("--tokens", "640", "--seq-len", "64")
TORCHRUN = Path(sys.executable).parent / "torchrun"

#: One rank of a two-rank world: a max-reduce of names partly its own, then rank 1 ends or hangs.
RANK = """
import json, os, sys, time
from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.distributed import joined
try:
    with joined(float(sys.argv[2])) as world:
        got = world.max_reduce({"shared": float(world.rank), f"only{world.rank}": 0.5 + world.rank})
        print(json.dumps(got), flush=True)
        if world.rank == 1 and sys.argv[1] == "dies":
            os._exit(3)
        if world.rank == 1 and sys.argv[1] == "hangs":
            time.sleep(120)
        world.barrier()
except WeightsmithError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_shares_partition_the_items_evenly() -> None:
    for count in range(12):
        for size in range(1, 5):
            shares = [World(rank, size).share(count) for rank in range(size)]
            assert [i for share in shares for i in share] == list(range(count))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_world_comes_from_torchrun_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with joined(5) as world:
        assert (world.rank, world.size, world.leader, world.max_reduce({"b": 1.0, "a": 2.0})) == (
            0,
            1,
            True,
            {"a": 2.0, "b": 1.0},
        )
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(WeightsmithError, match=r"^RANK=2 is not a rank of WORLD_SIZE=2$"), joined(5):
        pass
    monkeypatch.setenv("RANK", "1")
    unset = r"MASTER_ADDR, MASTER_PORT not set: start the ranks with torchrun"
    with pytest.raises(WeightsmithError, match=unset), joined(5):
        pass


@pytest.mark.parametrize("mode", ["dies", "hangs"])
def test_a_lost_peer_is_one_line_naming_this_rank_and_the_collective(mode: str) -> None:
    port = str(free_port())
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, mode, "3"],
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=sigint_default,
        )
        for rank in range(2)
    ]
    try:
        started = time.monotonic()
        out, err = children[0].communicate(timeout=120)
        waited = time.monotonic() - started
    finally:
        children[1].kill()
        children[1].communicate()
    assert json.loads(out) == {"only0": 0.5, "only1": 1.5, "shared": 1.0}  # every name, each one's maximum
    assert children[0].returncode == 2
    assert err.count("\n") == 1 and err.startswith(f"rank 0 of 2: barrier failed: {PEER_LOST} within 3 s ("), err
    if mode == "hangs":
        assert "Timed out" in err and waited < 60


def calibrate_bytes(capsys, monkeypatch, tiny: Path, out: Path, *extra: str) -> bytes:
    code, _, err = run(capsys, monkeypatch, "calibrate", tiny, "--out", out, *ARGS, *extra)
    assert code == 0, err
    assert f"{out}: 2 attention modules, 14 Linear inputs; 640 tokens" in err
    return out.read_bytes()


def test_world_sizes_one_two_three_write_the_same_bytes(tiny_llama: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = calibrate_bytes(capsys, monkeypatch, tiny_llama, tmp_path / "1.safetensors")
    for size in (2, 3):
        out = tmp_path / f"{size}.safetensors"
        assert calibrate_bytes(capsys, monkeypatch, tiny_llama, out, "--processes", str(size)) == one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.safetensors", "2.safetensors", "3.safetensors"]


def test_torchrun_with_more_ranks_than_sequences(tiny_llama: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """`torchrun -m weightsmith` as is; 2 sequences over 3 ranks leaves rank 2 none to run."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    few = ("--tokens", "128", "--seq-len", "64")
    code, _, err = run(capsys, monkeypatch, "calibrate", tiny_llama, "--out", tmp_path / "one.safetensors", *few)
    assert code == 0, err
    out = tmp_path / "torchrun.safetensors"
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "3", "-m", "weightsmith", "calibrate"]
    done = subprocess.run(
        [*command, str(tiny_llama), "--out", str(out), *few],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=sigint_default,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (tmp_path / "one.safetensors").read_bytes()


def test_a_killed_rank_ends_the_run_with_one_line_and_no_file(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "weightsmith", "calibrate", str(tiny_llama), "--out", str(out / "s.safetensors")]
    launcher = subprocess.Popen(
        [*command, "--tokens", "4096", "--seq-len", "32", "--processes", "2"],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )
    try:
        rank = rank_pid(launcher.pid, 1)
        os.kill(rank, signal.SIGKILL)  # before it has sent its maxima: rank 0 cannot have written
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 2
    assert one_error_line(err) == "error: rank 1 of 2 was killed by SIGKILL; the other ranks were stopped"
    assert list(out.iterdir()) == []  # no statistics file, no temporary one


def test_a_rank_error_is_relayed_as_one_line(tiny_llama: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    missing = tmp_path / "absent"
    code, _, err = run(capsys, monkeypatch, "calibrate", missing, "--out", tmp_path / "s.safetensors", "--processes", 2)
    assert code == 2
    assert one_error_line(err).startswith(f"error: rank 0 of 2: {missing}")
    assert list(tmp_path.iterdir()) == []
