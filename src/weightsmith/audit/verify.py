"""Everything that can be wrong on disk before a checkpoint is uploaded or served.

Checks run in families (files, safetensors rules, index, quantization config, KV-cache scales,
runtime names, and with `scan_values` the values themselves); each family reports what it
covered, so a clean result says what was actually looked at. Errors mean a runtime will fail or,
worse, load something other than what was meant; warnings are tolerated by runtimes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from weightsmith.audit.check_kv import check_kv_scales
from weightsmith.audit.check_names import check_runtime_names
from weightsmith.audit.check_quant import check_quantization
from weightsmith.audit.check_values import scan_values
from weightsmith.audit.findings import ERROR, SEVERITY_ORDER, WARNING, Finding
from weightsmith.audit.modules import group_modules
from weightsmith.audit.quant_config import read_declaration
from weightsmith.audit.survey import Survey, gc_paused, survey
from weightsmith.audit.values import SmallReads


@dataclass(frozen=True)
class Family:
    """A group of checks, recognised by the prefixes of their ids."""

    id: str
    title: str
    prefixes: tuple[str, ...]

    def owns(self, check: str) -> bool:
        return check.startswith(self.prefixes)


FAMILIES = (
    Family("files", "files are real and readable (no git-LFS pointers, valid JSON)", ("lfs-pointer", "file.", "json.")),
    Family(
        "safetensors",
        "safetensors rules (header size, JSON, dtypes, offsets, sizes, duplicate names)",
        ("header.", "offsets.", "size."),
    ),
    Family("index", "index resolves both ways (entries, shards, total_size)", ("index.", "shard.")),
    Family("quantization", "quantization config against the tensors", ("quant.",)),
    Family("kv-cache", "KV-cache scales for a declared KV-cache scheme", ("kv.",)),
    Family("names", "names the runtime loads for this architecture", ("names.",)),
    Family("values", "values: NaN/Inf and all-zero tensors", ("values.",)),
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
    with gc_paused():
        found = survey(path)
        scopes = _structure_scopes(found)
        findings = list(found.findings)
        if found.single_file:
            _skip(scopes, NOT_RUN + "a single file has no config to compare with")
        elif found.config is None:
            _skip(scopes, NOT_RUN + "no readable config.json")
        else:
            findings += _semantic_checks(found, scopes)
    if scan:
        more, scopes["values"] = scan_values(found)
        findings += more
    else:
        scopes["values"] = NOT_RUN + "add --scan-values to read every value"
    findings.sort(
        key=lambda f: (SEVERITY_ORDER[f.severity], _family_rank(f.check), f.check, f.file or "", f.tensor or "")
    )
    checks = [
        CheckSummary(
            fam.id,
            fam.title,
            scopes.get(fam.id, ""),
            not scopes.get(fam.id, "").startswith(NOT_RUN),
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


def _family_rank(check: str) -> int:
    return next((i for i, fam in enumerate(FAMILIES) if fam.owns(check)), len(FAMILIES))


def _skip(scopes: dict[str, str], why: str) -> None:
    for family in ("quantization", "kv-cache", "names"):
        scopes[family] = why


def _structure_scopes(found: Survey) -> dict[str, str]:
    """What the file, header and index checks covered, and what they could not reach."""
    files = "1 file" if found.single_file else f"config.json, index and {len(found.shard_names)} shard(s)"
    unreadable = set(found.unreadable_shards)
    shards = f"{len(found.headers)} of {len(found.shard_names)} shard header(s) parsed"
    if found.index is None:
        return {"files": files, "safetensors": shards, "index": "no index (single shard or folder of shards)"}
    weight_map = found.index["weight_map"]
    index = f"{len(weight_map):,} index entries"
    blind = sum(1 for shard in weight_map.values() if shard in unreadable)
    if blind:
        index += f" ({blind:,} in unreadable shards, not resolved)"
    return {"files": files, "safetensors": shards, "index": index}


def _semantic_checks(found: Survey, scopes: dict[str, str]) -> list[Finding]:
    decl = read_declaration(found.config, found.hf_quant_config)
    modules = group_modules(found.headers)
    findings: list[Finding] = []
    with SmallReads(found.root, found.headers) as reads:
        more, scopes["quantization"] = check_quantization(decl, modules, reads)
        findings += more
        more, scopes["kv-cache"] = check_kv_scales(decl, modules, found.tensors, reads)
        findings += more
    more, scopes["names"] = check_runtime_names(found.config, found.tensors)
    return findings + more
