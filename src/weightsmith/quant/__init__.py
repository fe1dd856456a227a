"""Quantization schemes, each a quantize/dequantize pair, and decoders for quantized inputs.

The kernels compile with numba; facts that readers of a format need (the audit commands) live here,
so that importing them does not start numba.
"""

#: Inputs per FP8 block scale of an NVFP4 weight (compressed-tensors `tensor_group` 16, ModelOpt `group_size`).
NVFP4_GROUP = 16
#: Inputs per E8M0 scale of an MX (OCP microscaling) weight.
MX_GROUP = 32
#: int4 values per packed int32 word (compressed-tensors `pack-quantized`).
INT4_PACK = 8
#: compressed-tensors' `QuantizationArgs.type` of an 8-bit integer and an 8-bit float weight.
INT, FLOAT = "int", "float"
#: Sinkhorn steps at most: the reference's default for its dual-scale quantizer (the SINQ pre-pass).
SINKHORN_ITERATIONS = 16


def int4_unsupported(cols: int, group: int) -> str | None:
    """Why a [*, cols] weight cannot take int4 groups of `group` inputs, or None if it can."""
    if group <= 0 or group % INT4_PACK:
        return f"group size {group} is not a positive multiple of {INT4_PACK}"
    if cols % group:
        return f"input size {cols} is not a multiple of the group size {group}"
    return None


def mx_unsupported(cols: int) -> str | None:
    """Why a [*, cols] weight cannot take an MX scheme, or None if it can."""
    if cols % MX_GROUP:
        return f"input size {cols} is not a multiple of the MX group size {MX_GROUP}"
    return None


def nvfp4_unsupported(cols: int) -> str | None:
    """Why a [*, cols] weight cannot take NVFP4, or None if it can."""
    if cols % NVFP4_GROUP:
        return f"input size {cols} is not a multiple of the NVFP4 group size {NVFP4_GROUP}"
    return None
