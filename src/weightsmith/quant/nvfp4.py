"""NVFP4 weight-only (NVFP4A16), compressed-tensors `nvfp4-pack-quantized`.

Formula (compressed-tensors `generate_gparam`, `calculate_qparams`, `_quantize`, `cast_to_fp4`, as
run by llm-compressor's `model_free_ptq` on CPU):

  global_scale = 448 * 6 / amax            amax over the tensor, or over its fused partners (q/k/v,
                                           gate/up), as reciprocal-then-multiply in the weight dtype
                                           (torch's `number / tensor`), stored float32
  block scale  = fp8_e4m3(global_scale * (amax16 / 6))    per 16 input columns; 0 becomes 0.125
  q            = fp4_e2m1(clamp(x / (block_scale / global_scale), -6, 6))    in float32

E2M1 rounding is to nearest, ties to even: 0, 0.5, 1, 1.5, 2, 3, 4, 6. Storage: `weight_packed` uint8,
element 2k in the low nibble, each nibble a sign bit (bit 3, set for a negative quotient, even one
that rounds to 0, but not for a quotient of -0.0: `cast_to_fp4` multiplies by `torch.sign`) and a
magnitude index; `weight_scale` float8_e4m3fn; `weight_global_scale` float32 [1], a divisor.
Dequantization: `q * (block_scale / global_scale)`.

`search=True` (our improvement, `--scale-search mse`) tries each block's FP8 scale code and the next
four larger codes, and keeps the one with the least squared error; it never clips a block harder
than RTN does. Same format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from numba import njit

from weightsmith.quant import NVFP4_GROUP, nvfp4_unsupported
from weightsmith.quant.floatbits import (
    MODE_BF16,
    MODE_F16,
    MODE_F32,
    array_helper,
    decode,
    rint_small,
    round_to,
    scalar_helper,
)
from weightsmith.quant.int4 import from_stored_bits, group_range, kernel_input, mode_of, stored_bits

GROUP = NVFP4_GROUP
FP4_MAX, FP8_MAX = 6.0, 448.0
FP8_EPS = 0.125  # torch.finfo(float8_e4m3fn).eps: what a zero block scale becomes
FP8_EPS_CODE = 0x20  # its float8_e4m3fn code (exponent field 4: 2**(4 - 7))
#: float32 value of every float8_e4m3fn code (NaN codes included, never produced).
FP8_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
#: Candidate block scale codes relative to RTN's: the same code and the next four larger ones (up to
#: about 1.5x, where the block maximum lands on 4 instead of 6, as in "Four Over Six"). Smaller codes
#: clip the block maximum: on SmolLM2 they lowered weight MSE but raised next-token KL (offsets -6..+1:
#: KL 0.262 against RTN's 0.225), while 0..+4 lowered both (docs/fidelity-smollm2.md).
SEARCH_STEPS = 5


@scalar_helper
def fp8_code(v: np.float32) -> np.int64:
    """The float8_e4m3fn code of a value in [0, 448], rounded to nearest, ties to even."""
    if v < np.float32(2.0**-6):  # subnormal: a multiple of 2**-9
        return np.int64(np.rint(v * np.float32(512.0)))
    b = np.float32(v).view(np.uint32)
    b = np.uint32((b + np.uint32(0x7FFFF) + ((b >> np.uint32(20)) & np.uint32(1))) & np.uint32(0xFFF00000))
    exp = np.int64((b >> np.uint32(23)) & np.uint32(0xFF)) - 127
    mant = np.int64((b >> np.uint32(20)) & np.uint32(0x7))
    return min((exp + 7) * 8 + mant, np.int64(0x7E))


@scalar_helper
def fp4_index(t: np.float32) -> np.int32:
    """Magnitude index (0..7) of |t| rounded to E2M1, ties to even, with compressed-tensors' thresholds.

    The thresholds rise, so the index is how many of them |t| passes: a sum of comparisons with no
    branch, which vectorises (<= 0.25 -> 0, < 0.75 -> 1, <= 1.25 -> 2, < 1.75 -> 3, <= 2.5 -> 4,
    < 3.5 -> 5, <= 5 -> 6, else 7).
    """
    a = abs(t)
    return (
        np.int32(a > np.float32(0.25))
        + np.int32(a >= np.float32(0.75))
        + np.int32(a > np.float32(1.25))
        + np.int32(a >= np.float32(1.75))
        + np.int32(a > np.float32(2.5))
        + np.int32(a >= np.float32(3.5))
        + np.int32(a > np.float32(5.0))
    )


@scalar_helper
def e2m1_value(index: np.int32) -> np.float32:
    """E2M1[index] as arithmetic: 0.5 * index up to 2, then 3, 4, 6."""
    f = np.float32(index)
    if index <= 4:
        return f * np.float32(0.5)
    return f - np.float32(2.0) + np.float32(index == 7)


@scalar_helper
def fp4_nibble(t: np.float32) -> np.uint32:
    """The stored nibble of a clamped quotient: magnitude index, and bit 3 if it is below zero.

    compressed-tensors rounds `|t| * sign(t)`: a small negative quotient becomes -0 (bit 3 set),
    but -0.0 itself (a weight stored as -0.0) has sign 0 and becomes +0.
    """
    sign = np.uint32(t < np.float32(0.0))
    return np.uint32(fp4_index(t)) | np.uint32(sign << np.uint32(3))


@scalar_helper
def e2m1_magnitude(t: np.float32) -> np.float32:
    """`e2m1_value(fp4_index(t))` for |t| <= 6 in a few float operations: E2M1 values are a grid of
    step 0.5 below 2, 1 up to 4 and 2 up to 6, so |t| rounds to its step's multiple, half to even,
    and each of `fp4_index`'s ties (0.25, 0.75, ... 5) falls on the same side as that rounding
    (tests/schemes/test_nvfp4.py checks every float32 in [0, 6]). Steps are powers of two, so the scaling
    is exact; no table, no integer lanes, so the loop over it vectorises at the full float width."""
    a = abs(t)
    step = np.float32(0.5) if a < np.float32(2.0) else (np.float32(1.0) if a < np.float32(4.0) else np.float32(2.0))
    inv = np.float32(2.0) if a < np.float32(2.0) else (np.float32(1.0) if a < np.float32(4.0) else np.float32(0.5))
    return rint_small(a * inv) * step


@scalar_helper
def magnitude_bits(mode: int) -> tuple[np.uint32, np.uint32]:
    """(mask of a stored element's magnitude bits, the magnitude bits of Inf) of the dtype."""
    if mode == MODE_F32:
        return np.uint32(0x7FFFFFFF), np.uint32(0x7F800000)
    if mode == MODE_F16:
        return np.uint32(0x7FFF), np.uint32(0x7C00)
    return np.uint32(0x7FFF), np.uint32(0x7F80)


@array_helper
def first_non_finite(x: np.ndarray, r: int, c0: int, mode: int) -> int:
    """Column (from c0) of the first NaN or Inf in a group known to hold one."""
    magnitude, inf = magnitude_bits(mode)
    i = 0
    while np.uint32(stored_bits(mode, x[r, c0 + i]) & magnitude) < inf:
        i += 1
    return i


@array_helper
def _quantize_rows(
    x: np.ndarray,
    mode: int,
    search: bool,
    global_scale: np.float32,
    fp8_values: np.ndarray,
    packed: np.ndarray,
    scale_codes: np.ndarray,
) -> int:
    """The kernel body; `mode` and `search` are compile-time constants in each caller.

    Row by row: every group's RTN scale code first; with `search`, the squared error of each
    candidate code for all of the row's groups at once, from the row's values transposed (element
    i of every group side by side), so the loops run across groups in vector lanes while each
    group's error is still summed in element order, as a scalar loop sums it (the same floats,
    the same choice); then the row is encoded with each group's chosen code.
    """
    rows, cols = x.shape
    groups = cols // GROUP
    magnitude, inf = magnitude_bits(mode)
    gs = np.float32(global_scale)
    six = np.float32(FP4_MAX)
    code = np.empty(groups, np.int64)
    best = np.empty(groups, np.int64)
    best_err = np.empty(groups, np.float32)
    err = np.empty(groups, np.float32)
    eff = np.empty(groups, np.float32)
    vt = np.empty((GROUP, groups), np.float32)
    eff_col = np.empty(cols, np.float32)  # each column's group's scale divisor
    nibbles = np.empty(cols, np.uint8)
    for r in range(rows):
        for g in range(groups):
            top = np.uint32(0)  # the group's largest magnitude, as bits: their order is the values' order
            for i in range(GROUP):
                top = max(top, np.uint32(stored_bits(mode, x[r, g * GROUP + i]) & magnitude))
            if top >= inf:
                return int(r * cols + g * GROUP + first_non_finite(x, r, g * GROUP, mode))
            local = round_to(mode, from_stored_bits(mode, top) / six)
            code[g] = fp8_code(min(gs * local, np.float32(FP8_MAX)))
            best[g] = code[g]
        if search:
            for i in range(GROUP):
                for g in range(groups):
                    vt[i, g] = decode(mode, x[r, g * GROUP + i])
            best_err[:] = np.float32(np.inf)
            for k in range(SEARCH_STEPS):
                for g in range(groups):
                    eff[g] = fp8_values[min(code[g] + k, np.int64(0x7E))] / gs
                    err[g] = np.float32(0.0)
                for i in range(GROUP):
                    for g in range(groups):
                        t = min(max(vt[i, g] / eff[g], -six), six)
                        m = e2m1_magnitude(t)
                        d = (m if t >= 0 else -m) * eff[g] - vt[i, g]
                        err[g] += d * d
                for g in range(groups):
                    c = code[g] + k
                    if c >= 1 and c <= 0x7E and err[g] < best_err[g]:
                        best_err[g] = err[g]
                        best[g] = c
        for g in range(groups):
            c = best[g] if best[g] != 0 else np.int64(FP8_EPS_CODE)
            scale_codes[r, g] = np.uint8(c)
            e = fp8_values[c] / gs
            for i in range(GROUP):
                eff_col[g * GROUP + i] = e
        for c in range(cols):
            nibbles[c] = np.uint8(fp4_nibble(min(max(decode(mode, x[r, c]) / eff_col[c], -six), six)))
        for j in range(cols // 2):
            packed[r, j] = nibbles[2 * j] | (nibbles[2 * j + 1] << np.uint8(4))
    return -1


def _specialise(mode: int, search: bool) -> Callable[..., int]:
    """One compiled kernel for one (dtype, search), as in int4.py: closure constants, known at compile
    time, let the loops vectorise."""

    @njit(nogil=True, cache=True, error_model="numpy")
    def kernel(
        x: np.ndarray, gs: np.float32, fp8_values: np.ndarray, packed: np.ndarray, scale_codes: np.ndarray
    ) -> int:
        return _quantize_rows(x, mode, search, gs, fp8_values, packed, scale_codes)

    return kernel


#: By (mode, search).
_KERNELS = {
    (mode, search): _specialise(mode, search) for mode in (MODE_BF16, MODE_F16, MODE_F32) for search in (False, True)
}


def global_scale(amax: float, mode: int) -> np.float32:
    """448 * 6 / amax as compressed-tensors computes it in the weight dtype; 1.0 if not finite.

    torch evaluates `number / tensor` as `reciprocal(tensor) * number`, each rounded to the dtype,
    so the quotient is not the correctly rounded one (bf16: 2688 / 0.60546875 gives 4416, not 4448).
    """
    with np.errstate(divide="ignore", over="ignore"):
        a = max(np.float32(amax), np.float32(np.finfo(np.float32).tiny))
        gs = _reciprocal_times(a, np.float32(FP8_MAX * FP4_MAX), mode)
    return np.float32(gs) if np.isfinite(gs) else np.float32(1.0)


@njit(nogil=True, cache=True)
def _reciprocal_times(a: np.float32, k: np.float32, mode: int) -> np.float32:
    return round_to(mode, round_to(mode, np.float32(1.0) / a) * k)


@njit(nogil=True, cache=True)
def _amax_rows(x: np.ndarray, mode: int) -> tuple[np.float32, int]:
    rows, cols = x.shape
    amax = np.float32(0.0)
    for r in range(rows):
        lo, hi, bad = group_range(x, r, 0, cols, mode)
        if bad >= 0:
            return np.float32(np.nan), r * cols + bad
        amax = max(amax, max(-lo, hi))
    return amax, -1


def amax_rows(x: np.ndarray, mode: int) -> tuple[float, int]:
    """Largest magnitude of rows of `x`, and the flat index of a NaN/Inf (-1 if none)."""
    amax, bad = _amax_rows(x, mode)
    return float(amax), int(bad)


def quantize_rows(
    x: np.ndarray, mode: int, gs: np.float32, search: bool, packed: np.ndarray, scale_codes: np.ndarray
) -> int:
    """Quantize rows (bf16/fp16 bits as uint16, or float32) given the tensor's global scale.

    packed: uint8 [rows, cols/2]; scale_codes: uint8 [rows, cols/16] (float8_e4m3fn bits).
    Releases the GIL. Returns the flat index of the first NaN/Inf element, or -1.
    """
    return int(_KERNELS[(mode, bool(search))](x, gs, FP8_VALUES, packed, scale_codes))


@dataclass(frozen=True)
class Nvfp4Weight:
    """One quantized weight as stored on disk."""

    packed: np.ndarray  # uint8 [out, in/2]
    scale: np.ndarray  # float8_e4m3fn [out, in/16]
    global_scale: np.ndarray  # float32 [1]


def quantize(w: np.ndarray, gs: np.float32 | None = None, search: bool = False) -> Nvfp4Weight:
    """Quantize a whole 2-D weight; `gs` defaults to the tensor's own global scale."""
    mode = mode_of(w.dtype)
    rows, cols = w.shape
    why = nvfp4_unsupported(cols)
    if why:
        raise ValueError(why)
    x = kernel_input(np.ascontiguousarray(w))
    if gs is None:
        amax, bad = amax_rows(x, mode)
        if bad >= 0:
            raise ValueError(f"non-finite value at row {bad // cols}, column {bad % cols}")
        gs = global_scale(amax, mode)
    packed = np.empty((rows, cols // 2), np.uint8)
    codes = np.empty((rows, cols // GROUP), np.uint8)
    bad = quantize_rows(x, mode, gs, search, packed, codes)
    if bad >= 0:
        raise ValueError(f"non-finite value at row {bad // cols}, column {bad % cols}")
    return Nvfp4Weight(packed, codes.view(ml_dtypes.float8_e4m3fn), np.array([gs], np.float32))


def dequantize(
    values: np.ndarray, scale: np.ndarray, global_scale: np.ndarray, dtype: np.dtype | type = ml_dtypes.bfloat16
) -> np.ndarray:
    """`q * (block_scale / global_scale)` in float32, cast to `dtype` (BF16, as compressed-tensors unpacks).

    `values`: the E2M1 values (float32), as the format unpacks its bytes (`Nvfp4PackQuantized.unpack`).
    """
    eff = scale.astype(np.float32) / global_scale.astype(np.float32)[0]
    cast: np.ndarray = (values * np.repeat(eff, GROUP, axis=1)).astype(dtype)
    return cast
