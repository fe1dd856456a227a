"""MoE experts as Linears, though transformers merges their weights into 3-D parameters.

transformers 5 loads `mlp.experts.<e>.gate_proj` / `up_proj` / `down_proj` into one
`gate_up_proj` and one `down_proj` of shape [experts, out, in]; no `torch.nn.Linear` is left to
hook. The loader knows which checkpoint modules went into each merged parameter, in the order their
rows were concatenated (`Loader.merged`), and the eager experts implementation (which the engine
selects) multiplies by one expert's slice, `linear(x, param[e])`, only for the tokens routed to it.

So while `LinearExperts.routing` is open, `torch.nn.functional.linear` is wrapped: a weight that is a slice
of a merged parameter names its expert, and the product is made by one `ExpertLinear` per checkpoint
module in that slice (gate's rows, then up's), each a view of the parameter's rows. Whatever hooks a
Linear (calibration's input maxima, GPTQ's Hessians) then sees each expert's routed tokens under the
checkpoint's name, and a weight written into an `ExpertLinear` is written into the merged parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

#: merged parameter path -> expert index -> the checkpoint modules merged into that slice, in row order
ExpertTable = dict[str, dict[int, list[str]]]


def expert_table(merged: dict[str, list[str]]) -> ExpertTable:
    """For each merged parameter whose sources differ in one numeric component, the modules per expert."""
    table: ExpertTable = {}
    for target, sources in merged.items():
        parts = [name.split(".") for name in sources]
        if len({len(p) for p in parts}) != 1:
            continue
        numeric = [
            i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1 and all(_index(p[i]) for p in parts)
        ]
        if len(numeric) != 1:
            continue
        per_expert: dict[int, list[str]] = {}
        for name, p in zip(sources, parts, strict=True):
            modules = per_expert.setdefault(int(p[numeric[0]]), [])
            module = name.rpartition(".")[0]
            if module not in modules:
                modules.append(module)
        table[target] = per_expert
    return table


def expert_modules(table: ExpertTable) -> set[str]:
    """Every checkpoint module of every expert in `table`."""
    return {module for experts in table.values() for names in experts.values() for module in names}


def _index(part: str) -> bool:
    """An expert index: at most 9 ASCII digits (a longer one is no expert, nor an int to parse cheaply)."""
    return part.isascii() and part.isdigit() and len(part) <= 9


@cache
def _expert_linear_class() -> Any:
    """The class, made once (torch is imported only when the engine runs)."""
    import torch

    class ExpertLinear(torch.nn.Linear):
        """One checkpoint module of one expert: a Linear whose weight is a view of its rows of the merged
        parameter, multiplied by the unwrapped `linear` (so the product is not routed again)."""

        def __init__(self, weight: Any, linear: Any) -> None:
            torch.nn.Module.__init__(self)
            self.in_features, self.out_features = int(weight.shape[1]), int(weight.shape[0])
            self.weight = torch.nn.Parameter(weight, requires_grad=False)
            self.register_parameter("bias", None)
            self._linear = linear

        def forward(self, x: Any) -> Any:
            return self._linear(x, self.weight)

    return ExpertLinear


class LinearExperts:
    """The `ExpertLinear`s of one loaded decoder layer's merged expert parameters (`modules`: checkpoint
    module name -> its Linear), and `routing`, while which the layer's products by an expert slice are
    made by them."""

    def __init__(self, layer: Any, layer_path: str, table: ExpertTable) -> None:
        import torch

        self._original = torch.nn.functional.linear
        make = _expert_linear_class()
        self.modules: dict[str, Any] = {}
        #: the merged parameters, each with its slices' Linears per expert (in row order)
        self._watched: list[tuple[Any, dict[int, list[Any]]]] = []
        #: the modules of each expert slice that share its input (gate and up; down alone), in row order
        self.slices: list[list[str]] = []
        #: the modules holding merged parameters (`mlp.experts`), each with its number of experts
        self._owners: dict[int, tuple[Any, int]] = {}
        for name, param in layer.named_parameters():
            experts = table.get(f"{layer_path}.{name}")
            if experts is None or param.dim() != 3 or param.device.type == "meta":
                continue
            slices: dict[int, list[Any]] = {}
            for expert, names in sorted(experts.items()):
                if not 0 <= expert < param.shape[0] or param.shape[1] % len(names):
                    continue
                rows = param.shape[1] // len(names)
                parts = [make(param.data[expert, i * rows : (i + 1) * rows], self._original) for i in range(len(names))]
                slices[expert] = parts
                self.modules.update(zip(names, parts, strict=True))
                self.slices.append(list(names))
            self._watched.append((param, slices))
            owner = layer.get_submodule(name.rpartition(".")[0]) if "." in name else layer
            self._owners[id(owner)] = (owner, int(param.shape[0]))

    @contextmanager
    def routing(self, all_experts: bool = False) -> Iterator[None]:
        """While open, `torch.nn.functional.linear` by an expert's slice is the concatenation of its
        `ExpertLinear`s' outputs (so their hooks see the expert's tokens).

        `all_experts`: before the experts module runs, it runs once more with every token routed to
        every expert (its own forward, so each expert's down projection reads its own activations of
        every token), which its Linears see; the output of that run is dropped, and the real one, routed
        as the model routes, is made without them: statistics from every token, outputs unchanged (as
        llm-compressor's `calibrate_all_experts`)."""
        import torch

        if not self._watched:
            yield
            return
        functional: Any = torch.nn.functional  # its `linear` is swapped for a while, which its type forbids
        original = self._original
        silent = [False]

        def linear(x: Any, weight: Any, bias: Any = None) -> Any:
            if weight.dim() == 2 and bias is None and not silent[0]:
                for param, slices in self._watched:
                    if weight.untyped_storage().data_ptr() == param.untyped_storage().data_ptr():
                        parts = slices.get((weight.storage_offset() - param.storage_offset()) // param.stride(0))
                        if parts is None:
                            break
                        outputs = [part(x) for part in parts]
                        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
            return original(x, weight, bias)

        def every_token(module: Any, args: tuple[Any, ...]) -> None:
            hidden = args[0]
            count = self._owners[id(module)][1]
            tokens = hidden.reshape(-1, hidden.shape[-1])
            index = torch.arange(count).expand(tokens.shape[0], count)
            module.forward(tokens, index, torch.ones(index.shape, dtype=tokens.dtype))
            silent[0] = True

        def routed_again(_module: Any, _args: Any, _out: Any) -> None:
            silent[0] = False

        handles = []
        if all_experts:
            for owner, _ in self._owners.values():
                handles += [owner.register_forward_pre_hook(every_token), owner.register_forward_hook(routed_again)]
        functional.linear = linear
        try:
            yield
        finally:
            functional.linear = original
            silent[0] = False
            for handle in handles:
                handle.remove()
