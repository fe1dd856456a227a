"""Qwen3: Llama blocks with per-head q/k norms; a bias on q/k/v under `attention_bias`.

Its norms multiply by their weight, but the pre-pass's folds have been checked on Llama, Mistral and
Qwen2 blocks only, so it folds none here (`foldable_norms` empty: `--pre-pass auto` skips it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weightsmith.families.base import ATTENTION, Family, register


def _biases(config: Mapping[str, Any]) -> dict[str, str]:
    """vLLM's `Qwen3Attention`: q/k/v_proj have a bias under `attention_bias`; o_proj never (transformers
    gives it one too, which vLLM then skips)."""
    return dict.fromkeys(ATTENTION[:3], "attention_bias") if bool(config.get("attention_bias", False)) else {}


@register
class Qwen3(Family):
    model_types = ("qwen3",)
    architectures = ("Qwen3ForCausalLM",)
    checked_shapes = True
    layer_vectors = (("self_attn.q_norm.weight", "head_dim"), ("self_attn.k_norm.weight", "head_dim"))
    biases = staticmethod(_biases)
