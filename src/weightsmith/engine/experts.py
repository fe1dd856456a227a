"""Input maxima of each MoE expert, whose weights transformers merges into 3-D parameters.

transformers 5 loads `mlp.experts.<e>.gate_proj` / `up_proj` / `down_proj` into one
`gate_up_proj` and one `down_proj` of shape [experts, out, in]; no `torch.nn.Linear` is left to
hook. The loader knows which checkpoint modules went into each merged parameter (`Loader.merged`),
and the eager experts implementation (which the engine selects) multiplies by one expert's slice,
`linear(x, param[e])`. So while a layer runs, `torch.nn.functional.linear` is wrapped: a weight that
is a slice of a merged parameter names its expert, and |x| max goes to that expert's modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: merged parameter path -> expert index -> the checkpoint modules merged into that slice
ExpertTable = dict[str, dict[int, list[str]]]


def expert_table(merged: dict[str, list[str]]) -> ExpertTable:
    """For each merged parameter whose sources differ in one numeric component, the modules per expert."""
    table: ExpertTable = {}
    for target, sources in merged.items():
        parts = [name.split(".") for name in sources]
        if len({len(p) for p in parts}) != 1:
            continue
        numeric = [
            i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1 and all(p[i].isdigit() for p in parts)
        ]
        if len(numeric) != 1:
            continue
        per_expert: dict[int, list[str]] = {}
        for name, p in zip(sources, parts, strict=True):
            per_expert.setdefault(int(p[numeric[0]]), []).append(name.rpartition(".")[0])
        table[target] = {e: sorted(set(modules)) for e, modules in per_expert.items()}
    return table


@contextmanager
def expert_inputs(layer: Any, layer_path: str, table: ExpertTable, into: dict[str, float]) -> Iterator[None]:
    """While open, |x| max of every expert slice multiplied in `layer` goes to its modules in `into`."""
    import torch

    watched = [
        (param, table[f"{layer_path}.{name}"])
        for name, param in layer.named_parameters()
        if f"{layer_path}.{name}" in table and param.dim() == 3
    ]
    if not watched:
        yield
        return
    functional: Any = torch.nn.functional  # its `linear` is swapped for a while, which its type forbids
    original = functional.linear

    def linear(x: Any, weight: Any, bias: Any = None) -> Any:
        if weight.dim() == 2:
            for param, experts in watched:
                if weight.untyped_storage().data_ptr() == param.untyped_storage().data_ptr():
                    expert = (weight.storage_offset() - param.storage_offset()) // param.stride(0)
                    value = float(torch.linalg.vector_norm(x.detach(), float("inf"))) if x.numel() else 0.0
                    for module in experts.get(expert, ()):
                        into[module] = max(into.get(module, 0.0), value)
                    break
        return original(x, weight, bias)

    functional.linear = linear
    try:
        yield
    finally:
        functional.linear = original
