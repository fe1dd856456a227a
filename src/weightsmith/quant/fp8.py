"""Decoding FP8 weights to BF16 before they are re-quantized or kept.

Two on-disk styles (docs/formats.md §3.2-3.3):
- compressed-tensors `float-quantized`: `weight` F8_E4M3 and `weight_scale` per tensor `[1]`, per
  channel `[out, 1]` or per 128x128 block `[ceil(out/128), ceil(in/128)]`; `w = fp8 * scale`.
- HF / DeepSeek `quant_method: fp8`: `weight` F8_E4M3 and `weight_scale_inv` per block, float32 or
  E8M0 (a power of two); despite the name `w = fp8 * scale_inv`. Partial edge blocks use the scale
  of the block they fall in.
Both multiply in float32 and round once to BF16, as compressed-tensors' and transformers'
dequantizers do.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np


def expand_scale(scale: np.ndarray, rows: tuple[int, int], cols: int, block: tuple[int, int]) -> np.ndarray:
    """The float32 multiplier for weight rows [r0, r1) of a `cols`-wide weight, broadcastable.

    `scale` is per tensor (one element), per channel (`[out, 1]`) or per block (2-D, `block` sized).
    """
    r0, r1 = rows
    s = np.asarray(scale).astype(np.float32)
    if s.size == 1:
        return s.reshape(1, 1)
    if s.ndim == 2 and s.shape[1] == 1:
        return s[r0:r1]
    br, bc = block
    row_blocks = s[np.arange(r0, r1) // br]
    return np.repeat(row_blocks, bc, axis=1)[:, :cols]


def dequantize_rows(fp8: np.ndarray, scale: np.ndarray, r0: int, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    """BF16 values of FP8 rows starting at weight row `r0`."""
    rows, cols = fp8.shape
    mult = expand_scale(scale, (r0, r0 + rows), cols, block)
    return (fp8.astype(np.float32) * mult).astype(ml_dtypes.bfloat16)


def quantize_blocks(w: np.ndarray, block: tuple[int, int] = (128, 128)) -> tuple[np.ndarray, np.ndarray]:
    """FP8 E4M3 block quantization (absmax/448 per block), the inverse used to build test inputs."""
    rows, cols = w.shape
    br, bc = block
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = np.zeros((nr * br, nc * bc), np.float32)
    padded[:rows, :cols] = w.astype(np.float32)
    blocks = padded.reshape(nr, br, nc, bc)
    amax = np.abs(blocks).max(axis=(1, 3))
    scale = np.where(amax == 0, 1.0, amax / 448.0).astype(np.float32)
    q = (blocks / scale[:, None, :, None]).astype(ml_dtypes.float8_e4m3fn)
    return q.reshape(nr * br, nc * bc)[:rows, :cols], scale
