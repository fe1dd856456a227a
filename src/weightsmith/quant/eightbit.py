"""8-bit weights: int8 and FP8 (E4M3) round-to-nearest over channels, groups or 2-D blocks.

Formula (compressed-tensors `calculate_qparams` and `_quantize` on CPU, as llm-compressor's
`model_free_ptq` runs them), per block B of the weight, every intermediate rounded to the weight
dtype as torch does (float32 arithmetic, one rounding back):

  scale = max(|x| over B) / H          (H = 127.5 for int8, 448 for FP8; a zero scale becomes eps)
  int8:  q = round_half_even(clamp(x / scale, -128, 127))
  FP8:   q = e4m3(clamp(x / scale, -448, 448))             (round to nearest, ties to even)

A block is one whole row (per channel), `group` consecutive columns of a row, or 128x128 rows x
columns (FP8_BLOCK; blocks past the weight's edge are partial, as compressed-tensors' zero padding
makes them). Dequantization is `q * scale`, rounded to the scale dtype. The kernel is numba's, one
compiled variant per (weight dtype, int or FP8), emulating torch's rounding with quant/floatbits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from numba import njit

from weightsmith.quant import FLOAT, INT
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
from weightsmith.quant.int4 import eps_of, from_stored_bits, kernel_input, mode_of, stored_bits

STORAGE = {INT: np.dtype(np.int8), FLOAT: np.dtype(ml_dtypes.float8_e4m3fn)}

#: Rows x columns of weight one scale covers; None columns: the whole row.
Block = tuple[int, int | None]


@scalar_helper
def e4m3(t: np.float32) -> np.uint8:
    """The float8_e4m3fn code of `t` in [-448, 448], rounded to nearest, ties to even, as torch casts.

    No branch, so that the element loop vectorises: both codes below are computed and one is kept.
    Normal (from 2**-6): round the float32 bits to 3 mantissa bits, ties to even, and rebias the
    exponent (127 -> 7: 120 * 8 off the exponent-and-mantissa field); |t| <= 448 never rounds past
    code 0x7E. Subnormal: adding 2**14 leaves a float32 whose last bit is worth 2**-9, E4M3's
    subnormal step, so the addition rounds |t| to it (ties to even) and the bits above 2**14's are
    the code. The sign bit is kept, so -0.0 is code 0x80 as in torch.
    """
    b = np.float32(t).view(np.uint32)
    mag = np.uint32(b & np.uint32(0x7FFFFFFF))
    field = (mag + np.uint32(0x7FFFF) + ((mag >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
    normal = np.uint32(field - np.uint32(120 * 8))  # wraps below 2**-6, where it is not kept
    sub = np.uint32(np.float32(mag.view(np.float32) + _TWO_POW_14).view(np.uint32) - _TWO_POW_14_BITS)
    code = normal if mag >= _MIN_NORMAL_BITS else sub
    return np.uint8(code | ((b >> np.uint32(24)) & np.uint32(0x80)))


_TWO_POW_14 = np.float32(2.0**14)
_TWO_POW_14_BITS = np.uint32(0x46800000)
_MIN_NORMAL_BITS = np.uint32(0x3C800000)  # 2**-6, E4M3's smallest normal


@scalar_helper
def _magnitude_bits(mode: int) -> np.uint32:
    """The bits of a stored element other than its sign."""
    return np.uint32(0x7FFFFFFF) if mode == MODE_F32 else np.uint32(0x7FFF)


@array_helper
def _max_magnitude(xr: np.ndarray, mode: int) -> np.uint32:
    """The largest magnitude in a 1-D run of stored elements, as bits (sign cleared).

    For floats the order of magnitudes is the order of their bits without the sign, so this is an
    integer maximum that vectorises; a NaN or Inf has the largest bits of all. (A 1-D view indexed
    from 0 matters: an offset index that might be negative keeps the loop from vectorising.)
    """
    m = np.uint32(0)
    for i in range(xr.size):
        m = max(m, np.uint32(stored_bits(mode, xr[i]) & _magnitude_bits(mode)))
    return m


@scalar_helper
def _code(mode: int, is_float: bool, raw: np.uint16 | np.float32, s: np.float32) -> np.uint8:
    """One stored element quantized with scale `s`: torch's `x / scale` in the weight dtype, clamped, cast."""
    if is_float:
        t = min(max(round_to(mode, decode(mode, raw) / s), np.float32(-448.0)), np.float32(448.0))
        return e4m3(t)
    t = min(max(round_to(mode, decode(mode, raw) / s), np.float32(-128.0)), np.float32(127.0))
    return np.uint8(np.int8(rint_small(t)))


@array_helper
def _quantize_rows(x: np.ndarray, mode: int, is_float: bool, br: int, bc: int, q: np.ndarray, scale: np.ndarray) -> int:
    """The kernel body; `mode` and `is_float` are compile-time constants in each caller.

    Per block of `br` rows: the maxima of all its column blocks, row by row in memory order; then
    the elements, along whole rows (one scale, or each element's from `srow`), so loops vectorise.
    """
    rows, cols = x.shape
    half = np.float32(448.0) if is_float else np.float32(127.5)
    inf = np.uint32(0x7F800000) if mode == MODE_F32 else np.uint32(0x7C00) if mode == MODE_F16 else np.uint32(0x7F80)
    blocks = scale.shape[1]
    maxima = np.empty(blocks, np.uint32)
    srow = np.empty(cols if blocks > 1 else 0, np.float32)
    for rb in range(scale.shape[0]):
        r0, r1 = rb * br, min(rows, rb * br + br)
        maxima[:] = 0
        for r in range(r0, r1):
            for cb in range(blocks):
                maxima[cb] = max(maxima[cb], _max_magnitude(x[r, cb * bc : min(cols, cb * bc + bc)], mode))
        if maxima.max() >= inf:  # report the first NaN or Inf in reading order
            for r in range(r0, r1):
                for c in range(cols):
                    if np.uint32(stored_bits(mode, x[r, c]) & _magnitude_bits(mode)) >= inf:
                        return int(r * cols + c)
        for cb in range(blocks):
            s = round_to(mode, from_stored_bits(mode, maxima[cb]) / half)
            if s == 0:
                s = eps_of(mode)
            scale[rb, cb] = s
            if blocks > 1:
                srow[cb * bc : min(cols, cb * bc + bc)] = s
        for r in range(r0, r1):
            xr, qr = x[r], q[r]
            if blocks == 1:
                s = scale[rb, 0]
                for c in range(cols):
                    qr[c] = _code(mode, is_float, xr[c], s)
            else:
                for c in range(cols):
                    qr[c] = _code(mode, is_float, xr[c], srow[c])
    return -1


