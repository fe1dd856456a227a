"""Text output of the doctor's commands; `--json` bypasses all of this.

Tables go to stdout through rich, one summary line closes every command, and long lists are cut
to a few lines per kind with a count of the rest (the JSON carries everything). Every line and
cell passes through `terminal.printable`, since names and config strings come from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from weightsmith.core.terminal import printable

#: Piped output gets a wide virtual terminal so tables are never cut to 80 columns.
console = Console(
    highlight=False, soft_wrap=True, markup=False, emoji=False, width=None if sys.stdout.isatty() else 160
)
#: Lines shown per finding kind or status before "... and N more".
SHOWN_PER_KIND = 5
SHOWN_PATTERNS = 10


def to_json(result: Any) -> str:
    """Any result dataclass as indented JSON."""
    return json.dumps(dataclasses.asdict(result), indent=2)


def say(line: str) -> None:
    """Print one line of text that may hold checkpoint-supplied strings."""
    console.print(printable(line))


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def human_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f}"


def _bits(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_inspect(report: Any) -> None:
    say(
        f"{report.path}: {report.shards} shards, {report.tensors:,} tensors, {human_bytes(report.file_bytes)} on disk "
        f"({human_bytes(report.tensor_bytes)} tensor data)"
    )
    q = report.quantization
    if q is not None:
        kv = f"; KV cache {q.kv_cache}" if q.kv_cache else "; no KV-cache scheme"
        say(f"quantization: {q.method} {', '.join(q.formats) or '(no weight format)'} from {q.source}{kv}")
    table = Table(box=None, pad_edge=False)
    for header in (report.by, "tensors", "bytes", "share", "params", "bits/param"):
        table.add_column(header, justify="left" if header == report.by else "right", no_wrap=True)
    with_overhead = report.by != "dtype"
    if with_overhead:
        table.add_column("incl. scales", justify="right", no_wrap=True)
    for r in report.rows:
        cells = [
            printable(r.key),
            f"{r.tensors:,}",
            human_bytes(r.bytes),
            f"{r.share:.1%}",
            human_count(r.params) if r.params else "-",
            _bits(r.bits_per_param),
        ]
        table.add_row(*cells, *([_bits(r.bits_with_overhead)] if with_overhead else []))
    total = [f"{report.tensors:,}", human_bytes(report.tensor_bytes), "100.0%", human_count(report.params)]
    table.add_row("total", *total, _bits(report.bits_per_param), *([""] if with_overhead else []))
    console.print(table)
    if report.bits_per_param is not None:
        parts = " + ".join(f"{m.category} {m.bits_per_param:.3f}" for m in report.makeup if m.bits_per_param >= 0.0005)
        say(f"headline: {report.bits_per_param:.3f} bits per parameter over {human_count(report.params)} parameters")
        say(f"  made of: {parts}")
    if q is not None:
        for group in q.statuses:
            say(f"{group.status}: {group.modules:,} modules")
            for p in sorted(group.patterns, key=lambda p: (-p.modules, p.pattern))[:SHOWN_PATTERNS]:
                say(f"    {p.modules:>7,} x {p.pattern}")
            if len(group.patterns) > SHOWN_PATTERNS:
                say(f"    ... and {len(group.patterns) - SHOWN_PATTERNS} more patterns")
        for group in q.groups:
            say(f"config group {group}")
        if q.ignore:
            shown = ", ".join(q.ignore[:8]) + (f", ... ({len(q.ignore) - 8} more)" if len(q.ignore) > 8 else "")
            say(f"ignore list: {shown}")
    for note in report.notes:
        say(f"note: {note}")


def print_verify(report: Any) -> None:
    by_check: dict[str, list[Any]] = {}
    for f in report.findings:  # already in severity, then check-family order
        by_check.setdefault(f.check, []).append(f)
    for check, findings in by_check.items():
        for f in findings[:SHOWN_PER_KIND]:
            say(f"{f.severity:<7} {check:<26} {f.line()}")
        if len(findings) > SHOWN_PER_KIND:
            more = len(findings) - SHOWN_PER_KIND
            say(f"{findings[0].severity:<7} {check:<26} ... and {more:,} more like this (see --json)")
    for check in report.checks:
        if not check.ran:
            mark = "skip"
        else:
            mark = "ok  " if check.errors == 0 and check.warnings == 0 else ("FAIL" if check.errors else "warn")
        say(f"[{mark}] {check.title}: {check.scope}")
    say(report.summary)


def print_transplant(result: Any) -> None:
    for t in result.tensors[:SHOWN_PATTERNS]:
        replaced = f", replacing {', '.join(t.replaces)}" if t.replaces else ""
        say(f"copied {t.name} ({t.dtype} {t.shape}) from {t.donor_shard}{replaced}")
    if len(result.tensors) > SHOWN_PATTERNS:
        say(f"... and {len(result.tensors) - SHOWN_PATTERNS} more (see --json)")
    for note in result.notes:
        say(f"note: {note}")
    say(result.summary)


def print_diff(report: Any) -> None:
    shown: dict[str, int] = {}
    for t in report.tensors:
        if t.status == "identical":
            continue
        shown[t.status] = shown.get(t.status, 0) + 1
        if shown[t.status] > SHOWN_PER_KIND * 4:
            continue
        parts = [t.detail] if t.detail else []
        if t.max_abs_error is not None:
            parts.append(f"max abs err {t.max_abs_error:.4g}, rel err {t.relative_error:.4g}")
        say(f"{t.status:<12} {t.name}" + (": " + "; ".join(parts) if parts else ""))
    for status, n in shown.items():
        if n > SHOWN_PER_KIND * 4:
            say(f"{status:<12} ... and {n - SHOWN_PER_KIND * 4:,} more (see --json)")
    say(report.summary)
