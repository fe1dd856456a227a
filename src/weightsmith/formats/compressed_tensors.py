"""compressed-tensors on disk: its format names and the `quantization_config` block.

Facts from compressed-tensors (`compressors/pack_quantized`, `compressors/nvfp4`,
`quantization/quant_args.py`) and vLLM's loader; see docs/formats.md for sources. What each
format stores per quantized module, and how, is in its module of formats/compressors/.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

QUANT_METHOD = "compressed-tensors"
PACK_QUANTIZED = "pack-quantized"
NVFP4_PACK_QUANTIZED = "nvfp4-pack-quantized"
MXFP4_PACK_QUANTIZED = "mxfp4-pack-quantized"
MXFP8_QUANTIZED = "mxfp8-quantized"
FLOAT_QUANTIZED = "float-quantized"
INT_QUANTIZED = "int-quantized"
NAIVE_QUANTIZED = "naive-quantized"
#: The compressed-tensors release whose config schema we write (the one llm-compressor pins).
SCHEMA_VERSION = "0.19.0"

#: What a scale "in the original weight's dtype" (a layout's FLOAT_SCALE) may be: a float dtype a weight has.
ORIGINAL_FLOATS = frozenset({"BF16", "F16", "F32", "F64"})
#: `QuantizationArgs.scale_dtype` values -> safetensors dtype codes.
TORCH_DTYPES = {
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.bfloat16": "BF16",
    "torch.float16": "F16",
    "torch.float32": "F32",
    "torch.float8_e8m0fnu": "F8_E8M0",
}


def scale_dtypes(scale_dtype: object) -> frozenset[str]:
    """Dtypes a group's scale may be stored in: the declared `scale_dtype`, else the weight's float dtype.

    Shared by `quantize` (which decodes FP8 inputs with these scales) and `verify`, so that neither
    accepts an integer scale the other refuses.
    """
    code = TORCH_DTYPES.get(scale_dtype) if isinstance(scale_dtype, str) else None
    return frozenset({code}) if code else ORIGINAL_FLOATS


def weight_args(
    num_bits: int,
    symmetric: bool,
    group_size: int | None,
    type_: str = "int",
    strategy: str = "group",
    scale_dtype: str | None = None,
) -> dict[str, Any]:
    """A `QuantizationArgs` dict in the schema compressed-tensors 0.17-0.20 all accept.

    Every field is written out (as compressed-tensors 0.19 does), so older readers that pin a
    version, such as vLLM, find nothing missing and nothing unknown.
    """
    return {
        "actorder": None,
        "block_structure": None,
        "dynamic": False,
        "group_size": group_size,
        "num_bits": num_bits,
        "observer": None,
        "observer_kwargs": {},
        "scale_dtype": scale_dtype,
        "strategy": strategy,
        "symmetric": symmetric,
        "type": type_,
        "zp_dtype": None if symmetric else "torch.int8",
    }


#: Every field of `QuantizationArgs`, which `weight_args` writes out in full. compressed-tensors
#: forbids any other key (pydantic `extra="forbid"`), so a `weights` block with one fails to load.
QUANT_ARGS_FIELDS = frozenset(weight_args(num_bits=4, symmetric=True, group_size=128))


def config_group(
    fmt: str, weights: dict[str, Any], targets: list[str], input_activations: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One `QuantizationScheme` of `config_groups`, with its own `format`.

    `input_activations` is None for weight-only schemes; data-free schemes that quantize
    activations do it dynamically at run time, so their arguments carry no stored scale.
    """
    return {
        "format": fmt,
        "input_activations": input_activations,
        "output_activations": None,
        "targets": targets,
        "weights": weights,
    }


def quantization_config_of(groups: dict[str, dict[str, Any]], fmt: str, ignore: list[str]) -> dict[str, Any]:
    """The whole `quantization_config` block: named groups, the global format, the ignore list."""
    return {
        "config_groups": groups,
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": SCHEMA_VERSION,
    }


def quantization_config(
    group_name: str,
    fmt: str,
    weights: dict[str, Any],
    ignore: list[str],
    input_activations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `quantization_config` of one config group targeting every Linear (one scheme throughout)."""
    return quantization_config_of({group_name: config_group(fmt, weights, ["Linear"], input_activations)}, fmt, ignore)


def block_shape_refusal(
    layer: str, partitions: Sequence[tuple[str, int]], block: tuple[int, int]
) -> tuple[str, str] | None:
    """The shard for which vLLM refuses to build `layer` with weights in `block` (rows, cols) blocks, and
    why in words; None when vLLM builds it.

    `partitions` are the layer's shards (module name, output rows) in vLLM's row order. vLLM's
    `validate_fp8_block_shape` (`quantization/utils/fp8_utils.py`), which its compressed-tensors
    FP8 schemes run under the `block` strategy, requires every shard of a fused layer (q/k/v,
    gate/up) but the last to be a whole number of blocks tall: a ragged shard would leave a block
    of scales straddling two shards. On one GPU a Linear of its own passes at any shape (its edge
    blocks are partial), and so do the input columns; larger tensor-parallel sizes also need each
    rank's slice whole, which a checkpoint cannot promise. The escape vLLM has for merged layers
    (`allow_fp8_block_shape_mismatch`) reads `weight_block_size`, which only the HF `fp8` config
    has, so a compressed-tensors checkpoint is held to the rule.
    """
    rows = block[0]
    for module, out in partitions[:-1]:
        if out % rows:
            return module, (
                f"vLLM refuses {layer.rpartition('.')[2]} in {rows}x{block[1]} blocks: "
                f"{module.rpartition('.')[2]} has {out} output rows, not a multiple of {rows} "
                "(validate_fp8_block_shape requires it of every fused shard but the last)"
            )
    return None
