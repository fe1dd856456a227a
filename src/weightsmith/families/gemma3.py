"""Gemma 3: its norms scale by `1 + weight`, so no pre-pass folds into them; q/k norms, sliding and
global attention layers, tied embeddings. Its shapes are not stated (nothing checks them)."""

from __future__ import annotations

from weightsmith.families.base import Family, register


@register
class Gemma3(Family):
    model_types = ("gemma3_text", "gemma3")
    architectures = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
