"""MoE experts against config.json: how many each MoE layer holds, and every expert's and the shared
expert's projection shapes.

vLLM builds each MoE layer's experts as one FusedMoE layer of `num_experts` experts sized by the
config (`moe_intermediate_size`, Mixtral's `intermediate_size`), and a shared expert of its own size;
a checkpoint with an expert short, an expert missing a projection, or projections of another size
fails to load there, or loads experts never written. The config keys differ by family, so each
family states them (`weightsmith.families`, `Family.experts`); a family that states none gets one
info finding saying its experts were not checked. Quantized projections are compared by their logical shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import islice
from typing import Any

from weightsmith.audit.check_arch import logical_shape
from weightsmith.audit.findings import ERROR, INFO, Finding
from weightsmith.audit.modules import Located, Module
from weightsmith.audit.values import SmallReads
from weightsmith.families import FAMILIES, Router
from weightsmith.formats.declaration import QuantDeclaration
from weightsmith.io import names

#: The expert indices a finding lists.
_SHOWN = 5
#: A shared expert's projections: those that read the hidden state (out = its size) and the one that writes it.
SHARED_READS, SHARED_WRITES = ("gate_proj", "up_proj"), "down_proj"
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
    family = FAMILIES.get(model_type or "")
    sizes = family.experts if family is not None else None
    if family is None or sizes is None:
        checked = ", ".join(t for t, f in FAMILIES.items() if f.experts is not None)
        return [
            Finding(
                "moe.not-checked",
                INFO,
                f"model_type {model_type}: no expectations for its experts, so their count and shapes were not "
                f"checked (checked for {checked})",
                "config.json",
            )
        ], f"model_type {model_type}: experts not checked"
    experts_key = sizes.count_key(config)
    hidden, count, size = config.get("hidden_size"), config.get(experts_key), config.get(sizes.size)
    found: list[Finding] = []
    for key, value in (("hidden_size", hidden), (experts_key, count), (sizes.size, size)):
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
        want = _want(names.leaf(name), hidden, size, sizes.reads, sizes.writes)
        found += _shape(module, want, f"{sizes.size} {size}, hidden_size {hidden}", decl, reads)
    if shared and sizes.shared is not None:
        shared_size = sizes.shared[0](config)
        if type(shared_size) is int and shared_size > 0:
            for name, module in sorted(shared.items()):
                want = _want(names.leaf(name), hidden, shared_size, SHARED_READS, SHARED_WRITES)
                found += _shape(module, want, f"{sizes.shared[1]} {shared_size}, hidden_size {hidden}", decl, reads)
    blocks = sorted({_ROUTED.match(n).group("layer").removesuffix(".experts") for n in routed})  # type: ignore[union-attr]
    router = family.router
    if router is not None:
        found += _routing(config, router, count, experts_key)
        found += _routers(modules, blocks, router, count, hidden, experts_key)
        found += _unasked_bias(config, modules, blocks, router)
    routing = f", {router.scoring} scores{', grouped' if router.grouped else ''}" if router is not None else ""
    return found, (
        f"{len(blocks):,} MoE layers of {count:,} experts ({experts_key}){routing}, {len(shared):,} shared projections"
    )


def _routing(config: Mapping[str, Any], router: Router, count: int, count_key: str) -> list[Finding]:
    """The config's top-k (and expert groups) against the expert count: vLLM's top-k picks `top_k` of
    the layer's experts, and grouped top-k splits them into `n_group` equal groups."""
    found = []
    top_k = config.get(router.top_k)
    if top_k is not None and (type(top_k) is not int or not 0 < top_k <= count):
        found.append(_config(f"{router.top_k} is {top_k!r}, not a whole number from 1 to {count_key} {count:,}"))
    if router.grouped:
        groups, best = config.get("n_group"), config.get("topk_group")
        if groups is not None and (type(groups) is not int or groups <= 0 or count % groups):
            found.append(
                _config(f"n_group is {groups!r}, which does not split {count_key} {count:,} into equal groups")
            )
        elif type(groups) is int and best is not None and (type(best) is not int or not 0 < best <= groups):
            found.append(_config(f"topk_group is {best!r}, not a whole number from 1 to n_group {groups}"))
    return found


def _unasked_bias(
    config: Mapping[str, Any], modules: dict[str, Module], blocks: list[str], router: Router
) -> list[Finding]:
    """A score-correction bias in a checkpoint whose config does not ask the runtime to build one: vLLM has
    no parameter to load it into and stops at the first (a KeyError naming it)."""
    if router.score_bias is None or router.score_bias_when is None:
        return []
    key, value = router.score_bias_when
    if config.get(key) == value:
        return []
    for block in blocks:
        name = f"{block}.{router.score_bias}"
        located = _tensor(modules, name)
        if located is not None:
            return [
                Finding(
                    "moe.router",
                    ERROR,
                    f"is in the checkpoint, but config.json's {key} is {config.get(key)!r}, not {value!r}: vLLM builds "
                    "no parameter for it and refuses the checkpoint at load (KeyError)",
                    located.shard,
                    name,
                )
            ]
    return []


def _tensor(modules: dict[str, Module], name: str) -> Located | None:
    """The header entry of tensor `name` among the modules' parameters, or None."""
    module, _, param = name.rpartition(".")
    return modules[module].params.get(param) if module in modules else None


def _config(message: str) -> Finding:
    return Finding("moe.config", ERROR, f"{message}; vLLM routes the experts by it", "config.json")


def _routers(
    modules: dict[str, Module], blocks: list[str], router: Router, count: int, hidden: int, count_key: str
) -> list[Finding]:
    """Each MoE layer's router [experts, hidden], its score-correction bias [experts] where it has one,
    and the shared expert's gate [1, hidden] where the family gates it: vLLM loads each into a parameter
    of that shape, and refuses a model missing its router."""
    found = []
    why = f"{count_key} {count:,}, hidden_size {hidden}"
    for block in blocks:
        wanted: list[tuple[str, tuple[int, ...], str, bool]] = [
            (f"{block}.{router.module}.{names.WEIGHT}", (count, hidden), why, True)
        ]
        if router.score_bias is not None:
            wanted.append((f"{block}.{router.score_bias}", (count,), f"{count_key} {count:,}", False))
        if router.shared_gate and f"{block}.shared_expert.down_proj" in modules:
            wanted.append((f"{block}.shared_expert_gate.{names.WEIGHT}", (1, hidden), f"hidden_size {hidden}", True))
        for name, shape, words, required in wanted:
            located = _tensor(modules, name)
            if located is None and required:
                found.append(
                    Finding(
                        "moe.router",
                        ERROR,
                        f"{block} has routed experts but no {name}: vLLM builds one for every MoE layer "
                        "and refuses a checkpoint that lacks it",
                        None,
                        name,
                    )
                )
            elif located is not None and tuple(located.info.shape) != shape:
                found.append(
                    Finding(
                        "moe.router",
                        ERROR,
                        f"is {list(located.info.shape)} but config.json implies {list(shape)} ({words})",
                        located.shard,
                        name,
                    )
                )
    return found


def _want(proj: str, hidden: int, size: int, reading: tuple[str, ...], writing: str) -> tuple[int, int] | None:
    if proj in reading:
        return (size, hidden)
    return (hidden, size) if proj == writing else None


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
