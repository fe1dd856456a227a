"""What calibration records while the layers run: K/V maxima as the cache receives them, and the
largest input of every Linear.

K and V are taken where the KV cache takes them: a `DynamicCache` whose `update` records |K| max
and |V| max and stores nothing (so every forward sees an empty cache, as a prefill does), which is
after the rotary embedding and whatever else the attention does first (QK norms); they are filed
under the module that called `update` (`attention_modules`). Inputs
are taken by forward pre-hooks on every `torch.nn.Linear`. Fused partners (q/k/v, gate/up), which
vLLM loads as one layer with one input scale, are given one value, the max over partners, in
`share_fused`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from weightsmith.io import names


def kv_cache(config: Any) -> Any:
    """A cache for `past_key_values` that records K/V maxima and stores nothing; read `.maxima`.

    Maxima are keyed by the module calling `update` when `attention_modules` is open around the
    run, by layer index otherwise.
    """
    import torch
    from transformers import DynamicCache

    class KVMaxima(DynamicCache):
        def __init__(self) -> None:
            super().__init__(config=config)
            self.maxima: dict[str | int, tuple[float, float]] = {}
            self.active: list[str] = []  # the attention modules running now, innermost last

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
            k = float(torch.linalg.vector_norm(key_states.detach(), float("inf")))
            v = float(torch.linalg.vector_norm(value_states.detach(), float("inf")))
            where = self.active[-1] if self.active else layer_idx
            old_k, old_v = self.maxima.get(where, (0.0, 0.0))
            self.maxima[where] = (max(old_k, k), max(old_v, v))
            return key_states, value_states

    return KVMaxima()


@contextmanager
def attention_modules(
    layer: Any, prefix: str, cache: Any, named: Callable[[str], str] = lambda path: path
) -> Iterator[None]:
    """While open, K/V the cache receives are filed under the module that passed them, by the name
    `named` gives its path (the checkpoint's, where the model's differs).

    The candidates are the modules holding an integer `layer_idx` (transformers gives one to
    whatever calls the cache); the one running when `update` is called is the attention module.
    """

    def enter(path: str) -> Any:
        return lambda _module, _args: cache.active.append(path)

    def leave(_module: Any, _args: Any, _out: Any) -> None:
        cache.active.pop()

    handles = []
    for name, module in layer.named_modules():
        if isinstance(getattr(module, "layer_idx", None), int):
            path = named(f"{prefix}.{name}" if name else prefix)
            handles += [module.register_forward_pre_hook(enter(path)), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def input_maxima(linears: Mapping[str, Any], into: dict[str, float]) -> Iterator[None]:
    """While open, the largest |input| of each Linear in `linears` goes into `into[its name]`."""
    import torch

    def hook_for(path: str) -> Any:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            x = float(torch.linalg.vector_norm(args[0].detach(), float("inf"))) if args[0].numel() else 0.0
            into[path] = max(into.get(path, 0.0), x)

        return hook

    handles = [module.register_forward_pre_hook(hook_for(path)) for path, module in linears.items()]
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
