"""Data-parallel runs over processes and nodes, on torch.distributed's gloo backend (CPU, over TCP).

A run is a `World` of `size` ranks, each a process that runs its `share` of the items (calibration
sequences) and meets the others only in collectives: `max_reduce`, `barrier`, and GPTQ's broadcasts
and sends. Every rank learns its place from the environment torchrun sets (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), whether torchrun started it on one node or many, or `launch.ranks` on this
machine; without those variables the world is one process and no collective touches
torch.distributed at all.

A rank that dies or hangs must not leave the others waiting for ever nor print a traceback each: every
collective waits at most `World.timeout` seconds, and its failure (gloo raises RuntimeError subclasses
for a closed connection and for a timeout) becomes one `PeerLost` line that names this rank and the
collective. Which peer failed gloo does not say; the launcher, which sees its children end, does
(`launch`).

A port is all it takes to join a world, so a rank of another run given the same MASTER_PORT would
join it and feed its own model's activations into this run's maxima or Hessians. So right after the
join every rank shows the others its `Job` (command, source fingerprint, output, options) and every
rank ends, with the same line, unless all are rank 0's. The variables that place a rank are checked
before torch sees them: torch prints a warning per retry, with a value's raw escape sequences, before
it gives up on an address it cannot use.

Nothing a rank receives is unpickled (torch's `*_object` collectives unpickle, which runs whatever
code the sender chose): names and small structures travel as JSON (`gather_json`, `broadcast_json`),
arrays as an int64 header and their raw values (`broadcast_array`), every length and shape checked
before a buffer of that size is made, and what does not parse as the expected form is one line
naming the rank that sent it (`Message`).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightsmith.core import cores
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import cut, echo

if TYPE_CHECKING:
    import numpy.typing as npt

#: Seconds a rank waits for the others to join and at each collective: long enough for the slowest
#: rank of a real run to finish its share (ranks meet only at the end of a measurement), short enough
#: that a hung peer ends the run the same day.
DEFAULT_TIMEOUT = 1800.0
#: What every `PeerLost` line says; the launcher tells a consequence of another rank's end by it.
PEER_LOST = "another rank ended or did not answer"
#: The variables torchrun sets that make a process one rank of a world.
ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: What a MASTER_ADDR may hold: a host name, an IPv4 or IPv6 address (with a `%` zone), at most 253
#: characters as DNS allows. Anything else (a space, an escape sequence) is a mistake torch would retry.
ADDRESS = re.compile(r"[A-Za-z0-9._:%-]{1,253}")
#: The text fields of a `Job` description (`Job.described`), beside its options.
DESCRIBED = ("weightsmith", "command", "source", "fingerprint", "output")
#: Bytes one rank's `Job` description may take; a real one is well under a kilobyte per option.
MAX_DESCRIPTION = 1 << 20
#: The characters of one value a refusal quotes: a path may be 4,096 bytes, the line stays readable.
QUOTED = 300
#: Bytes the names of one rank's maxima may take as JSON (`max_reduce`): some 50 bytes a name, room for
#: 300,000 names, several times the Linears and attention modules of the largest MoE models.
MAX_NAMES = 1 << 24
#: Bytes a structure broadcast as JSON may take by default (`broadcast_json`): a layer's groups of
#: modules, a module's GPTQ outcome; a layer of 1,000 experts' Linears takes about 150 KB.
MAX_STRUCTURE = 1 << 20
#: Dimensions an array sent between ranks may have (`broadcast_array`); GPTQ's clip factors have 2.
MAX_NDIM = 4
#: The dtypes `broadcast_array` carries, each sent as its index here.
ARRAY_DTYPES = ("float32", "float64", "int8", "int32", "int64")


class PeerLost(WeightsmithError):
    """A collective failed: another rank ended, or did not answer within the timeout."""

    code = "distributed.peer"


@dataclass(frozen=True)
class Message:
    """What one exchange carries, as its lines name it: a rank on the port may be anyone's, so what it
    sends is checked, and refused in one line naming it.

    `exchange` names the collective in a `PeerLost` line; a refusal reads "rank R of N {sent} {problem}
    {after}", the problem being a length out of bounds or, for `malformed`, not being `form`.
    """

    exchange: str
    sent: str
    form: str = ""
    after: str = ""
    code: str = "distributed.data"

    def refusal(self, rank: int, size: int, problem: str) -> WeightsmithError:
        """The line every rank that received this from rank `rank` of `size` ends with."""
        return WeightsmithError(f"rank {rank} of {size} {self.sent} {problem}{self.after}", code=self.code)

    def malformed(self, rank: int, size: int) -> WeightsmithError:
        """The refusal of what rank `rank` sent that parsed, but not as `form` (or not at all)."""
        return self.refusal(rank, size, f"as something other than {self.form}")


#: The comparison of jobs (`World.agree`): its refusal of a length keeps the form of its other lines.
ANOTHER_JOB = "is running another job"
JOB = Message("comparing jobs", f"{ANOTHER_JOB}: it described it", after="; nothing was written",
              code="distributed.job")  # fmt: skip
#: The names of the maxima (`World.max_reduce`).
NAMES = Message("gathering names", "sent the names of its maxima", "a JSON list of names")


@dataclass(frozen=True)
class Job:
    """What one rank was asked to do, which every rank of a world must share: the command, its source
    and output (absolute paths), and each option that shapes the output, as (flag, value shown).

    The source is compared by its fingerprint (`io.provenance.fingerprint`: headers and the ends of
    each shard), read when the ranks join: the same path on two nodes may hold two models."""

    command: str
    source: Path
    output: Path
    options: tuple[tuple[str, str], ...] = ()

    def described(self) -> dict[str, Any]:
        """This rank's job as plain JSON data, its source's fingerprint read now."""
        from weightsmith.core.version import __version__
        from weightsmith.io.checkpoint import Checkpoint
        from weightsmith.io.provenance import fingerprint

        return {
            "weightsmith": __version__,
            "command": self.command,
            "source": str(self.source),
            "fingerprint": fingerprint(Checkpoint.open(self.source)),
            "output": str(self.output),
            "options": [list(option) for option in self.options],
        }


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
        names are gathered first (as JSON, `NAMES`) and the values reduced in sorted name order. Values
        travel as float64: a Python float arrives unchanged, and max is exact, so the result does not
        depend on how the items were shared.
        """
        if self.size == 1:
            return {name: values[name] for name in sorted(values)}
        import torch
        import torch.distributed as dist

        held: set[str] = set()
        for rank, part in enumerate(self.gather_json(sorted(values), NAMES, MAX_NAMES)):
            if not isinstance(part, list) or not all(isinstance(name, str) for name in part):
                raise NAMES.malformed(rank, self.size)
            held.update(part)
        names = sorted(held)
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

    def broadcast(self, tensor: Any, source: int, what: str = "") -> Any:
        """`tensor` as rank `source` holds it, on every rank (filled in place elsewhere; contiguous, CPU).

        Its size is the receiver's: only what the receiver already knows the size of (or has just
        checked, as `broadcast_json` and `broadcast_array` do) travels this way."""
        import torch.distributed as dist

        with self._collective(what or f"broadcast from rank {source}"):
            dist.broadcast(tensor, src=source)
        return tensor

    def broadcast_json(self, value: object, source: int, message: Message, limit: int = MAX_STRUCTURE) -> object:
        """Rank `source`'s `value` (JSON data; the others' is not read) on every rank, as JSON decodes
        it there and on `source` alike (so lists where tuples were sent, at any world size), or None
        where the bytes are not JSON: the caller checks its form.

        The length goes first and is checked against `limit` on every rank before a buffer of that
        size is made, then the bytes; they are never unpickled.
        """
        import torch

        data = _encoded(value) if self.rank == source or self.size == 1 else b""
        if self.size == 1:
            return _json_or_none(data)
        length = self.broadcast(torch.tensor([len(data)], dtype=torch.int64), source, message.exchange)
        size = self._checked_length(source, int(length.item()), message, limit)
        received = self.broadcast(_padded(data, size), source, message.exchange)
        return _json_or_none(received.numpy().tobytes())

    def gather_json(self, value: object, message: Message, limit: int) -> list[object]:
        """Every rank's `value` (JSON data) in rank order, each as JSON decodes it, None for a rank whose
        bytes are not JSON: the caller checks each one's form.

        The lengths go first, and every rank's is checked against `limit` before a buffer of that size
        is made, then the bytes, padded to the longest; they are never unpickled.
        """
        import torch
        import torch.distributed as dist

        data = _encoded(value)
        if self.size == 1:
            return [_json_or_none(data)]
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        with self._collective(message.exchange):
            dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64))
        sizes = [self._checked_length(rank, int(length.item()), message, limit) for rank, length in enumerate(lengths)]
        held = [torch.zeros(max(sizes), dtype=torch.uint8) for _ in range(self.size)]
        with self._collective(message.exchange):
            dist.all_gather(held, _padded(data, max(sizes)))
        return [_json_or_none(part[:size].numpy().tobytes()) for part, size in zip(held, sizes, strict=True)]

    def broadcast_array(
        self, array: npt.NDArray[Any] | None, source: int, message: Message, dtype: str, most: int
    ) -> npt.NDArray[Any]:
        """Rank `source`'s `array` (the others pass None) on every rank, where it must be `dtype` with
        at most `most` values in at most `MAX_NDIM` dimensions, else every rank ends with one line.

        A header of int64s goes first (`_header`: the dtype, the number of dimensions, each one), which
        every rank checks before anything of that size is made, then the raw values.
        """
        import numpy as np
        import torch

        if self.size == 1:
            assert array is not None, "the source holds the array"
            return array
        header = torch.tensor(_header(array) if self.rank == source else [0] * (2 + MAX_NDIM), dtype=torch.int64)
        self.broadcast(header, source, message.exchange)
        shape = self._checked_shape(source, [int(n) for n in header.tolist()], message, dtype, most)
        if self.rank == source:
            assert array is not None, "the source holds the array"
            self.broadcast(torch.from_numpy(np.array(array, order="C")), source, message.exchange)
            return array
        values = torch.empty(shape, dtype=getattr(torch, dtype))
        self.broadcast(values, source, message.exchange)
        return values.numpy()

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

    def agree(self, job: Job) -> None:
        """Return only when every rank runs rank 0's `job`; else every rank raises the same line.

        Called once, right after the join: a rank of another run on the same port is refused before
        it sends a number. A rank that cannot describe its job (its source does not open) is named
        the same way, by every rank. The descriptions travel as JSON, never pickled: a rank on the
        port may be anyone's.
        """
        if self.size == 1:
            return
        try:
            mine = job.described()
        except WeightsmithError as exc:
            mine = {"error": str(exc)}
        problem = _disagreement(self.gather_json(mine, JOB, MAX_DESCRIPTION), self.size)
        if problem is not None:
            raise WeightsmithError(problem, code=JOB.code)

    def _checked_length(self, rank: int, size: int, message: Message, limit: int) -> int:
        """`size`, the byte count rank `rank` announced, once it is 1 to `limit`: refused before a
        buffer of that size is made (JSON data is never empty)."""
        if not 0 < size <= limit:
            raise message.refusal(rank, self.size, f"in {size:,} bytes, not 1 to {limit:,}")
        return size

    def _checked_shape(self, rank: int, header: list[int], message: Message, dtype: str, most: int) -> tuple[int, ...]:
        """The shape rank `rank`'s array header announced, once it is a `dtype` array of at most `most`
        values in at most `MAX_NDIM` dimensions, the unused dimensions zero: refused before anything
        of that size is made."""
        code, ndim, dims = header[0], header[1], header[2:]
        if 0 <= ndim <= MAX_NDIM:
            shape = tuple(dims[:ndim])
            if (
                code == ARRAY_DTYPES.index(dtype)
                and all(n >= 0 for n in shape)
                and not any(dims[ndim:])
                and math.prod(shape) <= most
            ):
                return shape
        kind = ARRAY_DTYPES[code] if 0 <= code < len(ARRAY_DTYPES) else f"dtype code {code}"
        shown = f"shape {list(dims[:ndim])}" if 0 <= ndim <= MAX_NDIM else f"{ndim} dimensions"
        expected = f"{dtype} of at most {most:,} values in at most {MAX_NDIM} dimensions"
        raise message.refusal(rank, self.size, f"as {kind} of {shown}, not {expected}")

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
def joined(timeout: float = DEFAULT_TIMEOUT, processes: int = 1, job: Job | None = None) -> Iterator[World]:
    """This process's world, joined for the duration: torchrun's, or one process when not started by one.

    With WORLD_SIZE set above 1, the gloo process group is initialised from RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT (`env://`), every rank waiting at most `timeout` seconds for the others, and torn
    down on leaving. With a `job`, the ranks then compare theirs (`World.agree`) before the caller
    runs. A caller that started every rank itself with one job may leave it out.
    """
    if not 0 < timeout <= 7 * 24 * 3600:
        raise WeightsmithError(f"--peer-timeout {timeout:g}: give seconds from 1 to a week", code="usage")
    env = os.environ
    size = _number("WORLD_SIZE") if "WORLD_SIZE" in env else 1
    if size <= 1:
        _alone(size, processes)
        yield World(timeout=timeout)
        return
    rank = _number("RANK")
    if not 0 <= rank < size:
        raise WeightsmithError(f"RANK={rank} is not a rank of WORLD_SIZE={size}", code="distributed.environment")
    missing = [name for name in ENVIRONMENT if not env.get(name)]
    if missing:
        raise WeightsmithError(
            f"WORLD_SIZE={size} but {', '.join(missing)} not set: start the ranks with torchrun",
            code="distributed.environment",
        )
    where = _rendezvous(rank, size)
    import torch.distributed as dist

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
        world = World(rank, size, timeout)
        if job is not None:
            world.agree(job)
        yield world
    finally:
        dist.destroy_process_group()


