"""Everything that can be wrong on disk before a checkpoint is uploaded or served.

Checks run in families (files, safetensors rules, index, quantization config, KV-cache scales,
runtime names, and with `scan_values` the values themselves); each family reports what it
covered, so a clean result says what was actually looked at. A family is one `Family` entry: its
id prefixes, its check (given one `CheckContext`) and what it needs; what is skipped, and why,
follows from the needs. Errors mean a runtime will fail or,
worse, load something other than what was meant; warnings are tolerated by runtimes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from weightsmith.audit.check_arch import check_architecture
from weightsmith.audit.check_experts import check_experts
from weightsmith.audit.check_kv import check_kv_scales
from weightsmith.audit.check_names import check_runtime_names
from weightsmith.audit.check_quant import check_quantization
from weightsmith.audit.check_values import scan_values
from weightsmith.audit.findings import ERROR, INFO, SEVERITY_ORDER, WARNING, Finding
from weightsmith.audit.modules import Module, group_modules
from weightsmith.audit.survey import Survey, gc_paused, survey
from weightsmith.audit.values import SmallReads
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.declaration import QuantDeclaration, read_declaration
from weightsmith.io.manifest import MANIFEST_FILE, load_manifest

#: What a family may need beyond the survey: a config.json to compare the tensors with, or leave
#: to read every value (`--scan-values`). A family that needs neither is structural: it reports
#: on the files as found.
Need = Literal["config", "scan"]
CONFIG: Need = "config"
SCAN: Need = "scan"


@dataclass
class CheckContext:
    """What a family's check reads: the survey, and what is derived from it once, when first used."""

    survey: Survey
    #: Small tensor values (scales, shapes), one open reader per shard for the whole run.
    reads: SmallReads

    @cached_property
    def declaration(self) -> QuantDeclaration | None:
        """The quantization config.json (or hf_quant_config.json) declares, if any."""
        return read_declaration(self.survey.config, self.survey.hf_quant_config)

    @cached_property
    def modules(self) -> dict[str, Module]:
        """The tensors grouped by the module they belong to."""
        return group_modules(self.survey.headers)


#: A family's check: its findings (beyond the survey's own) and a few words on what it covered.
Check = Callable[[CheckContext], tuple[list[Finding], str]]


@dataclass(frozen=True)
class Family:
    """A group of checks, recognised by the prefixes of their ids, with the function that runs them."""

    id: str
    title: str
    prefixes: tuple[str, ...]
    check: Check
    needs: frozenset[Need] = frozenset()

    def owns(self, check: str) -> bool:
        return check.startswith(self.prefixes)

    @property
    def structural(self) -> bool:
        """True for a family that reads only the files as surveyed (no config, no values)."""
        return not self.needs


def _files(ctx: CheckContext) -> tuple[list[Finding], str]:
    found = ctx.survey
    return [], "1 file" if found.single_file else f"config.json, index and {len(found.shard_names)} shard(s)"


def _safetensors(ctx: CheckContext) -> tuple[list[Finding], str]:
    found = ctx.survey
    return [], f"{len(found.headers)} of {len(found.shard_names)} shard header(s) parsed"


def _index(ctx: CheckContext) -> tuple[list[Finding], str]:
    """What the index checks resolved, and what lies in shards they could not read."""
    found = ctx.survey
    if found.index is None:
        return [], "no index (single shard or folder of shards)"
    weight_map = found.index["weight_map"]
    unreadable = set(found.unreadable_shards)
    index = f"{len(weight_map):,} index entries"
    blind = sum(1 for shard in weight_map.values() if shard in unreadable)
    if blind:
        index += f" ({blind:,} in unreadable shards, not resolved)"
    return [], index


# The structural families' findings come from the survey itself (`Survey.findings`); their checks
# say what it covered.
FAMILIES = (
    Family(
        "files",
        "files are real and readable (no git-LFS pointers, valid JSON)",
        ("lfs-pointer", "file.", "json."),
        _files,
    ),
    Family(
        "safetensors",
        "safetensors rules (header size, JSON, dtypes, offsets, sizes, duplicate names)",
        ("header.", "offsets.", "size."),
        _safetensors,
    ),
    Family("index", "index resolves both ways (entries, shards, total_size)", ("index.", "shard."), _index),
    Family(
        "architecture",
        "tensors against config.json's architecture (every layer, embedding and head; shapes)",
        ("arch.",),
        lambda ctx: check_architecture(
            ctx.survey.config,
            ctx.declaration,
            ctx.modules,
            ctx.survey.tensors,
            ctx.reads,
            len(ctx.survey.unreadable_shards),
        ),
        frozenset({CONFIG}),
    ),
    Family(
        "experts",
        "MoE experts against config.json (experts per layer, every projection's shape)",
        ("moe.",),
        lambda ctx: check_experts(ctx.survey.config, ctx.declaration, ctx.modules, ctx.reads),
        frozenset({CONFIG}),
    ),
    Family(
        "quantization",
        "quantization config against the tensors",
        ("quant.",),
        lambda ctx: check_quantization(ctx.declaration, ctx.modules, ctx.reads),
        frozenset({CONFIG}),
    ),
    Family(
        "kv-cache",
        "KV-cache scales for a declared KV-cache scheme",
        ("kv.",),
        lambda ctx: check_kv_scales(ctx.declaration, ctx.modules, ctx.survey.tensors, ctx.reads),
        frozenset({CONFIG}),
    ),
    Family(
        "names",
        "names the runtime loads for this architecture",
        ("names.",),
        lambda ctx: check_runtime_names(ctx.survey.config, ctx.survey.tensors),
        frozenset({CONFIG}),
    ),
    Family(
        "values",
        "values: NaN/Inf and all-zero tensors",
        ("values.",),
        lambda ctx: scan_values(ctx.survey),
        frozenset({SCAN}),
    ),
)


