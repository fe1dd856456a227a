"""What calibration records while the layers run: K/V maxima as the cache receives them, and the
largest input of every Linear.

K and V are taken where the KV cache takes them: a `DynamicCache` whose `update` records |K| max
and |V| max per layer and stores nothing (so every forward sees an empty cache, as a prefill does),
which is after the rotary embedding and whatever else the attention does first (QK norms). Inputs
are taken by forward pre-hooks on every `torch.nn.Linear`. Fused partners (q/k/v, gate/up), which
vLLM loads as one layer with one input scale, are given one value, the max over partners, in
`share_fused`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from weightsmith import names


def kv_cache(config: Any) -> Any:
    """A cache for `past_key_values` that records K/V maxima per layer index; read `.maxima`."""
    import torch
    from transformers import DynamicCache

    class KVMaxima(DynamicCache):
        def __init__(self) -> None:
            super().__init__(config=config)
            self.maxima: dict[int, tuple[float, float]] = {}

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
            k = float(torch.linalg.vector_norm(key_states.detach(), float("inf")))
            v = float(torch.linalg.vector_norm(value_states.detach(), float("inf")))
            old_k, old_v = self.maxima.get(layer_idx, (0.0, 0.0))
            self.maxima[layer_idx] = (max(old_k, k), max(old_v, v))
            return key_states, value_states

    return KVMaxima()


def attention_modules(layer: Any, layer_path: str) -> dict[int, str]:
    """Layer index -> path of the module in `layer` that calls the cache (the one holding `layer_idx`)."""
    found: dict[int, str] = {}
    for name, module in layer.named_modules():
        index = getattr(module, "layer_idx", None)
        if name and isinstance(index, int) and index not in found:
            found[index] = f"{layer_path}.{name}"
    return found


@contextmanager
def input_maxima(module: Any, prefix: str, into: dict[str, float]) -> Iterator[None]:
    """While open, the largest |input| of each Linear under `module` goes into `into[path]`."""
    import torch

    def hook_for(path: str) -> Any:
        def hook(_module: Any, args: tuple) -> None:
            x = float(torch.linalg.vector_norm(args[0].detach(), float("inf")))
            into[path] = max(into.get(path, 0.0), x)

        return hook

    handles = [
        sub.register_forward_pre_hook(hook_for(f"{prefix}.{name}" if name else prefix))
        for name, sub in module.named_modules()
        if isinstance(sub, torch.nn.Linear)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def share_fused(inputs: dict[str, float]) -> dict[str, float]:
    """Each fused partner's input maximum replaced by the max over the partners present.

    q/k/v (and gate/up) read the same normalised hidden states, so their maxima agree anyway; the
    max makes the shared scale vLLM needs hold by construction, not by coincidence.
    """
    shared = dict(inputs)
    for module in inputs:
        fused = names.fused_partners(module)
        if fused is not None:
            partners = [p for p in fused[1] if p in inputs]
            shared[module] = max(inputs[p] for p in partners)
    return shared
