"""8-bit weights: int8 and FP8 (E4M3) round-to-nearest over channels, groups or 2-D blocks.

Formula (compressed-tensors `calculate_qparams` and `_quantize` on CPU, as llm-compressor's
`model_free_ptq` runs them), per block B of the weight, every intermediate rounded to the weight
dtype as torch does (float32 arithmetic, one rounding back):

  scale = max(|x| over B) / H          (H = 127.5 for int8, 448 for FP8; a zero scale becomes eps)
  int8:  q = round_half_even(clamp(x / scale, -128, 127))
  FP8:   q = e4m3(clamp(x / scale, -448, 448))             (round to nearest, ties to even)

A block is one whole row (per channel), `group` consecutive columns of a row, or 128x128 rows x
columns (FP8_BLOCK; blocks past the weight's edge are partial, as compressed-tensors' zero padding
makes them). Dequantization is `q * scale`, rounded to the scale dtype. Vectorised numpy over a
block of rows: each step is one array operation.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

INT, FLOAT = "int", "float"
#: Half the quantized range, what the largest magnitude maps to: compressed-tensors' bit_range / 2.
HALF_RANGE = {INT: np.float32(127.5), FLOAT: np.float32(448.0)}
Q_RANGE = {INT: (np.float32(-128.0), np.float32(127.0)), FLOAT: (np.float32(-448.0), np.float32(448.0))}
STORAGE = {INT: np.dtype(np.int8), FLOAT: np.dtype(ml_dtypes.float8_e4m3fn)}
#: torch.finfo(dtype).eps per weight dtype: what compressed-tensors puts in place of a zero scale.
EPS = {
    np.dtype(ml_dtypes.bfloat16): np.float32(2.0**-7),
    np.dtype(np.float16): np.float32(2.0**-10),
    np.dtype(np.float32): np.float32(2.0**-23),
}

#: Rows x columns of weight one scale covers; None columns: the whole row.
Block = tuple[int, int | None]


def round_to(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 values rounded to `dtype` (to nearest, ties to even), as float32.

    bfloat16 by bit arithmetic (no NaN reaches it: rows with one are refused first), which is
    several times faster than a cast through ml_dtypes.
    """
    if dtype == np.float32:
        return v
    if dtype == np.float16:
        return v.astype(np.float16).astype(np.float32)
    b = v.view(np.uint32)
    b = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return b.view(np.float32)


def first_bad(x: np.ndarray) -> int:
    """The flat index of the first NaN or Inf in `x`, or -1."""
    bad = ~np.isfinite(x)
    return int(np.argmax(bad)) if bad.any() else -1


def quantize_rows(x: np.ndarray, kind: str, block: Block) -> tuple[np.ndarray, np.ndarray, int]:
    """Quantize rows of `x` (bf16, fp16 or fp32) whose first row starts a block of rows.

    Returns (q [rows, cols] int8 or float8_e4m3fn, scale float32 [row blocks, column blocks] with
    values exact in x's dtype, flat index of the first NaN/Inf or -1).
    """
    dtype = x.dtype
    if dtype not in EPS:
        raise TypeError(f"8-bit quantization takes bf16, fp16 or fp32 weights, not {dtype}")
    xf = x.astype(np.float32)
    bad = first_bad(xf)
    if bad >= 0:
        return np.empty(0, STORAGE[kind]), np.empty(0, np.float32), bad
    rows, cols = xf.shape
    br, bc = block[0], block[1] or cols
    nr, nc = -(-rows // br), -(-cols // bc)
    if (nr * br, nc * bc) != (rows, cols):  # partial edge blocks: zeros change no maximum
        padded = np.zeros((nr * br, nc * bc), np.float32)
        padded[:rows, :cols] = xf
    else:
        padded = xf
    blocks = padded.reshape(nr, br, nc, bc)
    amax = np.abs(blocks).max(axis=(1, 3))
    scale = round_to(amax / HALF_RANGE[kind], dtype)
    scale[scale == 0] = EPS[dtype]
    t = round_to(blocks / scale[:, None, :, None], dtype)
    lo, hi = Q_RANGE[kind]
    np.clip(t, lo, hi, out=t)
    t = t.reshape(nr * br, nc * bc)[:rows, :cols]
    q = np.rint(t).astype(np.int8) if kind == INT else t.astype(ml_dtypes.float8_e4m3fn)
    return q, scale, -1


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
