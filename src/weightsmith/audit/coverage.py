"""Which Linear-like modules the quantization config targets, which are quantized, which ignored.

Each module gets one status by comparing what the config says with what the headers show. The
statuses that mean "the runtime will not load this as declared" are the ones `verify` reports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from weightsmith.audit.modules import Module
from weightsmith.formats.declaration import QuantDeclaration

QUANTIZED = "quantized"
IGNORED = "ignored, kept dense"
NOT_TARGETED = "not targeted, kept dense"
MISSED = "targeted but stored dense"
QUANTIZED_IGNORED = "ignored but stored quantized"
QUANTIZED_UNTARGETED = "stored quantized but not targeted"
STATUS_ORDER = (QUANTIZED, IGNORED, NOT_TARGETED, MISSED, QUANTIZED_IGNORED, QUANTIZED_UNTARGETED)


def status_of(decl: QuantDeclaration, module: Module) -> str:
    scheme, ignored = decl.resolve(module)
    return status(module, scheme is not None, ignored)


def status(module: Module, targeted: bool, ignored: bool) -> str:
    """The status of `module` once the config's answers for it are known (a caller that has its scheme
    already asks for it once: resolving a name is most of the cost of `verify` on a 100k-tensor MoE)."""
    if module.quantized:
        if ignored:
            return QUANTIZED_IGNORED
        return QUANTIZED if targeted else QUANTIZED_UNTARGETED
    if ignored:
        return IGNORED
    return MISSED if targeted else NOT_TARGETED


@dataclass
class PatternCount:
    """Modules that differ only in layer or expert number, folded into one line."""

    pattern: str
    modules: int


@dataclass
class StatusGroup:
    status: str
    modules: int
    patterns: list[PatternCount]


@dataclass
class Coverage:
    """The quantization config against the headers, for display."""

    method: str
    source: str
    formats: list[str]
    #: Each config group as `name: targets -> format`.
    groups: list[str]
    ignore: list[str]
    kv_cache: str | None
    statuses: list[StatusGroup]


def coverage(decl: QuantDeclaration, modules: dict[str, Module]) -> Coverage:
    by_status: dict[str, Counter[str]] = {s: Counter() for s in STATUS_ORDER}
    for module in modules.values():
        if module.linear_like:
            by_status[status_of(decl, module)][module.pattern] += 1
    statuses = [
        StatusGroup(status, sum(counts.values()), [PatternCount(p, n) for p, n in sorted(counts.items())])
        for status, counts in by_status.items()
        if counts
    ]
    formats = sorted({s.format for s in decl.schemes if s.format})
    groups = [f"{s.name}: {', '.join(s.targets)} -> {s.format}" for s in decl.schemes]
    return Coverage(decl.method, decl.source, formats, groups, list(decl.ignore), decl.kv_cache, statuses)
