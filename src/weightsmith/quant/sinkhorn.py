"""Sinkhorn-style balancing of a weight's row and column spreads (SINQ, arXiv 2509.22944).

SINQ quantizes `W = diag(r) Q diag(c)`: besides the usual per-row (per-group) scale, a scale per
input column, found without data by alternately dividing the rows and the columns of each group
tile by their standard deviations until the largest spread over the smallest stops shrinking.
Only the column scale is returned here: a row scale is absorbed by the group scales anyway.

The iteration follows the paper's reference: steps are damped (each factor's change is clamped to
[0.7, 2] of the smallest spread), spreads are clamped to [1e-3, 1e3], log-scales to [-0.3, 10], and
the scales kept are those of the last iterate not more imbalanced than the best; the first iterate
that is more imbalanced (beyond a tie, `TIE`) ends the search (later steps would only move further away).

The matrix to balance is often several weights stacked (projections that share an input), some
rows scaled or columns permuted: it is never built whole. Each tile of `group` columns is copied
from the weights as they are stored (BF16 decoded from its bits) into one float32 buffer, and each
step takes its row and column sums in one pass over it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numba import njit

from weightsmith.quant import SINKHORN_ITERATIONS
from weightsmith.quant.floatbits import MODE_BF16, bf16_round, decode
from weightsmith.quant.lanes import LANES, lane_total

_SPREAD_MIN, _SPREAD_MAX = 1e-3, 1e3
#: A step's factor and a scale's logarithm stay within these; the column scales are kept as logarithms,
#: the row scales (many more) as factors, so each bound is also given in the other form.
_RATIO_MIN, _RATIO_MAX = 0.7, 2.0
_LOG_MIN, _LOG_MAX = -0.3, 10.0
_STEP_MIN, _STEP_MAX = math.log(_RATIO_MIN), math.log(_RATIO_MAX)
_FACTOR_MIN, _FACTOR_MAX = math.exp(_LOG_MIN), math.exp(_LOG_MAX)
#: How much more imbalanced than the best an iterate must be to end the search. Steps whose extreme
#: spreads are both clamped leave the imbalance unchanged, so exact ties occur in real weights, and
#: which way rounding breaks them (float64 or float32, one summation order or another) would decide
#: how many steps a tile takes: a near-tie goes on, as an exact one does.
TIE = 1e-5


@dataclass(frozen=True)
class Rows:
    """Rows of the matrix to balance, read from a stored weight: `weight` [r, c] (BF16, FP16, FP32)
    with each row times `factor` (float32 [r], the product rounded to float32) and the balanced
    column k read from `weight[:, columns[k]]` (all of `weight`'s columns in order when None)."""

    weight: np.ndarray
    factor: np.ndarray | None = None
    columns: np.ndarray | None = None

    @property
    def width(self) -> int:
        return int(self.weight.shape[1] if self.columns is None else len(self.columns))


#: Rows whose column sums are added in float32 before they join the float64 totals: short enough
#: that the partial sums keep float32's precision, long enough that the float64 adds cost nothing.
_CHUNK = 256


@njit(nogil=True, cache=True)
def _start(columns: np.ndarray, c0: int, g: int) -> int:
    """The first source column of the tile at `c0` when its columns are consecutive there, else -1."""
    start = columns[c0]
    for j in range(g):
        if columns[c0 + j] != start + j:
            return -1
    return int(start)


@njit(nogil=True, cache=True)
def _load_bits(bits: np.ndarray, columns: np.ndarray, c0: int, factor: np.ndarray, r0: int, tile: np.ndarray) -> None:
    """BF16 rows (their uint16 bits) of the tile's columns, times `factor`, into `tile` from row `r0`
    on: a BF16 value is the top half of its float32. Rows are taken as slices, which the compiler
    vectorizes, where 2-D indexing with a run-time offset it does not."""
    g = tile.shape[1]
    start = _start(columns, c0, g)
    word = np.empty(g, np.uint32)
    row = word.view(np.float32)
    for i in range(bits.shape[0]):
        src = bits[i]
        if start >= 0:
            src = src[start : start + g]
            for j in range(g):
                word[j] = np.uint32(src[j]) << np.uint32(16)
        else:
            for j in range(g):
                word[j] = np.uint32(src[columns[c0 + j]]) << np.uint32(16)
        dst = tile[r0 + i]
        f = factor[i]
        for j in range(g):
            dst[j] = row[j] * f


@njit(nogil=True, cache=True)
def _load(w: np.ndarray, columns: np.ndarray, c0: int, factor: np.ndarray, r0: int, tile: np.ndarray) -> None:
    """Float32 rows of the tile's columns, times `factor`, into `tile` from row `r0` on."""
    g = tile.shape[1]
    start = _start(columns, c0, g)
    for i in range(w.shape[0]):
        src = w[i]
        dst = tile[r0 + i]
        f = factor[i]
        if start >= 0:
            src = src[start : start + g]
            for j in range(g):
                dst[j] = src[j] * f
        else:
            for j in range(g):
                dst[j] = src[columns[c0 + j]] * f


@njit(nogil=True, cache=True)
def _spreads(
    tile: np.ndarray, inv_col: np.ndarray, inv_row: np.ndarray, row_sd: np.ndarray, col_sd: np.ndarray
) -> float:
    """Row and column standard deviations (n - 1) of `tile` divided by the current scales (float32
    [g] and [rows]), in one pass; returns its imbalance (largest spread over the smallest).

    The products and row sums are float32, the column sums float32 over `_CHUNK` rows and then
    float64: the spreads are those of a float64 pass to about 1e-6, at the speed of float32 vectors.
    A row's sums are kept in lanes (`quant.lanes`), so that every sum has one order on any CPU.
    """
    rows, g = tile.shape
    col_s = np.zeros(g)
    col_q = np.zeros(g)
    part_s = np.empty(g, np.float32)
    part_q = np.empty(g, np.float32)
    row_s = np.empty(rows, np.float32)
    row_q = np.empty(rows, np.float32)
    lane_s = np.empty(LANES, np.float32)
    lane_q = np.empty(LANES, np.float32)
    whole = g - g % LANES
    for i0 in range(0, rows, _CHUNK):
        part_s[:] = 0
        part_q[:] = 0
        for i in range(i0, min(i0 + _CHUNK, rows)):
            t = tile[i]
            b = inv_row[i]
            lane_s[:] = 0
            lane_q[:] = 0
            for j0 in range(0, whole, LANES):
                for k in range(LANES):
                    y = t[j0 + k] * inv_col[j0 + k]
                    lane_s[k] += y
                    lane_q[k] += y * y
                    x = y * b
                    part_s[j0 + k] += x
                    part_q[j0 + k] += x * x
            for j in range(whole, g):
                y = t[j] * inv_col[j]
                lane_s[j - whole] += y
                lane_q[j - whole] += y * y
                x = y * b
                part_s[j] += x
                part_q[j] += x * x
            row_s[i] = lane_total(lane_s)
            row_q[i] = lane_total(lane_q)
        for j in range(g):
            col_s[j] += part_s[j]
            col_q[j] += part_q[j]
    for i in range(rows):  # apart from the pass, whose rows then do not wait on a square root each
        bb = np.float64(inv_row[i]) * np.float64(inv_row[i])
        s64 = np.float64(row_s[i])
        row_sd[i] = math.sqrt(bb * max(np.float64(row_q[i]) - s64 * s64 / g, 0.0) / max(g - 1, 1))
    for j in range(g):
        col_sd[j] = math.sqrt(max(col_q[j] - col_s[j] * col_s[j] / rows, 0.0) / max(rows - 1, 1))
    lo: float = min(row_sd.min(), col_sd.min())
    hi: float = max(row_sd.max(), col_sd.max())
    return hi / max(lo, 1e-12)


@njit(nogil=True, cache=True)
def _tile(tile: np.ndarray, iterations: int, out: np.ndarray) -> None:
    """The column scales of one tile (float32 [rows, g]) into `out` [g].

    The row scales are kept as factors, not logarithms: a tile has far more rows than columns, and a
    logarithm and an exponential per row and step cost more than the pass itself. exp(clamp(log x))
    is clamp(x) to a few float64 ulps, so the float32 factors the pass reads are the same."""
    rows, g = tile.shape
    log_col = np.zeros(g)
    row = np.ones(rows)
    inv_row = np.ones(rows, np.float32)
    row_sd = np.empty(rows)
    col_sd = np.empty(g)
    best = math.inf
    target = 0.0
    out[:] = 1.0
    for step in range(iterations):
        inv_col = np.exp(-log_col).astype(np.float32)
        imbalance = _spreads(tile, inv_col, inv_row, row_sd, col_sd)
        if step == 0:
            lo_r = min(max(row_sd.min(), _SPREAD_MIN), _SPREAD_MAX)
            lo_c = min(max(col_sd.min(), _SPREAD_MIN), _SPREAD_MAX)
            target = min(lo_r, lo_c) + 1e-6
        if imbalance > best * (1 + TIE):
            return
        best = min(best, imbalance)
        for j in range(g):
            out[j] = math.exp(log_col[j])
        for j in range(g):
            sd = min(max(col_sd[j], _SPREAD_MIN), _SPREAD_MAX)
            step_j = min(max(math.log(sd / target), _STEP_MIN), _STEP_MAX)
            log_col[j] = min(max(log_col[j] + step_j, _LOG_MIN), _LOG_MAX)
        for i in range(rows):
            sd = min(max(row_sd[i], _SPREAD_MIN), _SPREAD_MAX)
            step_i = min(max(sd / target, _RATIO_MIN), _RATIO_MAX)
            row[i] = min(max(row[i] * step_i, _FACTOR_MIN), _FACTOR_MAX)
            inv_row[i] = np.float32(1.0 / row[i])


def _source(part: Rows) -> tuple[np.ndarray, bool, np.ndarray, np.ndarray]:
    """(the weight as the loaders read it, whether as BF16 bits, its column map, its row factor)."""
    w = part.weight
    bf16 = w.dtype.name == "bfloat16"
    src = w.view(np.uint16) if bf16 else np.asarray(w, np.float32)
    columns = np.arange(w.shape[1]) if part.columns is None else np.asarray(part.columns, np.int64)
    factor = np.ones(w.shape[0], np.float32) if part.factor is None else np.asarray(part.factor, np.float32)
    return np.ascontiguousarray(src), bf16, columns, factor


def column_scales(
    w: np.ndarray | Sequence[Rows], group: int, iterations: int = SINKHORN_ITERATIONS, workers: int = 1
) -> np.ndarray:
    """A scale per column of `w` (a float matrix, or the `Rows` stacked in order, cols a multiple of
    `group`), balanced within each tile of `group` columns and divided by their median, so that the
    scales centre on 1. Tiles are independent: `workers` threads take every `workers`-th one.

    `w / scales` is the matrix to quantize; the input of its layer is multiplied by `scales`.
    """
    parts = [Rows(w)] if isinstance(w, np.ndarray) else list(w)
    cols = parts[0].width
    if any(p.width != cols for p in parts):
        raise ValueError(f"stacked rows disagree on their columns ({[p.width for p in parts]})")
    if cols % group:
        raise ValueError(f"{cols} columns are not a whole number of groups of {group}")
    rows = sum(int(p.weight.shape[0]) for p in parts)
    if rows == 0 or cols == 0:
        return np.ones(cols, np.float32)
    sources = [_source(p) for p in parts]
    scales = np.empty(cols, np.float32)

    def tiles(first: int, step: int) -> None:
        tile = np.empty((rows, group), np.float32)
        for c0 in range(first * group, cols, step * group):
            r0 = 0
            for src, bf16, columns, factor in sources:
                (_load_bits if bf16 else _load)(src, columns, c0, factor, r0, tile)
                r0 += src.shape[0]
            _tile(tile, iterations, scales[c0 : c0 + group])

    threads = max(1, min(workers, cols // group))
    if threads == 1:
        tiles(0, 1)
    else:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ws-sinkhorn") as pool:
            for done in [pool.submit(tiles, k, threads) for k in range(threads)]:
                done.result()
    centred: np.ndarray = (scales / np.median(scales)).astype(np.float32)
    return centred


@njit(nogil=True, cache=True)
def _scale_bits(bits: np.ndarray, inv_col: np.ndarray, row: np.ndarray, out: np.ndarray) -> None:
    for i in range(bits.shape[0]):
        src = bits[i]
        dst = out[i]
        f = row[i]
        for j in range(src.shape[0]):
            y = bf16_round(decode(MODE_BF16, src[j]) * inv_col[j] * f)
            dst[j] = np.uint16(np.float32(y).view(np.uint32) >> np.uint32(16))


def scale(x: np.ndarray, inv_col: np.ndarray, row: np.ndarray | None = None) -> np.ndarray:
    """`x` [rows, cols] times `inv_col` [cols] and `row` [rows] (float32), in `x`'s dtype: each value
    widened to float32, multiplied in that order and rounded once (ties to even), as NumPy would;
    BF16 in one pass over its bits, without the float32 copy and ml_dtypes' slower rounding."""
    if x.dtype.name != "bfloat16":
        y: np.ndarray = x.astype(np.float32) * inv_col
        if row is not None:
            y *= row[:, None]
        return y.astype(x.dtype)
    out = np.empty(x.shape, x.dtype)
    ones = np.ones(len(x), np.float32) if row is None else np.ascontiguousarray(row, np.float32)
    _scale_bits(
        np.ascontiguousarray(x).view(np.uint16), np.ascontiguousarray(inv_col, np.float32), ones, out.view(np.uint16)
    )
    return out
