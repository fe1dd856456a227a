"""Which tensors of two checkpoints are byte-identical, which differ and by how much.

Every tensor present on both sides is hashed (blake2b, streamed in chunks, both sides read in
step) and the two digests compared. Where they differ and both dtypes are floating point with the
same shape, a second streamed pass measures the largest absolute difference and the relative L2
error ||a - b|| / ||a||, computed in float64. Sub-byte and integer (packed) tensors are compared
by hash only: a difference in packed codes has no meaningful magnitude.

Differing bytes are never shown as equal: NaN or an infinity on one side only is counted and named
in the detail (the figures then cover the elements finite on both sides), and a tensor whose values
compare equal although its bytes differ (NaN payloads, signed zeros) says so.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from weightsmith.audit.modules import Located
from weightsmith.audit.survey import Survey, survey
from weightsmith.audit.values import CHUNK_BYTES
from weightsmith.core.errors import CheckpointError
from weightsmith.safetensors.header import TensorInfo
from weightsmith.safetensors.reader import ShardReader

IDENTICAL, DIFFERS, RETYPED, ONLY_A, ONLY_B = "identical", "differs", "retyped", "only in A", "only in B"


@dataclass
class TensorDiff:
    name: str
    status: str
    dtype_a: str | None
    dtype_b: str | None
    shape_a: list[int] | None
    shape_b: list[int] | None
    blake2b_a: str | None = None
    blake2b_b: str | None = None
    max_abs_error: float | None = None
    relative_error: float | None = None
    detail: str = ""


@dataclass
class DiffReport:
    a: str
    b: str
    identical: int
    differ: int
    only_a: int
    only_b: int
    bytes_read: int
    tensors: list[TensorDiff]
    summary: str
    seconds: float

    @property
    def same(self) -> bool:
        return self.differ == self.only_a == self.only_b == 0


def diff(a: str | Path, b: str | Path, workers: int | None = None) -> DiffReport:
    """Compare every tensor of checkpoint (or file) `a` with its namesake in `b`."""
    start = time.perf_counter()
    side_a, side_b = _readable(a), _readable(b)
    ta, tb = side_a.tensors, side_b.tensors
    common = sorted(set(ta) & set(tb))
    with _Readers(side_a) as ra, _Readers(side_b) as rb:
        local = threading.local()

        def compare(name: str) -> TensorDiff:
            if not hasattr(local, "buffers"):
                local.buffers = (np.empty(CHUNK_BYTES, np.uint8), np.empty(CHUNK_BYTES, np.uint8))
            return _compare(name, ta[name], tb[name], ra, rb, local.buffers)

        with ThreadPoolExecutor(max_workers=workers or min(4, os.cpu_count() or 1)) as pool:
            results = list(pool.map(compare, common))
    results += [_one_side(n, ta[n].info, ONLY_A) for n in sorted(set(ta) - set(tb))]
    results += [_one_side(n, tb[n].info, ONLY_B) for n in sorted(set(tb) - set(ta))]
    results.sort(key=lambda t: t.name)
    counts = {s: sum(1 for t in results if t.status == s) for s in (IDENTICAL, DIFFERS, RETYPED, ONLY_A, ONLY_B)}
    read = sum(ta[n].info.nbytes + tb[n].info.nbytes for n in common)
    return DiffReport(
        str(a), str(b), counts[IDENTICAL], counts[DIFFERS] + counts[RETYPED], counts[ONLY_A], counts[ONLY_B], read,
        results, _summary(results, counts), time.perf_counter() - start,
    )  # fmt: skip


def _readable(path: str | Path) -> Survey:
    found = survey(path, cross_check=False)
    found.refuse_hostile_index()
    unreadable = set(found.unreadable_shards)
    if unreadable:
        first = next((f.line() for f in found.findings if f.file in unreadable), f"{sorted(unreadable)[0]} unreadable")
        raise CheckpointError(
            f"cannot be compared: {first} (run `weightsmith verify`)",
            file=path,
            code="diff.unreadable",
        )
    return found


class _Readers:
    """One open reader per shard of a checkpoint, for the duration of a comparison."""

    def __init__(self, found: Survey) -> None:
        self.readers = {shard: ShardReader(found.path(shard), h) for shard, h in found.headers.items()}

    def __enter__(self) -> _Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        for reader in self.readers.values():
            reader.close()

    def read(self, located: Located, start: int, out: np.ndarray) -> None:
        self.readers[located.shard].read_bytes_into(located.info, out, start)


def _one_side(name: str, info: TensorInfo, status: str) -> TensorDiff:
    a = info if status == ONLY_A else None
    b = info if status == ONLY_B else None
    return TensorDiff(
        name, status, a.dtype.code if a else None, b.dtype.code if b else None,
        list(a.shape) if a else None, list(b.shape) if b else None,
    )  # fmt: skip


def _compare(
    name: str, a: Located, b: Located, ra: _Readers, rb: _Readers, buffers: tuple[np.ndarray, np.ndarray]
) -> TensorDiff:
    ia, ib = a.info, b.info
    result = TensorDiff(name, IDENTICAL, ia.dtype.code, ib.dtype.code, list(ia.shape), list(ib.shape))
    result.blake2b_a, result.blake2b_b = _hash(a, ra, buffers[0]), _hash(b, rb, buffers[1])
    same_type = (ia.dtype.code, ia.shape) == (ib.dtype.code, ib.shape)
    if same_type and result.blake2b_a == result.blake2b_b:
        return result
    result.status = DIFFERS if same_type else RETYPED
    if not same_type:
        result.detail = f"{ia.dtype.code} {list(ia.shape)} -> {ib.dtype.code} {list(ib.shape)}"
    if ia.shape == ib.shape and _numeric(ia) and _numeric(ib):
        errors = _errors(a, b, ra, rb, buffers)
        result.max_abs_error, result.relative_error = errors.figures()
        if errors.first is not None:
            result.detail = "; ".join(filter(None, [result.detail, errors.describe()]))
        elif same_type and errors.max_abs == 0.0:
            result.detail = "equal as numbers but the bytes differ (NaN payloads or signed zeros)"
    return result


def _hash(located: Located, readers: _Readers, buffer: np.ndarray) -> str:
    digest = hashlib.blake2b(digest_size=32)
    nbytes = located.info.nbytes
    for start in range(0, nbytes, len(buffer)):
        view = buffer[: min(len(buffer), nbytes - start)]
        readers.read(located, start, view)
        digest.update(view.data)
    return digest.hexdigest()


def _numeric(info: TensorInfo) -> bool:
    return info.dtype.is_float and info.dtype.numpy is not None


@dataclass
class _Errors:
    """Sums over the elements finite on both sides, and counts of the non-finite ones that disagree."""

    max_abs: float = 0.0
    diff_sq: float = 0.0
    ref_sq: float = 0.0
    #: elements finite on both sides: the ones the figures cover
    finite: int = 0
    #: non-finite elements where the two sides disagree, by kind
    odd: dict[str, int] = field(default_factory=lambda: {"NaN only in A": 0, "NaN only in B": 0, "unmatched inf": 0})
    #: flat index of the first of them
    first: int | None = None

    def add(self, xa: np.ndarray, xb: np.ndarray, offset: int) -> None:
        both = np.isfinite(xa) & np.isfinite(xb)
        if not both.all():
            na, nb = np.isnan(xa), np.isnan(xb)
            odd = ~both & ~((xa == xb) | (na & nb))  # the same NaN or infinity on both sides agrees
            if odd.any():
                self.odd["NaN only in A"] += int(np.count_nonzero(na & ~nb))
                self.odd["NaN only in B"] += int(np.count_nonzero(nb & ~na))
                self.odd["unmatched inf"] += int(np.count_nonzero(odd & ~na & ~nb))
                if self.first is None:
                    self.first = offset + int(np.argmax(odd))
            xa, xb = xa[both], xb[both]
        delta = np.abs(xa - xb)
        self.finite += len(delta)
        if len(delta):
            self.max_abs = max(self.max_abs, float(np.max(delta)))
        self.diff_sq += float(np.dot(delta, delta))
        self.ref_sq += float(np.dot(xa, xa))

    def figures(self) -> tuple[float | None, float | None]:
        """(largest |a - b|, relative L2 error) over the finite elements; None when there are none."""
        if self.first is not None and not self.finite:
            return None, None
        if self.ref_sq == 0.0:
            return self.max_abs, 0.0 if self.diff_sq == 0.0 else math.inf
        return self.max_abs, math.sqrt(self.diff_sq / self.ref_sq)

    def describe(self) -> str:
        """E.g. `NaN only in B at 3 element(s), first at element 17; figures over the 4,093 finite on both sides`."""
        kinds = ", ".join(f"{what} at {n:,}" for what, n in self.odd.items() if n)
        where = f"{kinds} element(s), first at element {self.first:,}"
        return f"{where}; figures over the {self.finite:,} finite on both sides" if self.finite else where


def _errors(a: Located, b: Located, ra: _Readers, rb: _Readers, buffers: tuple[np.ndarray, np.ndarray]) -> _Errors:
    """Largest |a - b| and ||a - b|| / ||a|| over the whole tensor, streamed element-aligned.

    NaN and infinities are counted apart: one NaN would otherwise make every figure NaN, and
    `max()` over a NaN quietly returns the other operand, which printed as an error of 0.
    """
    ta, tb = a.info.dtype.numpy, b.info.dtype.numpy
    assert ta is not None and tb is not None  # only float dtypes, each with its numpy type, are compared
    step = CHUNK_BYTES // max(ta.itemsize, tb.itemsize)
    errors = _Errors()
    for first in range(0, a.info.numel, step):
        count = min(step, a.info.numel - first)
        va = buffers[0][: count * ta.itemsize]
        vb = buffers[1][: count * tb.itemsize]
        ra.read(a, first * ta.itemsize, va)
        rb.read(b, first * tb.itemsize, vb)
        errors.add(va.view(ta).astype(np.float64), vb.view(tb).astype(np.float64), first)
    return errors


def _summary(results: list[TensorDiff], counts: dict[str, int]) -> str:
    total = len(results)
    parts = [f"{counts[IDENTICAL]:,} identical", f"{counts[DIFFERS]:,} differ"]
    if counts[RETYPED]:
        parts.append(f"{counts[RETYPED]:,} changed dtype or shape")
    parts += [f"{counts[ONLY_A]:,} only in A", f"{counts[ONLY_B]:,} only in B"]
    measured = [t for t in results if t.relative_error is not None]
    worst = max(measured, key=lambda t: t.relative_error or 0.0, default=None)
    tail = f"; largest relative error {worst.relative_error:.3g} in {worst.name}" if worst is not None else ""
    return f"diff: {total:,} tensors: " + ", ".join(parts) + tail
