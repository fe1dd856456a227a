"""The branch-free E4M3 encoder against torch's `.to(torch.float8_e4m3fn)`, on the values that decide it.

(Checked once over every float32 in [-448, 448]: no difference. That takes seconds, so the suite
keeps the cases where an encoder goes wrong: every bf16 and fp16 value, each E4M3 value and each
midpoint between neighbours give or take a few ulps, and random float32 bit patterns.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from weightsmith.quant.eightbit import e4m3

torch = pytest.importorskip("torch")

FP8_MAX = np.float32(448.0)


@njit(nogil=True, cache=False)
def _encode(values: np.ndarray, out: np.ndarray) -> None:
    for i in range(values.size):
        out[i] = e4m3(values[i])


def _in_range(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, np.float32).ravel()
    return v[np.isfinite(v) & (np.abs(v) <= FP8_MAX)]


def _assert_matches_torch(values: np.ndarray) -> None:
    v = np.concatenate([values, -values])
    ours = np.empty(v.size, np.uint8)
    _encode(v, ours)
    theirs = torch.from_numpy(v).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    wrong = np.flatnonzero(ours != theirs)
    assert wrong.size == 0, [(float(v[i]), hex(ours[i]), hex(theirs[i])) for i in wrong[:5]]


def test_every_16_bit_float() -> None:
    every = np.arange(1 << 16, dtype=np.uint16)
    _assert_matches_torch(_in_range(every.view(ml_dtypes.bfloat16)))
    _assert_matches_torch(_in_range(every.view(np.float16)))


def test_codes_midpoints_and_their_neighbours() -> None:
    codes = np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)  # 0 .. 448
    mids = (codes[:-1].astype(np.float64) + codes[1:]) / 2  # exact in float32: ties to even
    points = np.concatenate([codes, mids.astype(np.float32), [2.0**-6, 2.0**-9, 2.0**-10, 464.0]]).astype(np.float32)
    bits = points.view(np.uint32).astype(np.int64)[:, None] + np.arange(-4, 5)
    _assert_matches_torch(_in_range(np.clip(bits, 0, None).astype(np.uint32).view(np.float32)))


def test_random_float32() -> None:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 0x43E00001, 1 << 20, dtype=np.uint32)  # every magnitude up to 448, evenly by bits
    _assert_matches_torch(bits.view(np.float32))
