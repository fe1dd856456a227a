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

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from numba import njit

from weightsmith.quant.floatbits import MODE_BF16, MODE_F16, MODE_F32, decode, rint_small, round_to
from weightsmith.quant.int4 import eps_of, group_range, kernel_input, mode_of

INT, FLOAT = "int", "float"
STORAGE = {INT: np.dtype(np.int8), FLOAT: np.dtype(ml_dtypes.float8_e4m3fn)}

#: Rows x columns of weight one scale covers; None columns: the whole row.
Block = tuple[int, int | None]


@njit(inline="always", nogil=True)
def e4m3(t: np.float32) -> np.uint8:
    """The float8_e4m3fn code of `t` in [-448, 448], rounded to nearest, ties to even, as torch casts.

    No branch, so that the element loop vectorises: both the normal and the subnormal code are
    computed and one is selected. Normal: round the float32 bits to 3 mantissa bits (ties to even)
    and rebias the exponent (127 -> 7, hence 120 * 8 off the exponent-and-mantissa field).
    Subnormal (below 2**-6): a multiple of 2**-9, rounded half to even by `rint_small`. The sign
    bit is kept, so -0.0 is code 0x80 as in torch.
    """
    b = np.float32(t).view(np.uint32)
    mag = np.uint32(b & np.uint32(0x7FFFFFFF))
    field = np.uint32((mag + np.uint32(0x7FFFF) + ((mag >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20))
    normal = min(np.uint32(field - np.uint32(120 * 8)), np.uint32(0x7E))  # wraps below 2**-6: not selected
    a = mag.view(np.float32)
    sub = np.uint32(np.int32(rint_small(a * np.float32(512.0))))
    code = sub if a < np.float32(2.0**-6) else normal
    return np.uint8(code | ((b >> np.uint32(24)) & np.uint32(0x80)))


@njit(inline="always", nogil=True)
def _quantize_rows(x, mode, is_float, br, bc, q, scale):
    """The kernel body; `mode` and `is_float` are compile-time constants in each caller."""
    rows, cols = x.shape
    half = np.float32(448.0) if is_float else np.float32(127.5)
    qmin = np.float32(-448.0) if is_float else np.float32(-128.0)
    qmax = np.float32(448.0) if is_float else np.float32(127.0)
    for rb in range(scale.shape[0]):
        r0, r1 = rb * br, min(rows, rb * br + br)
        for cb in range(scale.shape[1]):
            c0, c1 = cb * bc, min(cols, cb * bc + bc)
            amax = np.float32(0.0)
            for r in range(r0, r1):
                lo, hi, bad = group_range(x, r, c0, c1 - c0, mode)
                if bad >= 0:
                    return r * cols + bad
                amax = max(amax, -lo, hi)
            s = round_to(mode, amax / half)
            if s == 0:
                s = eps_of(mode)
            scale[rb, cb] = s
            for r in range(r0, r1):
                xr, qr = x[r, c0:c1], q[r, c0:c1]  # 1-D views: the element loop vectorises
                for c in range(c1 - c0):
                    t = min(max(round_to(mode, decode(mode, xr[c]) / s), qmin), qmax)
                    qr[c] = e4m3(t) if is_float else np.uint8(np.int8(rint_small(t)))
    return -1


# One compiled kernel per (dtype, kind): with both known at compile time the rounding branches vanish.
@njit(nogil=True, cache=True, error_model="numpy")
def _bf16_int(x, br, bc, q, scale):
    return _quantize_rows(x, MODE_BF16, False, br, bc, q, scale)


@njit(nogil=True, cache=True, error_model="numpy")
def _bf16_float(x, br, bc, q, scale):
    return _quantize_rows(x, MODE_BF16, True, br, bc, q, scale)


@njit(nogil=True, cache=True, error_model="numpy")
def _f16_int(x, br, bc, q, scale):
    return _quantize_rows(x, MODE_F16, False, br, bc, q, scale)


@njit(nogil=True, cache=True, error_model="numpy")
def _f16_float(x, br, bc, q, scale):
    return _quantize_rows(x, MODE_F16, True, br, bc, q, scale)


@njit(nogil=True, cache=True, error_model="numpy")
def _f32_int(x, br, bc, q, scale):
    return _quantize_rows(x, MODE_F32, False, br, bc, q, scale)


@njit(nogil=True, cache=True, error_model="numpy")
def _f32_float(x, br, bc, q, scale):
    return _quantize_rows(x, MODE_F32, True, br, bc, q, scale)


_KERNELS = {
    (MODE_BF16, INT): _bf16_int,
    (MODE_BF16, FLOAT): _bf16_float,
    (MODE_F16, INT): _f16_int,
    (MODE_F16, FLOAT): _f16_float,
    (MODE_F32, INT): _f32_int,
    (MODE_F32, FLOAT): _f32_float,
}


def quantize_rows(x: np.ndarray, kind: str, block: Block) -> tuple[np.ndarray, np.ndarray, int]:
    """Quantize rows of `x` (bf16, fp16 or fp32) whose first row starts a block of rows.

    Returns (q [rows, cols] int8 or float8_e4m3fn, scale float32 [row blocks, column blocks] with
    values exact in x's dtype, flat index of a NaN/Inf or -1). Releases the GIL.
    """
    mode = mode_of(x.dtype)
    rows, cols = x.shape
    br, bc = block[0], block[1] or cols
    q = np.empty((rows, cols), np.uint8)
    scale = np.empty((-(-rows // br), -(-cols // bc)), np.float32)
    bad = _KERNELS[(mode, kind)](kernel_input(np.ascontiguousarray(x)), br, bc, q, scale)
    return q.view(STORAGE[kind]), scale, bad


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


def dequantize(weight: EightBitWeight, block: Block) -> np.ndarray:
    """`q * scale` in float32, rounded once to the scale dtype, as compressed-tensors' decompressor does."""
    q = np.asarray(weight.q).astype(np.float32)
    return (q * expand(weight.scale, q.shape, block)).astype(weight.scale.dtype)
