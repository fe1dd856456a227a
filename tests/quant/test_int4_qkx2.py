"""llama.cpp's weighted scale search for int4 groups: never above RTN's weighted error, exact in format."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from models import smollm2_fp32
from weightsmith.quant import INT4_PACK, int4, int4_qkx2

DTYPES = [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)]
GROUP = 64


def _weights(rows: int, cols: int, seed: int, dtype: np.dtype) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
    w *= np.exp(0.3 * rng.standard_normal((rows, 1))).astype(np.float32)
    w[rng.random(w.shape) < 2e-3] *= 8
    w[1, GROUP : 2 * GROUP] = np.abs(w[1, GROUP : 2 * GROUP])  # a group with no negative value
    w[2, :GROUP] = -np.abs(w[2, :GROUP])  # and one with no positive value
    w[0, :GROUP] = 0.0  # an all-zero group
    return w.astype(dtype)


def _search(w: np.ndarray, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    scale = np.empty((w.shape[0], w.shape[1] // GROUP), np.float32)
    zp = np.full(scale.shape, 99, np.int8)
    assert int4_qkx2.search_qkx2(int4.kernel_input(w), int4.mode_of(w.dtype), GROUP, symmetric, scale, zp) == -1
    return scale, zp


def _rtn(w: np.ndarray, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    scale = np.empty((w.shape[0], w.shape[1] // GROUP), np.float32)
    zp = np.zeros(scale.shape, np.int8)
    packed = np.empty((w.shape[0], w.shape[1] // INT4_PACK), np.uint32)
    shrink = np.ones(scale.shape, np.float32)
    x, mode = int4.kernel_input(w), int4.mode_of(w.dtype)
    assert int4.quantize_rows(x, mode, GROUP, symmetric, shrink, packed, scale, zp) == -1
    return scale, zp


def _dequantized(w: np.ndarray, scale: np.ndarray, zp: np.ndarray, symmetric: bool) -> np.ndarray:
    """(q - zp) * s per group, float64, with the codes compressed-tensors computes from (s, zp):
    q = clamp(round(x / s) + zp, -8, 7), the quotient and the sum each rounded to the weight dtype."""
    x = w.astype(np.float32).reshape(w.shape[0], -1, GROUP)
    s = scale[..., None]
    z = zp.astype(np.float32)[..., None]
    t = (x / s).astype(w.dtype).astype(np.float32)
    if not symmetric:
        t = (t + z).astype(w.dtype).astype(np.float32)
    q = np.clip(np.rint(t), -8, 7)
    return (q.astype(np.float64) - z) * s


def _group_errors(w: np.ndarray, scale: np.ndarray, zp: np.ndarray, symmetric: bool) -> np.ndarray:
    """The search's own objective per group: sum w_i e_i^2, w = x^2 (symmetric) or rms(G) + |x|."""
    x = w.astype(np.float64).reshape(w.shape[0], -1, GROUP)
    weight = x * x if symmetric else np.sqrt((x * x).mean(-1, keepdims=True)) + np.abs(x)
    return (weight * (_dequantized(w, scale, zp, symmetric) - x) ** 2).sum(-1)


def _check(w: np.ndarray, symmetric: bool) -> tuple[float, float]:
    """Asserts the format's invariants; returns (ours, RTN's) relative squared weight error."""
    scale, zp = _search(w, symmetric)
    rtn_scale, rtn_zp = _rtn(w, symmetric)
    assert np.all(scale > 0) and np.all(np.isfinite(scale))
    assert np.array_equal(scale, scale.astype(w.dtype).astype(np.float32))  # exact in the weight dtype
    if symmetric:
        assert np.all(zp == 0)
    else:
        assert np.all((zp >= -8) & (zp <= 7))
    ours, rtn = _group_errors(w, scale, zp, symmetric), _group_errors(w, rtn_scale, rtn_zp, symmetric)
    assert np.all(ours <= rtn * (1 + 1e-5) + 1e-30)  # never worse than RTN on its own objective
    assert np.mean(ours < rtn * (1 - 1e-3)) > 0.5  # and clearly better on most groups
    x = w.astype(np.float64)
    energy = (x**2).sum()
    err = ((_dequantized(w, scale, zp, symmetric).reshape(x.shape) - x) ** 2).sum() / energy
    err_rtn = ((_dequantized(w, rtn_scale, rtn_zp, symmetric).reshape(x.shape) - x) ** 2).sum() / energy
    return float(err), float(err_rtn)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_search_beats_rtn_per_group_and_stays_in_format(dtype: np.dtype, symmetric: bool) -> None:
    w = _weights(96, 512, 0, dtype)
    err, err_rtn = _check(w, symmetric)
    assert err < err_rtn  # lower plain squared weight error overall, too
    scale, zp = _search(w, symmetric)
    rtn_scale, rtn_zp = _rtn(w, symmetric)
    assert (scale[0, 0], zp[0, 0]) == (rtn_scale[0, 0], rtn_zp[0, 0])  # all zero: RTN's eps scale


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_search_beats_rtn_on_real_weights(symmetric: bool) -> None:
    tensors = load_file(str(smollm2_fp32() / "model.safetensors"))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.7.mlp.down_proj.weight"):
        for dtype in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
            err, err_rtn = _check(tensors[name].astype(dtype), symmetric)
            assert err < 0.97 * err_rtn, name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_a_non_finite_value_is_reported_by_its_index(dtype: np.dtype, symmetric: bool) -> None:
    for bad in (np.nan, np.inf, -np.inf):
        w = _weights(8, 256, 1, np.dtype(np.float32))
        w[5, 200] = bad
        w[6, 10] = np.nan  # a later one is not the one reported
        w = w.astype(dtype)
        scale = np.empty((8, 256 // GROUP), np.float32)
        zp = np.zeros(scale.shape, np.int8)
        x, mode = int4.kernel_input(w), int4.mode_of(w.dtype)
        assert int4_qkx2.search_qkx2(x, mode, GROUP, symmetric, scale, zp) == 5 * 256 + 200


def test_a_constant_group_and_tiny_values_keep_positive_exact_scales() -> None:
    w = np.zeros((4, 2 * GROUP), np.float32)
    w[0, :GROUP] = 0.5  # one value repeated: the fit is degenerate
    w[1, :GROUP] = -0.5
    w[2, :GROUP] = np.linspace(-1e-30, 1e-30, GROUP)  # near the bottom of float32's range
    w[3, GROUP:] = np.float32(3e4) * np.sin(np.arange(GROUP, dtype=np.float32))
    for dtype in DTYPES:
        v = w if dtype == np.float32 else w.astype(dtype)
        for symmetric in (True, False):
            scale, zp = _search(v, symmetric)
            assert np.all(scale > 0) and np.all(np.isfinite(scale)), (dtype, symmetric)
            assert np.array_equal(scale, scale.astype(dtype).astype(np.float32))
            assert np.all((zp >= -8) & (zp <= 7))
