"""MoE experts against config.json: how many each MoE layer holds, and every expert's and the shared
expert's projection shapes.

vLLM builds each MoE layer's experts as one FusedMoE layer of `num_experts` experts sized by the
config (`moe_intermediate_size`, Mixtral's `intermediate_size`), and a shared expert of its own size;
a checkpoint with an expert short, an expert missing a projection, or projections of another size
fails to load there, or loads experts never written. The config keys differ by family, so they are
stated per `model_type` here (`MOE_SIZES`); a family not listed gets one info finding saying its
experts were not checked. Quantized projections are compared by their logical shape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from weightsmith.audit.check_arch import logical_shape
from weightsmith.audit.findings import ERROR, INFO, Finding
from weightsmith.audit.modules import Module
from weightsmith.audit.values import SmallReads
from weightsmith.formats.declaration import QuantDeclaration
from weightsmith.io import names

#: A size config.json gives, or derives from other fields (None where the config lacks them).
Size = Callable[[Mapping[str, Any]], Any]


def _key(key: str) -> Size:
    return lambda config: config.get(key)


def _deepseek_shared(config: Mapping[str, Any]) -> Any:
    shared, size = config.get("n_shared_experts"), config.get("moe_intermediate_size")
    return shared * size if type(shared) is int and type(size) is int else None


@dataclass(frozen=True)
class MoeSizes:
    """Where a family's config says how many routed experts an MoE layer has, each one's intermediate
    size, and the shared expert's (None: the family has none), each with the words a finding uses."""

    experts: str
    expert_size: str
    shared_size: tuple[Size, str] | None = None
    #: Other keys transformers writes the expert count under (its config's `attribute_map`).
    aliases: tuple[str, ...] = ()

    def experts_key(self, config: Mapping[str, Any]) -> str:
        """The key config.json gives the expert count under: `experts`, else the first alias present."""
        return next((k for k in (self.experts, *self.aliases) if k in config), self.experts)


#: `model_type` -> its MoE sizes.
MOE_SIZES: dict[str, MoeSizes] = {
    "qwen2_moe": MoeSizes(
        "num_experts",
        "moe_intermediate_size",
        (_key("shared_expert_intermediate_size"), "shared_expert_intermediate_size"),
    ),
    "qwen3_moe": MoeSizes("num_experts", "moe_intermediate_size", aliases=("num_local_experts",)),
    "laguna": MoeSizes(
        "num_experts",
        "moe_intermediate_size",
        (_key("shared_expert_intermediate_size"), "shared_expert_intermediate_size"),
    ),
    "mixtral": MoeSizes("num_local_experts", "intermediate_size"),
    "deepseek_v3": MoeSizes(
        "n_routed_experts", "moe_intermediate_size", (_deepseek_shared, "n_shared_experts x moe_intermediate_size")
    ),
}
#: The expert indices a finding lists.
_SHOWN = 5
#: An expert's projections: those that read the hidden state (out = intermediate) and the one that
#: writes it (out = hidden), by the names checkpoints give them (Mixtral's w1/w3/w2).
READS_HIDDEN, WRITES_HIDDEN = ("gate_proj", "up_proj", "w1", "w3"), ("down_proj", "w2")
#: `...experts.<e>.<projection>`: the MoE layer, the expert, the projection.
#: An index of more digits is no expert any runtime builds (and a long one no int to parse cheaply).
_ROUTED = re.compile(r"^(?P<layer>.+\.experts)\.(?P<expert>\d{1,9})\.(?P<proj>[A-Za-z0-9_]+)$")


