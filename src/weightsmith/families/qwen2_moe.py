"""Qwen2-MoE: softmax-routed experts beside a shared expert whose output a sigmoid gate scales;
`mlp_only_layers` (and `decoder_sparse_step`) leave some layers dense."""

from __future__ import annotations

from weightsmith.families.base import SHARED_EXPERT_SIZE, Experts, Family, Router, register


@register
class Qwen2Moe(Family):
    model_types = ("qwen2_moe",)
    architectures = ("Qwen2MoeForCausalLM",)
    experts = Experts("num_experts", "moe_intermediate_size", SHARED_EXPERT_SIZE)
    router = Router("softmax", shared_gate=True)
