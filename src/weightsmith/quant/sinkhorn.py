"""Sinkhorn-style balancing of a weight's row and column spreads (SINQ, arXiv 2509.22944).

SINQ quantizes `W = diag(r) Q diag(c)`: besides the usual per-row (per-group) scale, a scale per
input column, found without data by alternately dividing the rows and the columns of each group
tile by their standard deviations until the largest spread over the smallest stops shrinking.
Only the column scale is returned here: a row scale is absorbed by the group scales anyway.

The iteration follows the paper's reference: steps are damped (each factor's change is clamped to
[0.7, 2] of the smallest spread), spreads are clamped to [1e-3, 1e3], log-scales to [-0.3, 10], and
the scales kept are those of the least imbalanced iterate; the first iterate that is more
imbalanced than the best ends the search (later steps would only move further away).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: Sinkhorn steps at most: the reference's default for its dual-scale quantizer.
ITERATIONS = 16
_SPREAD_MIN, _SPREAD_MAX = 1e-3, 1e3
_STEP_MIN, _STEP_MAX = math.log(0.7), math.log(2.0)
_LOG_MIN, _LOG_MAX = -0.3, 10.0


@njit(nogil=True, cache=True)
def _spreads(
    w: np.ndarray, c0: int, inv_col: np.ndarray, inv_row: np.ndarray, row_sd: np.ndarray, col_sd: np.ndarray
) -> float:
    """Row and column standard deviations (n - 1) of the tile `w[:, c0:c0+g]` divided by the
    current scales, in one pass; returns its imbalance (largest spread over the smallest)."""
    rows, g = w.shape[0], inv_col.shape[0]
    col_s = np.zeros(g)
    col_q = np.zeros(g)
    for i in range(rows):
        b = inv_row[i]
        s = 0.0
        q = 0.0
        for j in range(g):
            x = w[i, c0 + j] * inv_col[j] * b
            s += x
            q += x * x
            col_s[j] += x
            col_q[j] += x * x
        row_sd[i] = math.sqrt(max(q - s * s / g, 0.0) / max(g - 1, 1))
    for j in range(g):
        col_sd[j] = math.sqrt(max(col_q[j] - col_s[j] * col_s[j] / rows, 0.0) / max(rows - 1, 1))
    lo: float = min(row_sd.min(), col_sd.min())
    hi: float = max(row_sd.max(), col_sd.max())
    return hi / max(lo, 1e-12)


@njit(nogil=True, cache=True)
def _tile(w: np.ndarray, c0: int, g: int, iterations: int, out: np.ndarray) -> None:
    """The column scales of one tile of `g` columns into `out[c0:c0+g]`."""
    rows = w.shape[0]
    log_col = np.zeros(g)
    log_row = np.zeros(rows)
    row_sd = np.empty(rows)
    col_sd = np.empty(g)
    best = math.inf
    target = 0.0
    for j in range(g):
        out[c0 + j] = 1.0
    for step in range(iterations):
        imbalance = _spreads(w, c0, np.exp(-log_col), np.exp(-log_row), row_sd, col_sd)
        if step == 0:
            lo_r = min(max(row_sd.min(), _SPREAD_MIN), _SPREAD_MAX)
            lo_c = min(max(col_sd.min(), _SPREAD_MIN), _SPREAD_MAX)
            target = min(lo_r, lo_c) + 1e-6
        if imbalance > best:
            return
        best = imbalance
        for j in range(g):
            out[c0 + j] = math.exp(log_col[j])
        for j in range(g):
            sd = min(max(col_sd[j], _SPREAD_MIN), _SPREAD_MAX)
            step_j = min(max(math.log(sd / target), _STEP_MIN), _STEP_MAX)
            log_col[j] = min(max(log_col[j] + step_j, _LOG_MIN), _LOG_MAX)
        for i in range(rows):
            sd = min(max(row_sd[i], _SPREAD_MIN), _SPREAD_MAX)
            step_i = min(max(math.log(sd / target), _STEP_MIN), _STEP_MAX)
            log_row[i] = min(max(log_row[i] + step_i, _LOG_MIN), _LOG_MAX)


@njit(nogil=True, cache=True)
def _columns(w: np.ndarray, g: int, iterations: int) -> np.ndarray:
    out = np.empty(w.shape[1], np.float32)
    for c0 in range(0, w.shape[1], g):
        _tile(w, c0, g, iterations, out)
    return out


def column_scales(w: np.ndarray, group: int, iterations: int = ITERATIONS) -> np.ndarray:
    """A scale per column of `w` (float32 [rows, cols], cols a multiple of `group`), balanced
    within each tile of `group` columns and divided by their median, so that the scales centre on 1.

    `w / scales` is the matrix to quantize; the input of its layer is multiplied by `scales`.
    """
    rows, cols = w.shape
    if cols % group:
        raise ValueError(f"{cols} columns are not a whole number of groups of {group}")
    if rows == 0 or cols == 0:
        return np.ones(cols, np.float32)
    scales: np.ndarray = _columns(np.ascontiguousarray(w, np.float32), group, iterations)
    centred: np.ndarray = (scales / np.median(scales)).astype(np.float32)
    return centred
