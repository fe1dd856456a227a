"""Laguna: sigmoid-routed experts with a shared expert (`shared_expert` on disk and in vLLM,
`shared_experts` in transformers' memory), an optional per-expert score-correction bias kept under
`mlp.experts`, a per-head attention gate (`g_proj`), and a dense MLP in layer 0."""

from __future__ import annotations

from weightsmith.families.base import SHARED_EXPERT_SIZE, Experts, Family, Router, register


@register
class Laguna(Family):
    model_types = ("laguna",)
    architectures = ("LagunaForCausalLM",)
    experts = Experts("num_experts", "moe_intermediate_size", SHARED_EXPERT_SIZE)
    router = Router("sigmoid", score_bias="experts.e_score_correction_bias")
