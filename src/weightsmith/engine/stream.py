"""Running the decoder layers one at a time over a set of sequences.

The arguments a layer is called with (attention masks, one per layer type as Gemma has them,
rotary position embeddings, position ids, the cache) are whatever the base model's own forward
computes. We record them without knowing any of them: every layer's `forward` is replaced by a
recorder that keeps its arguments and returns the hidden states unchanged, and the base model runs
once per sequence with only the top-level weights real (not the head: nothing runs it). Then each
layer in turn is loaded, called with its recorded arguments on each sequence's hidden states, and
freed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from typing import Any

from weightsmith.engine.loading import TOP, Loader

#: Called after each layer with (layer index, layers in all).
LayerProgress = Callable[[int, int], None]


class _Stop(Exception):
    """Raised by the last recorder: nothing after the decoder layers is needed to record them."""


#: The keyword a layer may receive its hidden states under instead of first.
HIDDEN = "hidden_states"


@dataclass
class Call:
    """The arguments a layer received besides its hidden states, to call it again the same way."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    keyword: bool  # the hidden states came as `hidden_states=`, not first

    def __call__(self, layer: Any, hidden: Any) -> Any:
        """The layer's output hidden states for `hidden`."""
        if self.keyword:
            out = layer(*self.args, **{HIDDEN: hidden}, **self.kwargs)
        else:
            out = layer(hidden, *self.args, **self.kwargs)
        return out[0] if isinstance(out, tuple) else out


@contextmanager
def replaced_layers(layers: Any, forward: Callable[[int, Any, Call], Any]) -> Iterator[None]:
    """Every layer's `forward` replaced by `forward(index, hidden states, the rest of the call)`."""

    def split(index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return forward(index, args[0], Call(args[1:], kwargs, keyword=False))
        rest = dict(kwargs)
        return forward(index, rest.pop(HIDDEN), Call((), rest, keyword=True))

    for index, layer in enumerate(layers):
        layer.forward = lambda *a, _i=index, **kw: split(_i, a, kw)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def layer_arguments(loader: Loader, sequences: list[Any], cache: Any = None) -> tuple[list[Any], list[list[Call]]]:
    """(embedded hidden states per sequence, the call of each layer per sequence).

    `cache` goes in as `past_key_values`, so the layers later call its `update` with their K and V;
    without one the layers run without a cache.
    """
    import torch

    skeleton = loader.skeleton
    base = skeleton.model.get_decoder() if hasattr(skeleton.model, "get_decoder") else skeleton.model.base_model
    count = len(skeleton.layers)
    hidden: list[Any] = []
    calls: list[list[Call]] = [[] for _ in range(count)]

    def record(index: int, states: Any, call: Call) -> Any:
        if index == 0:
            hidden.append(states)
        calls[index].append(call)
        if index == count - 1:
            raise _Stop
        return states

    loader.load(TOP, head=False)
    try:
        with torch.no_grad(), replaced_layers(skeleton.layers, record):
            for ids in sequences:
                with suppress(_Stop):
                    base(input_ids=ids, past_key_values=cache, use_cache=cache is not None)
    finally:
        loader.free(TOP)
    return hidden, calls


def run_layers(
    loader: Loader,
    hidden: list[Any],
    calls: list[list[Call]],
    progress: LayerProgress | None = None,
    around: Callable[[int], AbstractContextManager[Any]] | None = None,
) -> list[Any]:
    """The hidden states after the last layer; each layer real only while it runs.

    `around(index)`, when given, is a context entered while layer `index` runs (recorders).
    """
    import torch

    count = len(loader.skeleton.layers)
    for index in range(count):
        loader.load(index)
        layer = loader.skeleton.layers[index]
        try:
            with torch.no_grad(), around(index) if around is not None else nullcontext():
                for s, call in enumerate(calls[index]):
                    hidden[s] = call(layer, hidden[s])
        finally:
            loader.free(index)
        if progress is not None:
            progress(index + 1, count)
    return hidden


def final_logits(loader: Loader, sequence: Any, final: Any, positions: Any) -> Any:
    """Logits [len(positions), V] of `sequence` from its final hidden states, by the model's own head.

    The whole causal LM runs with the first layer returning `final` and the others passing it on, so
    the final norm, the head and anything the model does after it (Gemma's logit soft-capping) are
    the model's own; `logits_to_keep` limits the head to `positions`. The top level must be loaded.
    """
    import torch

    def inject(index: int, states: Any, call: Call) -> Any:
        return final if index == 0 else states

    with torch.no_grad(), replaced_layers(loader.skeleton.layers, inject):
        out = loader.skeleton.model(input_ids=sequence, use_cache=False, logits_to_keep=positions)
    return out.logits[0].float()
