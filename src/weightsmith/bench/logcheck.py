"""Evidence in server logs (and response text) that a configuration is not what it claims.

A benchmark can be fast for the wrong reason: a kernel that silently drops the checkpoint's
activation scales, an FP8 KV cache running with scale 1.0, weights left uninitialised, a reasoning
parser that never engaged. Servers say so in their logs, once, among thousands of lines. Each
server kind's log patterns are in its entry in `bench/kinds.py`, the content patterns (any server)
below; `PATTERNS` joins them, and each arm's log is run through all of them (an arm of kind
`other` may still run vLLM behind a script) and the report shows what matched.

Log texts are from vLLM's and llama.cpp's sources and from published server logs. Every pattern
runs on every line, and a line can be very long, so none may backtrack super-linearly: a part of
free length is either bounded (`{1,64}`) or greedy to the end of the line.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from weightsmith.bench import kinds
from weightsmith.bench.kinds import CONTENT, KINDS, LOG, EvidencePattern
from weightsmith.bench.results import Evidence
from weightsmith.core.severity import ERROR, INFO, WARNING

# The severity scale is the project's (`weightsmith.core.severity`), re-exported for the log check's readers.
__all__ = [
    "COMMAND_LINE_PREFIX",
    "CONTENT",
    "ERROR",
    "INFO",
    "LOG",
    "PATTERNS",
    "WARNING",
    "EvidencePattern",
    "merge",
    "scan_contents",
    "scan_lines",
    "scan_log",
]

#: Prefix of the line the runner writes at the top of each log to record the command; never evidence.
COMMAND_LINE_PREFIX = "$ "

#: Patterns for the text of responses, whatever the server.
CONTENT_PATTERNS: tuple[EvidencePattern, ...] = (
    kinds.pattern(
        "think-close-in-content",
        CONTENT,
        r"</think>",
        ERROR,
        "`</think>` in response content: reasoning is not being separated from the answer",
    ),
)

PATTERNS: tuple[EvidencePattern, ...] = (*(p for k in KINDS for p in k.log_patterns), *CONTENT_PATTERNS)

_MAX_LINE = 240
_MAX_VALUES = 4


def _accumulate(found: dict[str, Evidence], pattern: EvidencePattern, line: str, value: str | None) -> None:
    ev = found.get(pattern.id)
    if ev is None:
        text = line.strip()
        found[pattern.id] = Evidence(
            pattern=pattern.id,
            meaning=pattern.meaning,
            severity=pattern.severity,
            count=1,
            first_line=text if len(text) <= _MAX_LINE else text[: _MAX_LINE - 3] + "...",
            value=value,
        )
        return
    ev.count += 1
    if value and ev.value is not None:
        values = ev.value.split(" | ")
        if value not in values and len(values) < _MAX_VALUES:
            ev.value = " | ".join([*values, value])


def scan_lines(lines: Iterable[str], source: str = LOG) -> list[Evidence]:
    """Evidence from `lines`, one entry per matching pattern, in the table's order."""
    patterns = [p for p in PATTERNS if p.source == source]
    found: dict[str, Evidence] = {}
    for line in lines:
        if line.startswith(COMMAND_LINE_PREFIX):
            continue
        for pattern in patterns:
            m = pattern.regex.search(line)
            if m:
                value = m.groupdict().get("value")
                _accumulate(found, pattern, line, value.strip() if value else None)
    return [found[p.id] for p in patterns if p.id in found]


def scan_log(path: str | Path) -> list[Evidence]:
    """Run the log patterns over a log file (missing file: nothing found)."""
    p = Path(path)
    if not p.exists():
        return []
    with p.open(encoding="utf-8", errors="replace") as f:
        return scan_lines(f, LOG)


def scan_contents(texts: Iterable[str]) -> list[Evidence]:
    """Run the content patterns over response texts; `count` is the number of responses."""
    found: dict[str, Evidence] = {}
    patterns = [p for p in PATTERNS if p.source == CONTENT]
    for text in texts:
        for pattern in patterns:
            m = pattern.regex.search(text)
            if m:
                start = max(0, m.start() - 60)
                _accumulate(found, pattern, text[start : m.end() + 60].replace("\n", " "), None)
    return [found[p.id] for p in patterns if p.id in found]


def merge(*groups: list[Evidence]) -> list[Evidence]:
    """Combine evidence from several logs of one arm: counts add, the first line is kept."""
    by_id: dict[str, Evidence] = {}
    for group in groups:
        for ev in group:
            have = by_id.get(ev.pattern)
            if have is None:
                by_id[ev.pattern] = Evidence(**vars(ev))
                continue
            have.count += ev.count
            if ev.value and have.value is not None:
                values = have.value.split(" | ")
                for v in ev.value.split(" | "):
                    if v not in values and len(values) < _MAX_VALUES:
                        values.append(v)
                have.value = " | ".join(values)
    order = [p.id for p in PATTERNS]
    return sorted(by_id.values(), key=lambda e: order.index(e.pattern) if e.pattern in order else 99)
