"""Mistral: Llama's blocks (and biases) under its own class; sliding-window attention changes no shape."""

from __future__ import annotations

from weightsmith.families.base import NORMS, Family, register
from weightsmith.families.llama import llama_biases


@register
class Mistral(Family):
    model_types = ("mistral",)
    architectures = ("MistralForCausalLM",)
    checked_shapes = True
    foldable_norms = NORMS
    biases = staticmethod(llama_biases)
