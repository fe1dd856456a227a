"""MX (OCP microscaling) weights: FP4 (E2M1) or FP8 (E4M3) elements in groups of 32 sharing a power of two.

compressed-tensors `mxfp4-pack-quantized` (MXFP4A16, MXFP4) and `mxfp8-quantized` (MXFP8A16, MXFP8).
Formula (compressed-tensors `calculate_qparams` -> `generate_mx_scales`, `_quantize`,
`compress_mx_scale`, as llm-compressor's `model_free_ptq` runs them on CPU, all in the weight dtype):

  amax   = max |x| over 32 input columns
  p2     = amax with its mantissa rounded to a power of two: the float's bits plus half of the
           mantissa's top bit-but-one (bf16: +32), then masked to sign and exponent; amax >= 1.75 * 2**k
           goes up to 2**(k+1), a subnormal amax drops to 0 unless the carry reaches 2**-126
  e      = clamp(127 + floor(log2 p2) - offset, 0, 255)     offset floor(log2 max): FP4 2 (max 6),
                                                            FP8 8 (max 448); p2 = 0 gives e = 0
  scale  = 2**(e - 127) in the weight dtype (0 after fp16 underflow becomes 1, uint8's "eps")
  q      = fp4_e2m1(clamp(x / scale, -6, 6))  or  fp8_e4m3(clamp(x / scale, -448, 448))

Storage: the scale as its biased exponent `127 + floor(log2 scale)` (uint8; an infinite scale,
from an amax of at least 1.75 * 2**127, is written as 127: torch converts inf to int32 as
INT_MIN). FP4 codes pack two to a byte as NVFP4's do (quant/nvfp4.py); FP8 codes are float8_e4m3fn.
Dequantization: `q * 2**(byte - 127)`.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
from numba import njit

from weightsmith.quant import MX_GROUP, mx_unsupported
from weightsmith.quant.eightbit import e4m3
from weightsmith.quant.floatbits import (
    MODE_BF16,
    MODE_F16,
    MODE_F32,
    array_helper,
    decode,
    f16_round,
    round_to,
    scalar_helper,
)
from weightsmith.quant.int4 import kernel_input, mode_of
from weightsmith.quant.nvfp4 import FP4_MAX, FP8_MAX, fp4_nibble

GROUP = MX_GROUP
#: floor(log2(largest element)) per element width: what maps a group's amax into range.
OFFSET_FP4, OFFSET_FP8 = 2, 8
#: What compress_mx_scale stores for an infinite scale (torch's inf -> int32 is INT_MIN; + 127, low byte).
INF_SCALE_BYTE = 127
_MAGNITUDE, _INF_BITS = np.uint32(0x7FFFFFFF), np.uint32(0x7F800000)


@scalar_helper
def biased_exponent(amax: np.float32, mode: int) -> np.int64:
    """127 + floor(log2(compressed-tensors' `round_to_power_2`(amax))): -1 for 0, 255 for inf.

    `amax` is non-negative and exact in the weight dtype. On float32 bits, adding 2**21 and masking
    the mantissa is bf16's `+32` and fp32's `+2**21` alike (a bf16 value has no low bits). fp16
    differs at both ends of its narrow range: its bits get 2**8 added.
    """
    if mode == MODE_F16 and amax < np.float32(2.0**-14):  # subnormal m * 2**-24: carries at m >= 768
        return np.int64(127 - 14) if amax >= np.float32(0.75 * 2.0**-14) else np.int64(-1)
    if mode == MODE_F16 and amax >= np.float32(1.75 * 2.0**15):  # the carry leaves fp16's range
        return np.int64(255)
    b = np.uint32((np.float32(amax).view(np.uint32) + np.uint32(1 << 21)) >> np.uint32(23))
    return np.int64(b) if b > 0 else np.int64(-1)


@scalar_helper
def group_scale(amax: np.float32, mode: int, offset: int) -> np.float32:
    """The divisor compressed-tensors quantizes a group with: 2**(e - 127) in the weight dtype."""
    k = biased_exponent(amax, mode)
    e = np.int64(0) if k < 0 else (np.int64(255) if k == 255 else np.int64(min(max(int(k) - offset, 0), 255)))
    # e << 23 is 2**(e - 127) for 1 <= e <= 254 and inf for 255; e = 0 is the subnormal 2**-127
    s = np.uint32((e << 23) if e > 0 else (1 << 22)).view(np.float32)
    if mode == MODE_F16:
        s = np.float32(np.inf) if s >= np.float32(2.0**16) else f16_round(s)
    return s if s != 0 else np.float32(1.0)


@scalar_helper
def scale_byte(s: np.float32) -> np.uint8:
    """`compress_mx_scale` of a group scale: 127 + floor(log2 s), a power of two, inf as torch writes it."""
    if s == np.inf:
        return np.uint8(INF_SCALE_BYTE)
    return np.uint8(np.float32(s).view(np.uint32) >> np.uint32(23))


@array_helper
def _quantize_rows(x: np.ndarray, mode: int, bits: int, out: np.ndarray, scale_bytes: np.ndarray) -> int:
    """The kernel body; `mode` and `bits` are compile-time constants in each caller.

    Per row: the row decoded to float32; each group's amax as an integer maximum of its magnitude
    bits (the order of finite floats' magnitudes is that of their bits; NaN and Inf have the
    largest), its scale, and its reciprocal spread over the group's columns; then the codes along
    the whole row. Long branch-free loops over a row vectorise; loops of 32 with a per-element
    branch (FP8's subnormal case) did not.
    """
    rows, cols = x.shape
    vals = np.empty(cols, np.float32)
    mags = vals.view(np.uint32)
    inv = np.empty(cols, np.float32)  # each column's 1 / scale
    offset = OFFSET_FP4 if bits == 4 else OFFSET_FP8
    top = np.float32(FP4_MAX if bits == 4 else FP8_MAX)
    for r in range(rows):
        xr, outr = x[r], out[r]
        for c in range(cols):
            vals[c] = decode(mode, xr[c])
        for g in range(cols // GROUP):
            c0 = g * GROUP
            group = mags[c0 : c0 + GROUP]  # a view indexed from 0: an offset index keeps the loop from vectorising
            m = np.uint32(0)
            for i in range(group.size):
                m = max(m, np.uint32(group[i] & _MAGNITUDE))
            if m >= _INF_BITS:
                for i in range(GROUP):
                    if np.uint32(mags[c0 + i] & _MAGNITUDE) >= _INF_BITS:
                        return int(r * cols + c0 + i)
            s = group_scale(np.uint32(m).view(np.float32), mode, offset)
            scale_bytes[r, g] = scale_byte(s)
            inv[c0 : c0 + GROUP] = np.float32(1.0) / s  # a power of two (0 for an infinite scale): x * inv is x / s
        if bits == 4:
            for k in range(cols // 2):
                lo = fp4_nibble(min(max(round_to(mode, vals[2 * k] * inv[2 * k]), -top), top))
                hi = fp4_nibble(min(max(round_to(mode, vals[2 * k + 1] * inv[2 * k + 1]), -top), top))
                outr[k] = np.uint8(lo | (hi << np.uint32(4)))
        else:
            for c in range(cols):
                outr[c] = e4m3(min(max(round_to(mode, vals[c] * inv[c]), -top), top))
    return -1


def _specialise(mode: int, bits: int) -> Callable[..., int]:
    """One compiled kernel for one (dtype, element width): with both closure constants known at compile
    time the rounding branches vanish and the element loops vectorise."""

    @njit(nogil=True, cache=True, error_model="numpy")
    def kernel(x: np.ndarray, out: np.ndarray, scale_bytes: np.ndarray) -> int:
        return _quantize_rows(x, mode, bits, out, scale_bytes)

    return kernel


_KERNELS = {(mode, bits): _specialise(mode, bits) for mode in (MODE_BF16, MODE_F16, MODE_F32) for bits in (4, 8)}


def quantize_rows(x: np.ndarray, mode: int, bits: int, out: np.ndarray, scale_bytes: np.ndarray) -> int:
    """Quantize rows (bf16/fp16 bits as uint16, or float32) to `bits`-wide MX elements.

    out: uint8 [rows, cols/2] packed FP4 or [rows, cols] float8_e4m3fn codes; scale_bytes: uint8
    [rows, cols/32]. Releases the GIL. Returns the flat index of the first NaN/Inf element, or -1.
    """
    return _KERNELS[(mode, bits)](x, out, scale_bytes)


def quantize(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantize a whole 2-D weight: (packed FP4 uint8 or float8_e4m3fn codes, E8M0 scale bytes)."""
    rows, cols = w.shape
    why = mx_unsupported(cols)
    if why:
        raise ValueError(why)
    out = np.empty((rows, cols // 2 if bits == 4 else cols), np.uint8)
    scale = np.empty((rows, cols // GROUP), np.uint8)
    bad = quantize_rows(kernel_input(np.ascontiguousarray(w)), mode_of(w.dtype), bits, out, scale)
    if bad >= 0:
        raise ValueError(f"non-finite value at row {bad // cols}, column {bad % cols}")
    return (out if bits == 4 else out.view(ml_dtypes.float8_e4m3fn)), scale


def dequantize(values: np.ndarray, scale: np.ndarray, dtype: np.dtype | type = ml_dtypes.bfloat16) -> np.ndarray:
    """`q * 2**(byte - 127)`, as compressed-tensors' decompressors do: the scale in BF16, product in `dtype`.

    `values`: the codes' values in float32 (FP4 bytes as the format unpacks them, `Mxfp4PackQuantized.unpack`).
    """
    mult = np.exp2(scale.astype(np.float32) - 127).astype(ml_dtypes.bfloat16).astype(np.float32)
    return (values * np.repeat(mult, GROUP, axis=1)).astype(dtype)
