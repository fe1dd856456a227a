"""Decoding FP8 weights to BF16 before they are re-quantized or kept.

Two on-disk styles (docs/formats.md §3.2-3.3):
- compressed-tensors `float-quantized`: `weight` F8_E4M3 and `weight_scale` per tensor `[1]`, per
  channel `[out, 1]`, per group (a `[1, group]` block) or per 128x128 block
  `[ceil(out/128), ceil(in/128)]`; `w = fp8 * scale`.
- HF / DeepSeek `quant_method: fp8`: `weight` F8_E4M3 and `weight_scale_inv` per block, float32 or
  E8M0 (a power of two); despite the name `w = fp8 * scale_inv`. Partial edge blocks use the scale
  of the block they fall in.
Both multiply in float32 and round once to BF16, as compressed-tensors' and transformers'
dequantizers do.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from weightsmith.core.lazy import lazy_module

if TYPE_CHECKING:
    import ml_dtypes
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")
    ml_dtypes = lazy_module("ml_dtypes")


#: The block HF fp8 and compressed-tensors FP8_BLOCK checkpoints use.
#: A weight-scale block: (rows, columns) of weights that share one scale.
Block = tuple[int, int]
DEFAULT_BLOCK: Block = (128, 128)


def scale_block(
    scale_shape: tuple[int, ...], weight_shape: tuple[int, int], blocks: tuple[Block, ...], per_channel: bool
) -> Block | None:
    """The block of weight each scale element covers, or None when the scale fits no layout.

    A scale is recognised by its shape against the weight's `[out, in]`, never by its shape alone:
    a block scale of a weight with at most 128 inputs is `[ceil(out/128), 1]`, which looks like a
    per-channel scale, and one with at most 128 outputs is `[1, ceil(in/128)]`. The layouts, each
    a block: per tensor (one element covers the whole weight), each declared block
    (`[ceil(out/rows), ceil(in/cols)]`), and, where the format has it, per channel (`[out, 1]`).
    Wherever two layouts give one shape they scale every element alike, so the first match is right.
    """
    out, inp = weight_shape
    if len(scale_shape) <= 2 and math.prod(scale_shape) == 1:
        return max(out, 1), max(inp, 1)
    for rows, cols in blocks:
        if tuple(scale_shape) == (-(-out // rows), -(-inp // cols)):
            return rows, cols
    if per_channel and tuple(scale_shape) == (out, 1):
        return 1, max(inp, 1)
    return None


def expand_scale(scale: np.ndarray, rows: tuple[int, int], cols: int, block: Block) -> np.ndarray:
    """The float32 multiplier for weight rows [r0, r1) of a `cols`-wide weight, broadcastable.

    `block` is what `scale_block` recognised: each scale element covers `block` rows x columns,
    partial edge blocks included. Never larger than the rows it multiplies, whatever the block.
    """
    r0, r1 = rows
    s = np.asarray(scale).astype(np.float32)
    if s.size == 1:
        return s.reshape(1, 1)
    s = s.reshape(s.shape[0], -1)
    br, bc = block
    row_blocks = s[np.arange(r0, r1) // br]
    if s.shape[1] == 1:
        return row_blocks
    return row_blocks[:, np.arange(cols) // bc]


def dequantize_rows(fp8: np.ndarray, scale: np.ndarray, r0: int, block: Block | None = None) -> np.ndarray:
    """BF16 values of FP8 rows starting at weight row `r0`.

    `block` is what `scale_block` recognised for the whole weight. Without it, rows from 0 are
    taken for the whole weight and the layout recognised from the two shapes (per tensor, per
    channel or 128x128 blocks); rows from elsewhere are taken to follow 128x128 blocks.
    """
    rows, cols = fp8.shape
    if block is None:
        whole = scale_block(np.shape(scale), (rows, cols), (DEFAULT_BLOCK,), per_channel=True) if r0 == 0 else None
        block = whole or DEFAULT_BLOCK
    mult = expand_scale(scale, (r0, r0 + rows), cols, block)
    values: np.ndarray = (fp8.astype(np.float32) * mult).astype(ml_dtypes.bfloat16)
    return values


def quantize_blocks(w: np.ndarray, block: Block = DEFAULT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
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
    # contiguous: a writer handed the strided slice (the safetensors library) would store the padded rows
    return np.ascontiguousarray(q.reshape(nr * br, nc * bc)[:rows, :cols]), scale