#: How a scope says that its family did not run.
NOT_RUN = "not run: "


@dataclass
class CheckSummary:
    id: str
    title: str
    #: What the family looked at, or why it did not run.
    scope: str
    ran: bool
    errors: int
    warnings: int


@dataclass
class VerifyReport:
    path: str
    clean: bool
    errors: int
    warnings: int
    findings: list[Finding]
    checks: list[CheckSummary]
    summary: str
    seconds: float


def verify(path: str | Path, scan: bool = False) -> VerifyReport:
    """Run every check on the checkpoint at `path` (a folder or one `.safetensors` file)."""
    start = time.perf_counter()
    scopes: dict[str, str] = {}
    with gc_paused():
        found = survey(path)
        findings = list(found.findings)
        with SmallReads(found.root, found.headers) as reads:
            ctx = CheckContext(found, reads)
            for family in FAMILIES:
                why_not = _why_not(family, found, scan)
                if why_not is not None:
                    scopes[family.id] = NOT_RUN + why_not
                    continue
                more, scopes[family.id] = family.check(ctx)
                findings += more
        findings += _pre_pass_note(found)
    findings.sort(
        key=lambda f: (SEVERITY_ORDER[f.severity], _family_rank(f.check), f.check, f.file or "", f.tensor or "")
    )
    checks = [
        CheckSummary(
            fam.id,
            fam.title,
            scopes[fam.id],
            not scopes[fam.id].startswith(NOT_RUN),
            sum(1 for f in findings if fam.owns(f.check) and f.severity == ERROR),
            sum(1 for f in findings if fam.owns(f.check) and f.severity == WARNING),
        )
        for fam in FAMILIES
    ]
    errors = sum(1 for f in findings if f.severity == ERROR)
    warnings = sum(1 for f in findings if f.severity == WARNING)
    what = f"{len(found.headers)}/{len(found.shard_names)} shards read, {len(found.tensors):,} tensors"
    if errors:
        summary = f"verify: {errors:,} error(s), {warnings:,} warning(s) in {path} ({what})"
    else:
        tolerated = f" with {warnings:,} warning(s)" if warnings else ""
        ran = sum(1 for c in checks if c.ran)
        skipped = f", {len(checks) - ran} skipped" if ran < len(checks) else ""
        summary = f"verify: clean, {ran} check families passed{tolerated}{skipped} on {path} ({what})"
    return VerifyReport(
        str(path), errors == 0, errors, warnings, findings, checks, summary, time.perf_counter() - start
    )


def _pre_pass_note(found: Survey) -> list[Finding]:
    """A note, when the folder's manifest records a pre-pass, that the tensors it changed differ from
    the source by design: compared with the source (`weightsmith diff`), they are not corruption."""
    path = found.root / MANIFEST_FILE
    if not path.is_file():
        return []
    try:
        record = load_manifest(path).pre_pass
    except WeightsmithError:
        return []  # the card check reports a manifest it cannot read; verify checks the checkpoint
    if record is None:
        return []
    shown = ", ".join(record.changed[:2]) + (", ..." if len(record.changed) > 2 else "")
    return [
        Finding(
            "manifest.pre-pass",
            INFO,
            f"quantized after --pre-pass {record.name}: the weights were balanced before quantizing, and "
            f"{len(record.changed)} unquantized tensor(s) ({shown}) hold the folded scales, so they differ "
            "from the source by design, computing the same function",
            MANIFEST_FILE,
        )
    ]


def _family_rank(check: str) -> int:
    return next((i for i, fam in enumerate(FAMILIES) if fam.owns(check)), len(FAMILIES))


def _why_not(family: Family, found: Survey, scan: bool) -> str | None:
    """Why `family` cannot run on this checkpoint, from what it needs; None when it can."""
    if CONFIG in family.needs:
        if found.single_file:
            return "a single file has no config to compare with"
        if found.config is None:
            return "no readable config.json"
    if SCAN in family.needs and not scan:
        return "add --scan-values to read every value"
    return None
