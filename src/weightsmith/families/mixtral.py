"""Mixtral: every MLP is a softmax-routed MoE (`block_sparse_moe`), its experts' projections named w1
(gate), w3 (up) and w2 (down), each expert as wide as `intermediate_size`."""

from __future__ import annotations

from weightsmith.families.base import Experts, Family, Router, register


@register
class Mixtral(Family):
    model_types = ("mixtral",)
    architectures = ("MixtralForCausalLM",)
    experts = Experts("num_local_experts", "intermediate_size", reads=("w1", "w3"), writes="w2")
    router = Router("softmax")