def _specialise(mode: int, kind: str) -> Callable[..., int]:
    """One compiled kernel for one (dtype, kind): with both closure constants known at compile time the
    rounding branches vanish."""
    is_float = kind == FLOAT

    @njit(nogil=True, cache=True, error_model="numpy")
    def kernel(x: np.ndarray, br: int, bc: int, q: np.ndarray, scale: np.ndarray) -> int:
        return _quantize_rows(x, mode, is_float, br, bc, q, scale)

    return kernel


_KERNELS = {(mode, kind): _specialise(mode, kind) for mode in (MODE_BF16, MODE_F16, MODE_F32) for kind in (INT, FLOAT)}


def quantize_rows(
    x: np.ndarray, kind: str, block: Block, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Quantize rows of `x` (bf16, fp16 or fp32) whose first row starts a block of rows.

    Returns (q [rows, cols] int8 or float8_e4m3fn, scale float32 [row blocks, column blocks] with
    values exact in x's dtype, flat index of a NaN/Inf or -1). `out` (uint8 [rows, cols]) is where
    q goes, a reused buffer rather than fresh pages; a new array without it. Releases the GIL.
    """
    mode = mode_of(x.dtype)
    rows, cols = x.shape
    br, bc = block[0], block[1] or cols
    q = np.empty((rows, cols), np.uint8) if out is None else out
    scale = np.empty((-(-rows // br), -(-cols // bc)), np.float32)
    bad = _KERNELS[(mode, kind)](kernel_input(np.ascontiguousarray(x)), br, bc, q, scale)
    return q.view(STORAGE[kind]), scale, bad


@njit(nogil=True, cache=True, error_model="numpy")
def _fp8_with_scale(x: np.ndarray, mode: int, s: np.float32, q: np.ndarray) -> None:
    for r in range(x.shape[0]):
        xr, qr = x[r], q[r]
        for c in range(x.shape[1]):
            qr[c] = _code(mode, True, xr[c], s)


def fp8_rows_with_scale(x: np.ndarray, scale: np.float32, out: np.ndarray | None = None) -> np.ndarray:
    """FP8 (E4M3) codes of rows of `x` under one given scale (a per-tensor scale decided beforehand).

    The element formula is the kernel's above; the caller has already scanned `x` for NaN and Inf
    (a per-tensor scale needs the whole tensor's maximum first). Releases the GIL.
    """
    q = np.empty(x.shape, np.uint8) if out is None else out
    _fp8_with_scale(kernel_input(np.ascontiguousarray(x)), mode_of(x.dtype), np.float32(scale), q)
    return q.view(STORAGE[FLOAT])


def static_scale(amax: float, dtype: np.dtype, half: float = 448.0) -> np.float32:
    """compressed-tensors' symmetric per-tensor scale `amax / half`, as torch computes it in `dtype`.

    `amax` is first rounded to `dtype` (an observer's maximum is an element of the tensor it saw);
    the quotient is the float32 one rounded once to `dtype`, as torch divides bf16 and fp16 on
    CPU; a zero scale becomes `dtype`'s eps. Static FP8 weights and activations (half = 448) and
    FP8 KV-cache scales use it.
    """
    dt = np.dtype(dtype)
    a = np.float32(np.float32(amax).astype(dt))
    s = np.float32(np.float32(a / np.float32(half)).astype(dt))
    return s if s != 0 else np.float32(ml_dtypes.finfo(dt).eps)


def expand(scale: np.ndarray, shape: tuple[int, int], block: Block) -> np.ndarray:
    """Each weight element's scale (float32 [rows, cols]) from a scale per block."""
    rows, cols = shape
    br, bc = block[0], block[1] or cols
    s = np.asarray(scale, np.float32).reshape(-(-rows // br), -(-cols // bc))
    return np.repeat(np.repeat(s, br, axis=0)[:rows], bc, axis=1)[:, :cols]


@dataclass(frozen=True)
class EightBitWeight:
    """One quantized weight as compressed-tensors stores it (scale in the original weight dtype)."""

    q: np.ndarray  # int8 or float8_e4m3fn [out, in]
    scale: np.ndarray  # [out, 1], [out, in/group] or [ceil(out/128), ceil(in/128)]
    #: Integer zero points, one per scale, unpacked (asymmetric `pack-quantized`); None when symmetric.
    zero_point: np.ndarray | None = None


def dequantize(weight: EightBitWeight, block: Block) -> np.ndarray:
    """`(q - zp) * scale` in float32, rounded once to the scale dtype, as compressed-tensors' decompressor does."""
    q = np.asarray(weight.q).astype(np.float32)
    if weight.zero_point is not None:
        q = q - expand(weight.zero_point, q.shape, block)
    values: np.ndarray = (q * expand(weight.scale, q.shape, block)).astype(weight.scale.dtype)
    return values
