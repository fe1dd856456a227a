"""Quantization schemes, each a quantize/dequantize pair, and decoders for quantized inputs.

The kernels compile with numba; facts that readers of a format need (the audit commands) live here,
so that importing them does not start numba.
"""

#: Inputs per FP8 block scale of an NVFP4 weight (compressed-tensors `tensor_group` 16, ModelOpt `group_size`).
NVFP4_GROUP = 16
#: Inputs per E8M0 scale of an MX (OCP microscaling) weight.
MX_GROUP = 32
