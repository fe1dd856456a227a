"""Int4 group-wise round-to-nearest (W4A16), compressed-tensors `pack-quantized`.

Formula (compressed-tensors `calculate_qparams` and `_quantize`, as run by llm-compressor's
`model_free_ptq` on CPU), per group of `group` consecutive input columns of one row, with every
intermediate rounded to the weight dtype:

  symmetric:  scale = max(|min(G,0)|, max(G,0)) / 7.5         q = round(clamp(x / scale, -8, 7))
  asymmetric: scale = (max(G,0) - min(G,0)) / 15               zp = round(clamp(-8 - min/scale, -8, 7))
                                                               q = round(clamp(x / scale + zp, -8, 7))

A zero scale becomes the dtype's eps; `round` is half to even. Dequantization is
`(q - zp) * scale` in the scale dtype. Storage: `pack-quantized` (formats/compressors/pack_quantized.py),
which the kernel writes directly (a whole weight: `schemes.int4.quantize`): `weight_packed` int32 with
q+8 nibbles, column 0 in the lowest nibble; `weight_scale` in the weight dtype; asymmetric
`weight_zero_point` as zp+8 nibbles packed along the output dimension. Bit-exact with llm-compressor
0.14 / compressed-tensors 0.19 on CPU (tests/quantize/test_reference_llmcompressor.py).
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
from numba import njit

from weightsmith.quant import INT4_PACK
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

Q_MIN, Q_MAX, OFFSET = -8, 7, 8
# The kernel writes pack-quantized words of INT4_PACK values itself, for speed (the layout is
# formats/compressors/pack_quantized.py's; tests/formats/test_compressors.py holds the two equal).

#: numpy storage dtype of each emulated mode (for scales and dequantized values).
MODE_DTYPES = {MODE_F32: np.dtype(np.float32), MODE_BF16: np.dtype(ml_dtypes.bfloat16), MODE_F16: np.dtype(np.float16)}


@scalar_helper
def stored_bits(mode: int, raw: np.uint16 | np.float32) -> np.uint32:
    """The stored bits of one element (16-bit floats arrive as their bits already)."""
    if mode == MODE_F32:
        return np.float32(raw).view(np.uint32)
    return np.uint32(raw)


@scalar_helper
def from_stored_bits(mode: int, b: np.uint32) -> np.float32:
    if mode == MODE_F32:
        return np.uint32(b).view(np.float32)
    return decode(mode, b)


@array_helper
def group_range(x: np.ndarray, r: int, c0: int, group: int, mode: int) -> tuple[np.float32, np.float32, int]:
    """(min(G, 0), max(G, 0), column of a NaN/Inf or -1) of one group, from the stored bits.

    Zero is always inside the range, as compressed-tensors' `calculate_qparams` makes it. For finite
    floats the order of magnitudes is the order of their bits without the sign, so the range is two
    integer maxima (negative and non-negative values apart) with no branch and no float compare:
    a loop the compiler vectorises. A NaN or Inf has the largest magnitude bits of all.
    """
    if mode == MODE_F32:
        sign, inf, shift = np.uint32(0x80000000), np.uint32(0x7F800000), np.uint32(31)
    elif mode == MODE_F16:
        sign, inf, shift = np.uint32(0x8000), np.uint32(0x7C00), np.uint32(15)
    else:
        sign, inf, shift = np.uint32(0x8000), np.uint32(0x7F80), np.uint32(15)
    neg = np.uint32(0)
    pos = np.uint32(0)
    for i in range(group):
        b = stored_bits(mode, x[r, c0 + i])
        mag = np.uint32(b & np.uint32(sign - np.uint32(1)))
        negative = np.uint32(np.uint32(0) - np.uint32(b >> shift))  # all ones for a negative value
        neg = max(neg, np.uint32(mag & negative))
        pos = max(pos, np.uint32(mag & ~negative))
    if max(neg, pos) >= inf:
        for i in range(group):
            if np.uint32(stored_bits(mode, x[r, c0 + i]) & np.uint32(sign - np.uint32(1))) >= inf:
                return np.float32(0.0), np.float32(0.0), c0 + i
    lo = -from_stored_bits(mode, neg) if neg else np.float32(0.0)
    return lo, from_stored_bits(mode, pos), -1


@array_helper
def load_group(
    x: np.ndarray, r: int, c0: int, group: int, mode: int, vals: np.ndarray
) -> tuple[np.float32, np.float32, int]:
    """`group_range` of one group, with its values decoded into `vals` (for kernels that revisit them)."""
    lo, hi, bad = group_range(x, r, c0, group, mode)
    for i in range(group):
        vals[i] = decode(mode, x[r, c0 + i])
    return lo, hi, bad


@scalar_helper
def eps_of(mode: int) -> np.float32:
    """torch.finfo(dtype).eps of the emulated dtype: what compressed-tensors puts in place of a zero scale."""
    if mode == MODE_BF16:
        return np.float32(2.0**-7)
    if mode == MODE_F16:
        return np.float32(2.0**-10)
    return np.float32(2.0**-23)


@array_helper
def group_params(
    mode: int, symmetric: bool, lo: np.float32, hi: np.float32, p: np.float32
) -> tuple[np.float32, np.float32]:
    """(scale, zero point) compressed-tensors computes for a group's range [lo, hi] clipped by `p`.

    `p` is 1 for plain RTN, or the factor a scale search chose, applied as llm-compressor's observers
    do. The zero point is 0 for a symmetric group.
    """
    if p != 1:
        lo = round_to(mode, lo * p)
        hi = round_to(mode, hi * p)
    zp = np.float32(0.0)
    if symmetric:
        s = round_to(mode, max(-lo, hi) / np.float32(7.5))
    else:
        s = round_to(mode, round_to(mode, hi - lo) / np.float32(15.0))
        if s != 0:
            zf = round_to(mode, np.float32(-8.0) - round_to(mode, lo / s))
            zp = rint_small(min(max(zf, np.float32(Q_MIN)), np.float32(Q_MAX)))
        elif lo < 0:  # a range that underflows to a zero scale: torch's -8 - lo / 0 is +inf, clamped
            zp = np.float32(Q_MAX)
        # (an all-zero group gives torch 0 / 0 = NaN, which casts to int8 0)
    if s == 0:
        s = eps_of(mode)
    return s, zp


@array_helper
def _emit_group(
    x: np.ndarray,
    r: int,
    c0: int,
    group: int,
    mode: int,
    symmetric: bool,
    bytewise: bool,
    s: np.float32,
    zp: np.float32,
    nibbles: np.ndarray,
    packed: np.ndarray,
) -> None:
    """One group's codes at scale `s` and zero point `zp`, written into `packed`.

    `bytewise`: each value as an int8 of its own in `packed` ([rows, cols], W4AFP8's storage)
    rather than nibbles packed eight to a uint32.
    """
    qmin, qmax = np.float32(Q_MIN), np.float32(Q_MAX)
    for i in range(group):
        t = round_to(mode, decode(mode, x[r, c0 + i]) / s)
        if not symmetric:
            t = round_to(mode, t + zp)
        q = np.int32(rint_small(min(max(t, qmin), qmax)))
        if bytewise:
            packed[r, c0 + i] = np.int8(q)
        else:
            nibbles[i] = np.uint32(q + OFFSET)
    if not bytewise:
        for w in range(group // INT4_PACK):
            b = w * INT4_PACK
            packed[r, c0 // INT4_PACK + w] = (
                nibbles[b]
                | (nibbles[b + 1] << 4)
                | (nibbles[b + 2] << 8)
                | (nibbles[b + 3] << 12)
                | (nibbles[b + 4] << 16)
                | (nibbles[b + 5] << 20)
                | (nibbles[b + 6] << 24)
                | (nibbles[b + 7] << 28)
            )


@array_helper
def _quantize_rows(
    x: np.ndarray,
    mode: int,
    group: int,
    symmetric: bool,
    bytewise: bool,
    given: bool,
    shrink: np.ndarray,
    packed: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray,
) -> int:
    """The kernel body; `mode`, `symmetric`, `bytewise` and `given` are compile-time constants in each
    caller. `given`: each group's (scale, zero point) is read from `scale` and `zero_point`, as a
    parameter search chose them (`shrink` unread); otherwise both are derived from the group's range
    clipped by `shrink` and written there."""
    rows, cols = x.shape
    nibbles = np.empty(group, np.uint32)
    for r in range(rows):
        for g in range(cols // group):
            c0 = g * group
            lo, hi, bad = group_range(x, r, c0, group, mode)
            if bad >= 0:
                return int(r * cols + bad)
            if given:
                s, zp = scale[r, g], np.float32(0.0) if symmetric else np.float32(zero_point[r, g])
            else:
                s, zp = group_params(mode, symmetric, lo, hi, shrink[r, g])
                if not symmetric:
                    zero_point[r, g] = np.int8(zp)
                scale[r, g] = s
            _emit_group(x, r, c0, group, mode, symmetric, bytewise, s, zp, nibbles, packed)
    return -1


def _specialise(mode: int, symmetric: bool, bytewise: bool) -> tuple[Callable[..., int], Callable[..., int]]:
    """The two compiled kernels (range-derived and given parameters) for one (dtype, symmetry, storage).

    The three arrive as closure constants, which numba compiles in as constants: the per-element
    rounding branches vanish and the loops vectorise (about 2x faster than a runtime switch).
    """

    @njit(nogil=True, cache=True, error_model="numpy")
    def kernel(
        x: np.ndarray, group: int, shrink: np.ndarray, packed: np.ndarray, scale: np.ndarray, zero_point: np.ndarray
    ) -> int:
        return _quantize_rows(x, mode, group, symmetric, bytewise, False, shrink, packed, scale, zero_point)

    @njit(nogil=True, cache=True, error_model="numpy")
    def given(x: np.ndarray, group: int, scale: np.ndarray, zero_point: np.ndarray, packed: np.ndarray) -> int:
        return _quantize_rows(x, mode, group, symmetric, bytewise, True, scale, packed, scale, zero_point)

    return kernel, given


#: By (mode, symmetric, one int8 per value); W4AFP8, the one preset stored bytewise, is symmetric.
_KERNELS = {
    (mode, symmetric, bytewise): _specialise(mode, symmetric, bytewise)
    for mode in (MODE_BF16, MODE_F16, MODE_F32)
    for symmetric, bytewise in ((True, False), (False, False), (True, True))
}


def quantize_rows(
    x: np.ndarray,
    mode: int,
    group: int,
    symmetric: bool,
    shrink: np.ndarray,
    packed: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray,
) -> int:
    """Quantize rows of `x` (bf16/fp16 bits as uint16, or float32) into caller-owned outputs.

    shrink: float32 [rows, cols/group], the factor each group's range is clipped by (1.0 is plain
    RTN); packed: uint32 [rows, cols/8], or int8 [rows, cols] for one value per byte (symmetric
    only); scale: float32 [rows, cols/group] (values exact in the emulated dtype); zero_point: int8
    [rows, cols/group] (written only when asymmetric).
    Releases the GIL. Returns the flat index of the first NaN/Inf element, or -1.
    """
    kernel = _KERNELS[(mode, bool(symmetric), packed.dtype == np.int8)][0]
    return kernel(x, group, shrink, packed, scale, zero_point)


def quantize_given(
    x: np.ndarray,
    mode: int,
    group: int,
    symmetric: bool,
    scale: np.ndarray,
    zero_point: np.ndarray,
    packed: np.ndarray,
) -> int:
    """`quantize_rows` on each group's (scale, zero point) as a parameter search chose them, rounded
    the same way: q = round(clamp(round_to(round_to(x / s) + zp), -8, 7)).

    scale: float32 [rows, cols/group], each exact in the emulated dtype; zero_point: int8
    [rows, cols/group] in [-8, 7], read only when asymmetric; packed as `quantize_rows`'.
    Releases the GIL. Returns the flat index of the first NaN/Inf element, or -1.
    """
    kernel = _KERNELS[(mode, bool(symmetric), packed.dtype == np.int8)][1]
    return kernel(x, group, scale, zero_point, packed)


def mode_of(dtype: np.dtype) -> int:
    """The arithmetic mode that emulates torch for weights of this dtype."""
    for mode, dt in MODE_DTYPES.items():
        if dt == np.dtype(dtype):
            return mode
    raise TypeError(f"int4 quantization takes bf16, fp16 or fp32 weights, not {dtype}")


def kernel_input(w: np.ndarray) -> np.ndarray:
    """The array the kernel reads: 16-bit floats as their raw bits, float32 as is."""
    return w.view(np.uint16) if w.dtype.itemsize == 2 else w


def scale_storage(scale_f32: np.ndarray, mode: int) -> np.ndarray:
    """Kernel scales (exact in the emulated dtype) in their storage dtype."""
    if mode == MODE_BF16:
        return (scale_f32.view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(ml_dtypes.bfloat16)
    return scale_f32.astype(MODE_DTYPES[mode])


__all__ = ["quantize_given", "quantize_rows"]
