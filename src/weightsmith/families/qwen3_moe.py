"""Qwen3-MoE: softmax-routed experts, no shared expert; `mlp_only_layers` leave some layers dense."""

from __future__ import annotations

from weightsmith.families.base import Experts, Family, Router, register


@register
class Qwen3Moe(Family):
    model_types = ("qwen3_moe",)
    architectures = ("Qwen3MoeForCausalLM",)
    experts = Experts("num_experts", "moe_intermediate_size", aliases=("num_local_experts",))
    router = Router("softmax")
