"""The config groups of a mixed recipe: compact targets that resolve every module to its own rule.

vLLM resolves a module's scheme by its name first (the first target, over all groups in order,
that equals the name or `re.match`es it), then by class name (`"Linear"` is a substring of every
Linear class, fused ones included), and only then, for a fused layer (`qkv_proj`), by its shards'
names (`targets.Targets.resolve`). So a mixed checkpoint names its targets and never writes
`"Linear"`: a class target would claim a fused layer whose shards belong to another group. No
module is named by two groups, so compressed-tensors' precedence (exact names before regexes)
resolves every module to the same group as vLLM's.

Targets are written compactly, as real mixed checkpoints write them: every layer or expert index
becomes `\\d+`, and names that then differ only in their last component share one alternation,
e.g. `re:model\\.layers\\.\\d+\\.mlp\\.experts\\.\\d+\\.(down_proj|gate_proj|up_proj)$`. A compact pattern
that would also match a module another group quantizes is replaced by the exact names it stood for.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.targets import Targets
from weightsmith.io import names
from weightsmith.quantization.recipe import Recipe, Rule

#: The top-level format of a config whose groups use different formats (compressed-tensors').
MIXED_PRECISION = "mixed-precision"
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _shape(module: str) -> str:
    """The module's name with every index generalised, as an escaped regex without its last component."""
    parent, _, _leaf = module.rpartition(".")
    parts = _INDEX.split(parent)
    return r"\d+".join(re.escape(p) for p in parts)


def compact_targets(modules: Iterable[str], others: set[str]) -> list[str]:
    """Targets matching every one of `modules` and none of `others` (modules another group quantizes)."""
    by_shape: dict[str, set[str]] = defaultdict(set)
    members: dict[str, list[str]] = defaultdict(list)
    for module in modules:
        key = _shape(module)
        by_shape[key].add(names.leaf(module))
        members[key].append(module)
    targets: list[str] = []
    for key in sorted(by_shape):
        leaves = sorted(by_shape[key])
        leaf = re.escape(leaves[0]) if len(leaves) == 1 else "(" + "|".join(re.escape(v) for v in leaves) + ")"
        prefix = f"{key}\\." if key else ""
        pattern = f"re:{prefix}{leaf}$"
        compact = Targets([pattern], "compact target")
        if any(compact.matches(o) for o in others):
            targets.extend(sorted(members[key]))  # the compact form would claim another group's module
        else:
            targets.append(pattern)
    return targets


def mixed_config(recipe: Recipe, quantized: dict[str, Rule], ignore: list[str]) -> dict[str, Any]:
    """The `quantization_config` of a recipe whose rules give `quantized` (module -> rule) their schemes.

    One group per rule that quantized anything, in rule order, named after its scheme's preset
    (`W4A16`, `NVFP4A16`; a second rule with the same preset gets `_2`).
    """
    groups: dict[str, dict[str, Any]] = {}
    formats: list[str] = []
    for rule in recipe.rules:
        mine = sorted(m for m, r in quantized.items() if r is rule)
        if not mine:
            continue
        others = {m for m, r in quantized.items() if r is not rule}
        name, n = rule.scheme.config_group_name, 1
        while name in groups:
            n += 1
            name = f"{rule.scheme.config_group_name}_{n}"
        scheme = rule.scheme
        groups[name] = ct.config_group(
            scheme.FORMAT, scheme.weight_args(), compact_targets(mine, others), scheme.input_args()
        )
        formats.append(scheme.FORMAT)
    fmt = formats[0] if len(set(formats)) == 1 else MIXED_PRECISION
    return ct.quantization_config_of(groups, fmt, ignore)
