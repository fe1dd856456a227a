"""DeepSeek-V3: multi-head latent attention (q_a/q_b, kv_a_proj_with_mqa/kv_b), sigmoid scores with
grouped top-k (`n_group` groups, the best `topk_group` searched) and a score-correction bias, shared
experts as one MLP `n_shared_experts` times an expert's width, and `first_k_dense_replace` dense layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weightsmith.families.base import Experts, Family, Router, register


def _shared(config: Mapping[str, Any]) -> Any:
    shared, size = config.get("n_shared_experts"), config.get("moe_intermediate_size")
    return shared * size if type(shared) is int and type(size) is int else None


@register
class DeepseekV3(Family):
    model_types = ("deepseek_v3",)
    architectures = ("DeepseekV3ForCausalLM",)
    experts = Experts(
        "n_routed_experts", "moe_intermediate_size", (_shared, "n_shared_experts x moe_intermediate_size")
    )
    # vLLM's DeepseekV2MoE builds the bias only under `topk_method: noaux_tc` (deepseek_v2.py), as V3's configs say
    router = Router(
        "sigmoid", grouped=True, score_bias="gate.e_score_correction_bias", score_bias_when=("topk_method", "noaux_tc")
    )
