"""Llama (and SmolLM2): pre-norm blocks whose every shape follows from the config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weightsmith.families.base import ATTENTION, MLP, NORMS, Family, register


def _set(config: Mapping[str, Any], key: str) -> bool:
    """`getattr(config, key, False)` as vLLM reads it: any truthy JSON value sets it."""
    return bool(config.get(key, False))


def llama_biases(config: Mapping[str, Any]) -> dict[str, str]:
    """vLLM's `LlamaDecoderLayer` (Mistral's too): `attention_bias` (or `bias`) gives o_proj a bias
    and q/k/v_proj one unless `qkv_bias` says otherwise; `mlp_bias` gives the MLP's three theirs."""
    attention = _set(config, "attention_bias") or _set(config, "bias")
    qkv = _set(config, "qkv_bias") if "qkv_bias" in config else attention
    built = dict.fromkeys(ATTENTION[:3], "qkv_bias" if "qkv_bias" in config else "attention_bias") if qkv else {}
    if attention:
        built["self_attn.o_proj"] = "attention_bias"
    if _set(config, "mlp_bias"):
        built |= dict.fromkeys(MLP, "mlp_bias")
    return built


@register
class Llama(Family):
    model_types = ("llama",)
    architectures = ("LlamaForCausalLM",)
    checked_shapes = True
    foldable_norms = NORMS
    biases = staticmethod(llama_biases)
