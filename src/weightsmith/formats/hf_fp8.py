"""The HF / DeepSeek `quant_method: fp8` format: what its config declares about the stored scales.

Facts from transformers `FineGrainedFP8Config` and vLLM `Fp8Config` (docs/formats.md §3.3): with a
`weight_block_size` [rows, cols], each FP8 `weight` has a block scale `weight_scale_inv` of shape
`[ceil(out/rows), ceil(in/cols)]`; without one, a per-tensor `weight_scale`. Scales are float32,
or float8_e8m0fnu when `scale_fmt` is `ue8m0`. Both `quantize` (to decode) and `verify` (to check)
read these facts here, so neither accepts what the other refuses.
"""

from __future__ import annotations

from typing import Any

from weightsmith.formats.layouts import Args, Layout, parse_block
from weightsmith.io import names
from weightsmith.quant.fp8 import Block

QUANT_METHOD = "fp8"
BLOCK_KEY = "weight_block_size"


def block_size(qc: dict[str, Any]) -> Block | None:
    """The declared block, None for per-tensor scales; ValueError (naming the key) when malformed."""
    value = qc.get(BLOCK_KEY)
    if value is None:
        return None
    try:
        return parse_block(value)
    except ValueError as exc:
        raise ValueError(f"quantization_config.{BLOCK_KEY} {exc}") from None


def scale_param(block: Block | None) -> str:
    """vLLM registers `weight_scale_inv` for block scales and `weight_scale` for one per tensor."""
    return names.WEIGHT_SCALE_INV if block is not None else names.WEIGHT_SCALE


def layout(block: Block | None) -> Layout:
    """An FP8 `weight` [out, in] and its scale (float32 or E8M0, `scale_dtypes`): per block, or per tensor."""
    args = Args(8, "float", "block" if block else "tensor", block=block)
    return Layout(args, names.WEIGHT, "F8_E4M3", scale=scale_param(block), scale_block=block)


def scale_dtypes(qc: dict[str, Any]) -> frozenset[str]:
    """Dtypes a scale may be stored in: F32, and F8_E8M0 too under `scale_fmt: ue8m0`.

    Under ue8m0 every scale is a power of two, which float32 holds exactly, so F32 stays accepted.
    """
    return frozenset({"F32", "F8_E8M0"}) if qc.get("scale_fmt") == "ue8m0" else frozenset({"F32"})