def _alone(size: int, processes: int) -> None:
    """Refuse WORLD_SIZE=0, and `--processes P` where WORLD_SIZE=1 says this process is a whole run.

    WORLD_SIZE is what makes a process a rank (torchrun sets it; so does `--processes` for its
    children), so the launcher does not start ranks under one: an inherited WORLD_SIZE=1 would
    otherwise turn `--processes 4` into one process without a word.
    """
    if size == 0:
        raise WeightsmithError("WORLD_SIZE=0: a run has at least one rank", code="distributed.environment")
    if processes != 1:
        raise WeightsmithError(
            f"--processes {processes} asks for {processes} ranks, but WORLD_SIZE=1 in the environment makes this "
            f"process the only rank of its run (rank 0 of 1): unset WORLD_SIZE to start {processes} ranks, or "
            "leave --processes out",
            code="usage",
        )


def _rendezvous(rank: int, size: int) -> str:
    """MASTER_ADDR:MASTER_PORT, once both are usable: refused here in one line naming this rank, not
    after torch has retried them until the timeout, a warning a try, with the raw value in each."""
    address, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    if not ADDRESS.fullmatch(address):
        raise WeightsmithError(
            f"rank {rank} of {size}: MASTER_ADDR {echo(address, QUOTED)} is not a host name or address "
            "(ASCII letters, digits and . - _ : %, at most 253)",
            code="distributed.environment",
        )
    text = port.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= 65535):
        raise WeightsmithError(
            f"rank {rank} of {size}: MASTER_PORT {echo(port, QUOTED)} is not a port (a whole number from 1 to 65535)",
            code="distributed.environment",
        )
    try:
        socket.getaddrinfo(address, int(text), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise WeightsmithError(
            f"rank {rank} of {size}: MASTER_ADDR {echo(address, QUOTED)} does not resolve ({_first_line(exc)})",
            code="distributed.environment",
        ) from None
    return f"{address}:{text}"


def _encoded(value: object) -> bytes:
    """`value` (JSON data) as the bytes a rank sends: ASCII, so every rank decodes it alike."""
    return json.dumps(value, ensure_ascii=True).encode()


def _padded(data: bytes, width: int) -> Any:
    """`data` at the start of `width` zero bytes, a uint8 tensor: what a rank sends, or receives into."""
    import torch

    buffer = torch.zeros(width, dtype=torch.uint8)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buffer


def _header(array: npt.NDArray[Any] | None) -> list[int]:
    """What `World.broadcast_array` sends ahead of `array`: its dtype's index in `ARRAY_DTYPES` (-1 for
    one not there), its number of dimensions, and each dimension, zeros after them up to `MAX_NDIM`."""
    assert array is not None, "the source holds the array"
    name = array.dtype.name
    dims = [int(n) for n in array.shape[:MAX_NDIM]]
    return [ARRAY_DTYPES.index(name) if name in ARRAY_DTYPES else -1, array.ndim, *dims, *[0] * (MAX_NDIM - len(dims))]


def _json_or_none(data: bytes) -> object:
    """What a rank sent as JSON data, or None for bytes that are not (another program on the port, a
    pickle): the caller refuses it in its own words."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _disagreement(described: list[object], size: int) -> str | None:
    """The line every rank ends with, or None when every rank runs rank 0's job: the lowest rank that
    could not describe its job, else the lowest that described it in a form not ours (a program that
    is not weightsmith, or another version's), else the lowest whose job differs, with the first thing
    that differs."""
    for rank, job in enumerate(described):
        if isinstance(job, dict) and isinstance(job.get("error"), str):
            return f"rank {rank} of {size}: {cut(job['error'], 4 * QUOTED)}"
    for rank, job in enumerate(described):
        if not _well_formed(job):
            return _another_job(rank, size, "it does not describe it as weightsmith does")
    lead = described[0]
    for rank, job in enumerate(described[1:], start=1):
        assert isinstance(lead, dict) and isinstance(job, dict)  # both well formed
        difference = _difference(lead, job)
        if difference is not None:
            return _another_job(rank, size, difference)
    return None


def _another_job(rank: int, size: int, what: str) -> str:
    """The refusal of rank `rank`'s job, in `JOB`'s words."""
    return f"rank {rank} of {size} {ANOTHER_JOB}: {what}{JOB.after}"


def _difference(lead: dict[str, Any], job: dict[str, Any]) -> str | None:
    """What `job` (a rank's description) does differently from rank 0's `lead`, the most telling first."""
    if job["weightsmith"] != lead["weightsmith"]:
        return f"weightsmith {cut(job['weightsmith'], QUOTED)}, not rank 0's {cut(lead['weightsmith'], QUOTED)}"
    if job["command"] != lead["command"]:
        return f"{cut(job['command'], QUOTED)}, not rank 0's {cut(lead['command'], QUOTED)}"
    if job["fingerprint"] != lead["fingerprint"]:
        if job["source"] != lead["source"]:
            return f"source {cut(job['source'], QUOTED)}, not rank 0's {cut(lead['source'], QUOTED)}"
        return (
            f"source {cut(job['source'], QUOTED)} holds other files than rank 0's "
            f"({cut(job['fingerprint'], 19)}, not {cut(lead['fingerprint'], 19)})"
        )
    if job["output"] != lead["output"]:
        return f"output {cut(job['output'], QUOTED)}, not rank 0's {cut(lead['output'], QUOTED)}"
    ours, theirs = dict(lead["options"]), dict(job["options"])
    for flag in [*ours, *(flag for flag in theirs if flag not in ours)]:
        if ours.get(flag) != theirs.get(flag):
            given, expected = (cut(side.get(flag, "(not given)"), QUOTED) for side in (theirs, ours))
            return f"{cut(flag, QUOTED)} {given}, not rank 0's {expected}"
    return None


def _well_formed(job: object) -> bool:
    """Whether a rank's description has the shape `Job.described` gives (a stranger's may not)."""
    if not isinstance(job, dict) or set(job) != {*DESCRIBED, "options"}:
        return False
    options = job["options"]
    return (
        all(isinstance(job[key], str) for key in DESCRIBED)
        and isinstance(options, list)
        and all(isinstance(o, list) and len(o) == 2 and all(isinstance(part, str) for part in o) for o in options)
    )


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
    return cut(line, 200)
