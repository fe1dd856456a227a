"""Qwen2 (and Qwen2.5): Llama blocks whose q/k/v projections always have a bias."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weightsmith.families.base import ATTENTION, NORMS, Family, register


def _biases(config: Mapping[str, Any]) -> dict[str, str]:
    """vLLM's `Qwen2Attention`: q/k/v_proj always have a bias, o_proj and the MLP never."""
    return dict.fromkeys(ATTENTION[:3], "the architecture itself")


@register
class Qwen2(Family):
    model_types = ("qwen2",)
    architectures = ("Qwen2ForCausalLM",)
    checked_shapes = True
    foldable_norms = NORMS
    biases = staticmethod(_biases)
