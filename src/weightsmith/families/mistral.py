"""Mistral: Llama's blocks (and biases) under its own class; sliding-window attention changes no shape."""

from __future__ import annotations

from weightsmith.families.base import register
from weightsmith.families.llama import Llama


@register
class Mistral(Llama):
    model_types = ("mistral",)
    architectures = ("MistralForCausalLM",)
