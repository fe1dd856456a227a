"""`weightsmith calibrate` over several processes: the same file as one process, under `--processes` and
torchrun; a rank that dies or hangs ends the run with one line and no file.

Every child a test starts gets SIGINT's default disposition explicitly: a test run in the background
inherits SIGINT ignored, and a child would keep it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from clirun import one_error_line, run, sigint_default
from engine.ranks import free_port, rank_pid
from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.distributed import MAX_NDIM, PEER_LOST, Message, World, joined

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


#: A program that is not weightsmith on a run's port, as rank 1: it joins, then answers the comparison of
#: jobs (`World.agree`) with a length (argv[1]) and bytes (argv[2]) of its own.
STRANGER = """
import sys
from datetime import timedelta
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", rank=1, world_size=2, timeout=timedelta(seconds=20))
data = sys.argv[2].encode()
lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
dist.all_gather(lengths, torch.tensor([int(sys.argv[1])], dtype=torch.int64))
width = max(int(length.item()) for length in lengths)
if width <= 1 << 20:
    mine = torch.zeros(width, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.all_gather([torch.zeros(width, dtype=torch.uint8) for _ in range(2)], mine)
"""
#: Rank 0 of a calibrate job on SRC (argv[1]) into OUT (argv[2]), comparing jobs as it joins.
LEAD = """
import sys
from pathlib import Path
from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.distributed import Job, joined
try:
    with joined(20, job=Job("calibrate", Path(sys.argv[1]), Path(sys.argv[2]))):
        pass
except WeightsmithError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


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


@pytest.mark.parametrize(
    ("length", "data", "expected"),
    [
        ("5000000000", "", "it described it in 5,000,000,000 bytes, not 1 to 1,048,576; nothing was written"),
        ("2", "[]", "it does not describe it as weightsmith does; nothing was written"),
    ],
    ids=["huge", "not-a-job"],
)
def test_a_stranger_on_the_port_is_refused_by_its_description(
    tiny_llama: Path, tmp_path: Path, length: str, data: str, expected: str
) -> None:
    """Whatever joins as rank 1 and answers the comparison of jobs with bytes of its own (any length, not
    JSON, not a job) is refused in one line naming it, before rank 0 makes a buffer of that length."""
    code, _, err, _, _ = _two_ranks(LEAD, [str(tiny_llama), str(tmp_path / "s.safetensors")], STRANGER, [length, data])
    assert code == 2
    assert err == f"rank 1 of 2 is running another job: {expected}\n"
    assert list(tmp_path.iterdir()) == []


#: Rank 0 of a world without a job, which max-reduces one value (its names gathered as JSON).
REDUCING = """
import sys
from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.distributed import joined
try:
    with joined(20) as world:
        world.max_reduce({"x model.layers.0.mlp.down_proj": 1.0})
except WeightsmithError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""
#: Either rank of a world that broadcasts an array from rank 1 and a structure from rank 0, printing
#: what arrived; with argv[1] other than `honest`, rank 1 sends a header of its own (argv[1:], int64s)
#: instead of its array.
ARRAYS = """
import json, sys
import numpy as np, torch
from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.distributed import MAX_NDIM, Message, joined
CLIP = Message("sharing clip factors", "sent the clip factors")
try:
    with joined(20) as world:
        if world.rank == 1 and sys.argv[1] != "honest":
            header = [int(n) for n in sys.argv[1:]]
            world.broadcast(torch.tensor(header + [0] * (2 + MAX_NDIM - len(header)), dtype=torch.int64), 1)
        else:
            mine = np.arange(32, dtype=np.float32).reshape(4, 8) / 3 if world.rank == 1 else None
            got = world.broadcast_array(mine, 1, CLIP, "float32", 32)
            told = world.broadcast_json({"groups": [["q", "k"], 64]} if world.rank == 0 else None, 0, CLIP)
            print(json.dumps([got.dtype.name, list(got.shape), got.tobytes().hex(), told]), flush=True)
except WeightsmithError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def _two_ranks(lead: str, lead_args: list[str], peer: str, peer_args: list[str]) -> tuple[int, str, str, int, str]:
    """Rank 0 running `lead` and rank 1 running `peer` on a fresh port: rank 0's exit status, stdout
    and stderr, rank 1's exit status and stdout (rank 1 is killed once rank 0 ends)."""
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    children = []
    for rank, (script, args) in enumerate([(lead, lead_args), (peer, peer_args)]):
        children.append(subprocess.Popen(
            [sys.executable, "-c", script, *args], env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True, preexec_fn=sigint_default,
        ))  # fmt: skip
    try:
        out, err = children[0].communicate(timeout=120)
        peer_out = children[1].communicate(timeout=30)[0]
    finally:
        for child in children:
            child.kill()
            child.wait()
    return children[0].returncode, out, err, children[1].returncode, peer_out


def test_names_that_are_not_a_list_of_names_are_one_line() -> None:
    """The names of the maxima travel as JSON (gathered as the jobs are, whose lengths and bytes the
    stranger tests above cover): what is not a JSON list of strings is refused, naming the rank."""
    code, _, err, _, _ = _two_ranks(REDUCING, [], STRANGER, ["8", '["a", 3]'])
    assert (code, err) == (2, "rank 1 of 2 sent the names of its maxima as something other than a JSON list of names\n")


def test_an_array_arrives_as_its_bytes_and_a_structure_as_json() -> None:
    """`broadcast_array` gives the receiver the sender's float32 values bit for bit, in its shape;
    `broadcast_json` gives every rank the same JSON data (lists, as JSON has)."""
    code, out, err, peer_code, peer_out = _two_ranks(ARRAYS, ["honest"], ARRAYS, ["honest"])
    sent = (np.arange(32, dtype=np.float32).reshape(4, 8) / 3).tobytes().hex()
    assert (code, peer_code) == (0, 0), err
    assert [json.loads(o) for o in (out, peer_out)] == [["float32", [4, 8], sent, {"groups": [["q", "k"], 64]}]] * 2


ARRAY_EXPECTED = "not float32 of at most 32 values in at most 4 dimensions"


def test_an_array_header_out_of_bounds_is_one_line() -> None:
    """An array's header is checked on the receiving rank before anything of its size is made: a
    shape of 2**80 values is one line naming the sender (the other bounds: the test below)."""
    code, _, err, _, _ = _two_ranks(ARRAYS, ["honest"], ARRAYS, ["0", "2", str(1 << 40), str(1 << 40)])
    shown = "float32 of shape [1099511627776, 1099511627776]"
    assert (code, err) == (2, f"rank 1 of 2 sent the clip factors as {shown}, {ARRAY_EXPECTED}\n")


@pytest.mark.parametrize(
    ("header", "shown"),
    [
        ([1, 2, 4, 8], "float64 of shape [4, 8]"),
        ([0, 2, -4, -8], "float32 of shape [-4, -8]"),
        ([0, 9, 4, 8], "float32 of 9 dimensions"),
        ([7, 1, 32], "dtype code 7 of shape [32]"),
        ([0, 1, 4, 8], "float32 of shape [4]"),  # a dimension past those it declares
    ],
    ids=["float64", "negative", "dimensions", "dtype", "stray-dimension"],
)
def test_every_bound_of_an_array_header_is_checked(header: list[int], shown: str) -> None:
    """Another dtype, a negative size, too many dimensions, an unknown dtype code or a size beyond the
    declared dimensions is refused by the check each receiving rank runs on the header."""
    padded = header + [0] * (2 + MAX_NDIM - len(header))
    clip = Message("sharing clip factors", "sent the clip factors")
    with pytest.raises(WeightsmithError) as refused:
        World(rank=0, size=2)._checked_shape(1, padded, clip, "float32", 32)
    assert str(refused.value) == f"rank 1 of 2 sent the clip factors as {shown}, {ARRAY_EXPECTED}"


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
