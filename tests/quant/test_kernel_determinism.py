"""The scale searches' kernels give the same bits on any CPU and from any compile, and their sums
kept in lanes (`quant.lanes`) are the sums.

The default recipe's SINQ column scales (`quant.sinkhorn`) and clipping search (`quant.int4_search`),
and the hqq and qkx2 searches, are computed twice: in this process (this CPU's widest vectors, kernels
from numba's cache or compiled now) and in a child compiled afresh for x86-64's baseline
(`NUMBA_CPU_NAME=generic`: SSE2, four float32 lanes, no FMA). A sum the compiler may reorder to
vectorise (fastmath "reassoc") or fuse ("contract") differs between the two, as it did between a fresh
compile and a cached one; every sum written in one order agrees to the bit.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from weightsmith.quant import int4_hqq, int4_qkx2, int4_search, sinkhorn
from weightsmith.quant.floatbits import MODE_BF16, MODE_F32
from weightsmith.quant.lanes import LANES


def _weights(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Weight-like BF16: heavy-tailed, uneven rows and columns."""
    w = rng.standard_t(5, (rows, cols)) * np.exp(0.5 * rng.standard_normal(rows))[:, None]
    w *= np.exp(rng.standard_normal(cols))[None, :]
    return (0.02 * w).astype(ml_dtypes.bfloat16)


def results() -> dict[str, np.ndarray]:
    """Every output compared: column scales, chosen factors and the candidates' summed errors."""
    rng = np.random.default_rng(7)
    up, gate = _weights(rng, 384, 256), _weights(rng, 320, 256)
    factor = np.exp(0.3 * rng.standard_normal(320)).astype(np.float32)
    out = {
        "sinkhorn_bf16": sinkhorn.column_scales([sinkhorn.Rows(up), sinkhorn.Rows(gate, factor)], 128),
        "sinkhorn_f32": sinkhorn.column_scales(up.astype(np.float32)[:, :192], 64, workers=2),
    }
    bits = np.ascontiguousarray(up).view(np.uint16)
    for name, symmetric, objective in (("wmse", False, int4_search.MAGNITUDE), ("mse", True, int4_search.POWER25)):
        shrink = np.empty((bits.shape[0], bits.shape[1] // 128), np.float32)
        assert int4_search.search_mse(bits, MODE_BF16, 128, shrink, symmetric, objective) == -1
        out[f"{name}_factors"] = shrink
        values = up.astype(np.float32)
        scale = np.abs(values).reshape(-1, 128).max(axis=1) / np.float32(7.5)
        errors = np.empty((len(scale), LANES), np.float32)
        odd = np.empty(LANES, np.float32)
        factors = np.linspace(0.8, 1.1, LANES, dtype=np.float32)
        for g, vals in enumerate(values.reshape(-1, 128)):
            s = (scale[g] * factors).astype(np.float32)
            zp = np.zeros(LANES, np.float32) if symmetric else np.full(LANES, 0.5, np.float32)
            int4_search._score(objective, vals, s, (1 / s).astype(np.float32), zp, errors[g], odd)
        out[f"{name}_errors"] = errors
    for name, search in (("hqq", int4_hqq.search_hqq), ("qkx2", int4_qkx2.search_qkx2)):
        scale = np.empty((bits.shape[0], bits.shape[1] // 64), np.float32)
        zero_point = np.empty(scale.shape, np.int8)
        assert search(bits, MODE_BF16, 64, False, scale, zero_point) == -1
        out[f"{name}_scales"], out[f"{name}_zero_points"] = scale, zero_point.astype(np.float32)
    return out


def test_same_bits_compiled_for_another_cpu(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CPU_FEATURES="", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    child = tmp_path / "generic.pickle"
    subprocess.run([sys.executable, __file__, str(child)], env=env, check=True, timeout=600)
    theirs = pickle.loads(child.read_bytes())  # written by our own child just now
    ours = results()
    assert sorted(theirs) == sorted(ours)
    differ = {}
    for name, mine in ours.items():
        assert mine.size and np.isfinite(mine).all(), name
        differ[name] = int(np.count_nonzero(mine.view(np.uint32) != theirs[name].view(np.uint32)))
    assert not any(differ.values()), f"values whose bits differ, of each output: {differ}"


@pytest.mark.parametrize("group", [24, 128])  # 24: a tail of 8 values past the last whole 16 lanes
def test_lane_sums_are_the_sums(group: int) -> None:
    """Each kernel's sums kept in lanes equal the float64 sums of the same float32 terms."""
    rng = np.random.default_rng(group)
    vals = (0.02 * rng.standard_t(5, group)).astype(np.float32)
    s, zp, beta = np.float32(np.abs(vals).max() / 7.5), np.float32(-1.0), np.float32(10.0)
    q = np.rint(np.clip(vals / s + zp, -8, 7)).astype(np.float32)
    u = (q - zp).astype(np.float32)
    d = np.abs(vals - u * s).astype(np.float64)
    sums = np.empty((int4_hqq.SUMS, LANES), np.float32)
    np.testing.assert_allclose(int4_hqq._lp_error(MODE_F32, False, vals, s, zp, sums), (d**int4_hqq.P).sum(), rtol=1e-4)
    l1, z_next = int4_hqq._zero_round(vals, s, zp, beta, sums)  # residuals far below the shrink's bound
    np.testing.assert_allclose(l1, d.mean(), rtol=1e-5)
    np.testing.assert_allclose(z_next, (q - vals * (1 / s)).astype(np.float64).mean(), rtol=1e-5, atol=1e-6)
    l1, step = int4_hqq._scale_round(vals, s, zp, beta, sums)
    np.testing.assert_allclose(step, (vals * u).astype(np.float64).sum() / (u.astype(np.float64) ** 2).sum(), rtol=1e-5)

    w = (np.abs(vals) + 0.01).astype(np.float32)
    want = [(w * (u * s - vals) ** 2).sum(), (w * u * vals).sum(), (w * u * u).sum()]
    qkx2_sums = np.empty((int4_qkx2.SUMS, LANES), np.float32)
    np.testing.assert_allclose(int4_qkx2._score(MODE_F32, False, vals, w, s, zp, qkx2_sums), want, rtol=1e-5)
    moments = int4_qkx2._weights(False, vals, w, qkx2_sums)
    x = vals.astype(np.float64)
    rms = np.sqrt((x * x).mean())
    np.testing.assert_allclose(w, (rms + np.abs(x)).astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(
        moments, [(rms + np.abs(x)).sum(), ((rms + np.abs(x)) * x).sum(), ((rms + np.abs(x)) * x * x).sum()], rtol=1e-5
    )

    scales = (s * np.linspace(0.8, 1.1, LANES)).astype(np.float32)
    even, odd = np.empty(LANES, np.float32), np.empty(LANES, np.float32)
    zps = np.full(LANES, zp, np.float32)
    int4_search._score(int4_search.MAGNITUDE, vals, scales, (1 / scales).astype(np.float32), zps, even, odd)
    for k, sk in enumerate(scales):
        e = (np.rint(np.clip(vals * (1 / sk) + zp, -8, 7)) - zp) * sk - vals
        np.testing.assert_allclose(even[k], (np.abs(x) * e.astype(np.float64) ** 2).sum(), rtol=1e-5)


if __name__ == "__main__":  # the child: this file run as a script
    Path(sys.argv[1]).write_bytes(pickle.dumps(results()))
