"""Data-parallel runs over processes and nodes, on torch.distributed's gloo backend (CPU, over TCP).

A run is a `World` of `size` ranks, each a process that runs its `share` of the items (calibration
sequences) and meets the others only in collectives: `max_reduce`, `barrier`. Every rank learns its
place from the environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), whether torchrun
started it on one node or many, or `launch.ranks` on this machine; without those variables the world
is one process and no collective touches torch.distributed at all.

A rank that dies or hangs must not leave the others waiting for ever nor print a traceback each: every
collective waits at most `World.timeout` seconds, and its failure (gloo raises RuntimeError subclasses
for a closed connection and for a timeout) becomes one `PeerLost` line that names this rank and the
collective. Which peer failed gloo does not say; the launcher, which sees its children end, does
(`launch`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from weightsmith.core import cores
from weightsmith.core.errors import WeightsmithError

#: Seconds a rank waits for the others to join and at each collective: long enough for the slowest
#: rank of a real run to finish its share (ranks meet only at the end of a measurement), short enough
#: that a hung peer ends the run the same day.
DEFAULT_TIMEOUT = 1800.0
#: What every `PeerLost` line says; the launcher tells a consequence of another rank's end by it.
PEER_LOST = "another rank ended or did not answer"
#: The variables torchrun sets that make a process one rank of a world.
ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class PeerLost(WeightsmithError):
    """A collective failed: another rank ended, or did not answer within the timeout."""

    code = "distributed.peer"


@dataclass(frozen=True)
class World:
    """This process's place in a run: rank `rank` of `size`; rank 0 is the one that writes results."""

    rank: int = 0
    size: int = 1
    #: Seconds a collective waits for the other ranks before the run ends with `PeerLost`.
    timeout: float = DEFAULT_TIMEOUT

    @property
    def leader(self) -> bool:
        """Whether this rank writes the results (rank 0)."""
        return self.rank == 0

    def share(self, count: int) -> range:
        """The indices of `count` items this rank runs: a contiguous block, sizes differing by at most one.

        A function of (count, rank, size) alone, so every rank knows every rank's share without asking;
        with more ranks than items some shares are empty.
        """
        return range(count * self.rank // self.size, count * (self.rank + 1) // self.size)

    def max_reduce(self, values: Mapping[str, float]) -> dict[str, float]:
        """Every name any rank holds, with the largest value any rank holds for it; the same on every rank.

        Ranks may hold different names (an MoE expert no token of a rank's share was routed to), so the
        names are gathered first and the values reduced in sorted name order. Values travel as float64:
        a Python float arrives unchanged, and max is exact, so the result does not depend on how the
        items were shared.
        """
        if self.size == 1:
            return {name: values[name] for name in sorted(values)}
        import torch
        import torch.distributed as dist

        held: list[list[str] | None] = [None] * self.size
        with self._collective("gathering names"):
            dist.all_gather_object(held, sorted(values))
        names = sorted({name for part in held for name in part or ()})
        tensor = torch.tensor([values.get(name, -math.inf) for name in names], dtype=torch.float64)
        with self._collective("all-reduce (max)"):
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return dict(zip(names, tensor.tolist(), strict=True))

    def barrier(self) -> None:
        """Wait until every rank gets here (at most `timeout` seconds)."""
        if self.size == 1:
            return
        import torch.distributed as dist

        with self._collective("barrier"):
            dist.barrier()

    def broadcast(self, tensor: Any, source: int) -> Any:
        """`tensor` as rank `source` holds it, on every rank (filled in place elsewhere; contiguous, CPU)."""
        import torch.distributed as dist

        with self._collective(f"broadcast from rank {source}"):
            dist.broadcast(tensor, src=source)
        return tensor

    def broadcast_object(self, value: Any, source: int) -> Any:
        """Rank `source`'s `value` (any picklable object; the others pass a placeholder), on every rank."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        with self._collective(f"broadcast from rank {source}"):
            dist.broadcast_object_list(box, src=source)
        return box[0]

    def send(self, tensor: Any, to: int) -> None:
        """`tensor` (contiguous, CPU) to rank `to`, which `receive`s it; returns once it is sent."""
        import torch.distributed as dist

        with self._collective(f"sending to rank {to}"):
            dist.send(tensor, dst=to)

    def receive(self, source: int, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        """A float32 (or `dtype`) tensor of `shape` that rank `source` `send`s."""
        import torch
        import torch.distributed as dist

        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        with self._collective(f"receiving from rank {source}"):
            dist.recv(tensor, src=source)
        return tensor

    @contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """A failed collective as one `PeerLost` line instead of gloo's multi-line RuntimeError."""
        try:
            yield
        except RuntimeError as exc:  # torch.distributed's DistError and its subclasses are RuntimeErrors
            raise PeerLost(
                f"rank {self.rank} of {self.size}: {what} failed: {PEER_LOST} within {self.timeout:g} s"
                f" ({_first_line(exc)})",
            ) from None


def cores_per_rank(world: World) -> int | None:
    """This node's cores shared among the ranks torchrun started on it (LOCAL_WORLD_SIZE), or None for
    a world of one process (which takes every core): P ranks each taking every core would fight."""
    if world.size == 1:
        return None
    local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    return cores.per_rank(int(local) if local.isdigit() else world.size)


@contextmanager
def joined(timeout: float = DEFAULT_TIMEOUT, processes: int = 1) -> Iterator[World]:
    """This process's world, joined for the duration: torchrun's, or one process when not started by one.

    With WORLD_SIZE set above 1, the gloo process group is initialised from RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT (`env://`), every rank waiting at most `timeout` seconds for the others, and torn
    down on leaving.
    """
    if not 0 < timeout <= 7 * 24 * 3600:
        raise WeightsmithError(f"--peer-timeout {timeout:g}: give seconds from 1 to a week", code="usage")
    env = os.environ
    if "WORLD_SIZE" not in env or env["WORLD_SIZE"].strip() == "1":
        yield World(timeout=timeout)
        return
    rank, size = _number("RANK"), _number("WORLD_SIZE")
    if not 0 <= rank < size:
        raise WeightsmithError(f"RANK={rank} is not a rank of WORLD_SIZE={size}", code="distributed.environment")
    missing = [name for name in ENVIRONMENT if not env.get(name)]
    if missing:
        raise WeightsmithError(
            f"WORLD_SIZE={size} but {', '.join(missing)} not set: start the ranks with torchrun",
            code="distributed.environment",
        )
    import torch.distributed as dist

    where = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    try:
        dist.init_process_group(
            "gloo", init_method="env://", rank=rank, world_size=size, timeout=timedelta(seconds=timeout)
        )
    except (RuntimeError, ValueError) as exc:
        raise PeerLost(
            f"rank {rank} of {size}: joining the run at {where} failed: {PEER_LOST} within {timeout:g} s"
            f" ({_first_line(exc)})"
        ) from None
    try:
        if processes not in (1, size):
            raise WeightsmithError(
                f"--processes {processes} in a run of {size} ranks: torchrun starts them, leave --processes out",
                code="usage",
            )
        yield World(rank, size, timeout)
    finally:
        dist.destroy_process_group()


def _number(name: str) -> int:
    text = os.environ[name].strip() if name in os.environ else ""
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise WeightsmithError(f"{name}={text[:40]!r} is not a whole number", code="distributed.environment")
    return int(text)


def _first_line(exc: BaseException) -> str:
    """The gist of torch's message: its first line, without gloo's `[source/file.cc:123]` in front."""
    lines = str(exc).strip().splitlines()
    line = re.sub(r"^\[[^\]]*\]\s*", "", lines[0]) if lines else ""
    line = line or type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."
