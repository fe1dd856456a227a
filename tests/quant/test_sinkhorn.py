"""SINQ's Sinkhorn kernel against a plain float64 NumPy version of the same iteration, and the
stacked `Rows` it reads against the matrix they stand for."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from weightsmith.quant import SINKHORN_ITERATIONS, sinkhorn


def _reference(w: np.ndarray, group: int) -> tuple[np.ndarray, list[int]]:
    """Column scales of `w` (centred on their median) and the steps each tile took, in float64."""
    scales, steps = [], []
    for c0 in range(0, w.shape[1], group):
        t = w[:, c0 : c0 + group].astype(np.float64)
        log_col, log_row = np.zeros(t.shape[1]), np.zeros(t.shape[0])
        best, kept, target, taken = math.inf, np.ones(t.shape[1]), 0.0, SINKHORN_ITERATIONS
        for step in range(SINKHORN_ITERATIONS):
            x = t * np.exp(-log_col)[None, :] * np.exp(-log_row)[:, None]
            row_sd, col_sd = x.std(axis=1, ddof=1), x.std(axis=0, ddof=1)
            imbalance = max(row_sd.max(), col_sd.max()) / max(min(row_sd.min(), col_sd.min()), 1e-12)
            if step == 0:
                target = min(np.clip(row_sd.min(), 1e-3, 1e3), np.clip(col_sd.min(), 1e-3, 1e3)) + 1e-6
            if imbalance > best * (1 + sinkhorn.TIE):
                taken = step
                break
            best, kept = min(best, imbalance), np.exp(log_col)
            for logs, sd in ((log_col, col_sd), (log_row, row_sd)):
                move = np.clip(np.log(np.clip(sd, 1e-3, 1e3) / target), math.log(0.7), math.log(2.0))
                logs[:] = np.clip(logs + move, -0.3, 10.0)
        scales.append(kept)
        steps.append(taken)
    out = np.concatenate(scales)
    return out / np.median(out), steps


def _uneven(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A weight-like matrix: heavy-tailed values, uneven rows and columns, a few outlier columns."""
    w = rng.standard_t(5, (rows, cols)) * np.exp(0.5 * rng.standard_normal(rows))[:, None]
    w *= np.exp(rng.standard_normal(cols))[None, :]
    w[:, rng.choice(cols, 3, replace=False)] *= 20
    return (0.02 * w).astype(np.float32)


@pytest.mark.parametrize(("rows", "cols", "group"), [(96, 128, 64), (700, 256, 128), (2000, 64, 32), (300, 72, 24)])
def test_kernel_matches_a_float64_reference(rows: int, cols: int, group: int) -> None:
    w = _uneven(np.random.default_rng(rows), rows, cols)
    want, steps = _reference(w, group)
    got = sinkhorn.column_scales(w, group)
    assert got.dtype == np.float32 and min(steps) < SINKHORN_ITERATIONS  # the early stop is exercised
    np.testing.assert_allclose(got, want, rtol=2e-6)


def test_stacked_rows_read_as_the_matrix_they_stand_for() -> None:
    """BF16 weights read from their bits, rows times a factor (rounded to float32), columns mapped;
    tiles shared among threads."""
    rng = np.random.default_rng(0)
    a = _uneven(rng, 48, 128).astype(ml_dtypes.bfloat16)
    b = _uneven(rng, 80, 256).astype(ml_dtypes.bfloat16)
    factor = np.exp(rng.standard_normal(80)).astype(np.float32)
    columns = rng.permutation(256)[:128]
    parts = [sinkhorn.Rows(a), sinkhorn.Rows(b, factor, columns), sinkhorn.Rows(b.astype(np.float32), None, columns)]
    whole = np.concatenate(
        [a.astype(np.float32), b.astype(np.float32)[:, columns] * factor[:, None], b.astype(np.float32)[:, columns]]
    )
    np.testing.assert_array_equal(sinkhorn.column_scales(parts, 64), sinkhorn.column_scales(whole, 64))
    np.testing.assert_array_equal(sinkhorn.column_scales(parts, 32, workers=3), sinkhorn.column_scales(whole, 32))
    with pytest.raises(ValueError, match="disagree on their columns"):
        sinkhorn.column_scales([sinkhorn.Rows(a), sinkhorn.Rows(b)], 64)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_scale_rounds_once_as_numpy_does(dtype: type) -> None:
    rng = np.random.default_rng(1)
    x = _uneven(rng, 64, 96).astype(dtype)
    x[0, :4] = [np.inf, -np.inf, 0.0, -0.0]
    inv_col = np.exp(rng.standard_normal(96)).astype(np.float32)
    row = np.exp(rng.standard_normal(64)).astype(np.float32)
    for factor in (row, None):
        want = x.astype(np.float32) * inv_col * (1 if factor is None else factor[:, None])
        got = sinkhorn.scale(x, inv_col, factor)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.astype(dtype).view(np.uint8))