def check_experts(
    config: Mapping[str, Any] | None, decl: QuantDeclaration | None, modules: dict[str, Module], reads: SmallReads
) -> tuple[list[Finding], str]:
    """Experts per MoE layer against the config's count, each expert's projections all there, and every
    routed and shared expert projection's shape against the config's sizes."""
    config = config or {}
    routed = {
        m.name: m for m in modules.values() if m.linear_like and _ROUTED.match(m.name) and names.expert_layer(m.name)
    }
    # a shared expert's projections (`...shared_expert.gate_proj`; its gate `shared_expert_gate` is a router)
    shared = {
        m.name: m
        for m in modules.values()
        if m.linear_like and names.category(f"{m.name}.{names.WEIGHT}") == names.SHARED_EXPERT
    }
    if not routed and not shared:
        return [], "no MoE experts"
    model_type = names.model_type(dict(config))
    sizes = MOE_SIZES.get(model_type or "")
    if sizes is None:
        return [
            Finding(
                "moe.not-checked",
                INFO,
                f"model_type {model_type}: no expectations for its experts, so their count and shapes were not "
                f"checked (checked for {', '.join(MOE_SIZES)})",
                "config.json",
            )
        ], f"model_type {model_type}: experts not checked"
    experts_key = sizes.experts_key(config)
    hidden, count, size = config.get("hidden_size"), config.get(experts_key), config.get(sizes.expert_size)
    found: list[Finding] = []
    for key, value in (("hidden_size", hidden), (experts_key, count), (sizes.expert_size, size)):
        if value is None:  # transformers' default then, which is the class's to know
            note = f"config.json has no {key}, so the experts were not checked against it"
            return [Finding("moe.not-checked", INFO, note, "config.json")], f"no {key}: experts not checked"
        if type(value) is not int or value <= 0:
            found.append(
                Finding(
                    "moe.config",
                    ERROR,
                    f"{key} is {value!r}, not a positive integer; vLLM sizes the experts by it",
                    "config.json",
                )
            )
    if found:
        return found, "config.json's expert sizes are not sizes"
    assert isinstance(hidden, int) and isinstance(count, int) and isinstance(size, int)
    found += _counts(routed, count, experts_key)
    for name, module in sorted(routed.items()):
        proj = names.leaf(name)
        found += _shape(
            module, _want(proj, hidden, size), f"{sizes.expert_size} {size}, hidden_size {hidden}", decl, reads
        )
    if shared and sizes.shared_size is not None:
        shared_size = sizes.shared_size[0](config)
        if type(shared_size) is int and shared_size > 0:
            for name, module in sorted(shared.items()):
                found += _shape(
                    module,
                    _want(names.leaf(name), hidden, shared_size),
                    f"{sizes.shared_size[1]} {shared_size}, hidden_size {hidden}",
                    decl,
                    reads,
                )
    layers = len({_ROUTED.match(n).group("layer") for n in routed})  # type: ignore[union-attr]
    return found, f"{layers:,} MoE layers of {count:,} experts ({experts_key}), {len(shared):,} shared projections"


def _want(proj: str, hidden: int, size: int) -> tuple[int, int] | None:
    if proj in READS_HIDDEN:
        return (size, hidden)
    return (hidden, size) if proj in WRITES_HIDDEN else None


def _counts(routed: dict[str, Module], count: int, key: str) -> list[Finding]:
    """Per MoE layer: experts 0 to count-1, no more, each with the projections the layer's others have."""
    layers: dict[str, dict[int, set[str]]] = {}
    for name in routed:
        match = _ROUTED.match(name)
        assert match is not None
        layers.setdefault(match["layer"], {}).setdefault(int(match["expert"]), set()).add(match["proj"])
    found: list[Finding] = []
    for layer, experts in sorted(layers.items()):
        # the config's count may be any number: the missing are counted, and only the first few listed
        absent = count - sum(1 for e in experts if e < count)
        missing = list(islice((e for e in range(count) if e not in experts), _SHOWN))
        beyond = sorted(e for e in experts if e >= count)
        if absent or beyond:
            what = []
            if absent:
                what.append(f"no expert {_listed(missing, absent)}")
            if beyond:
                what.append(f"expert {_listed(beyond[:_SHOWN], len(beyond))} beyond them")
            found.append(
                Finding(
                    "moe.expert-count",
                    ERROR,
                    f"{layer} holds {len(experts):,} experts but config.json's {key} is {count:,}: "
                    f"{' and '.join(what)}; vLLM builds {count:,}",
                    "config.json",
                )
            )
        every = set().union(*experts.values())
        for expert, projections in sorted(experts.items()):
            lacking = sorted(every - projections)
            if lacking:
                found.append(
                    Finding(
                        "moe.expert-incomplete",
                        ERROR,
                        f"{layer}.{expert} has no {', '.join(lacking)}, which the layer's other experts have; "
                        "vLLM loads every expert's projections into one FusedMoE layer",
                        "config.json",
                    )
                )
    return found


def _listed(first: list[int], total: int) -> str:
    """The first indices of `total`, and how many more."""
    return ", ".join(str(i) for i in first) + (f" and {total - len(first):,} more" if total > len(first) else "")


def _shape(
    module: Module, want: tuple[int, int] | None, why: str, decl: QuantDeclaration | None, reads: SmallReads
) -> list[Finding]:
    actual = logical_shape(module, decl, reads)
    if want is None or actual is None or tuple(actual) == want:
        return []
    main = module.params.get(names.WEIGHT) or module.params.get(names.WEIGHT_PACKED)
    return [
        Finding(
            "moe.shape",
            ERROR,
            f"is {list(actual)} but config.json implies {list(want)} ({why})",
            main.shard if main else None,
            f"{module.name}.{names.WEIGHT}",
        )
    ]
