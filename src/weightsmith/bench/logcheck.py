"""Evidence in server logs (and response text) that a configuration is not what it claims.

A benchmark can be fast for the wrong reason: a kernel that silently drops the checkpoint's
activation scales, an FP8 KV cache running with scale 1.0, weights left uninitialised, a reasoning
parser that never engaged. Servers say so in their logs, once, among thousands of lines. Every
pattern the tool looks for is in `PATTERNS` below, and nowhere else; each arm's log is run
through all of them and the report shows what matched.

Log texts are from vLLM's and llama.cpp's sources and from published server logs. Every pattern
runs on every line, and a line can be very long, so none may backtrack super-linearly: a part of
free length is either bounded (`{1,64}`) or greedy to the end of the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from weightsmith.bench.results import Evidence

#: Prefix of the line the runner writes at the top of each log to record the command; never evidence.
COMMAND_LINE_PREFIX = "$ "

INFO = "info"
WARN = "warn"
BAD = "bad"

LOG = "log"
CONTENT = "content"


@dataclass(frozen=True)
class EvidencePattern:
    """One thing to look for: where, the regex (group `value` is reported), and what it means."""

    id: str
    source: str
    regex: re.Pattern[str]
    severity: str
    meaning: str


def _p(id_: str, source: str, regex: str, severity: str, meaning: str) -> EvidencePattern:
    return EvidencePattern(id_, source, re.compile(regex, re.IGNORECASE), severity, meaning)


PATTERNS: tuple[EvidencePattern, ...] = (
    _p(
        "nvfp4-moe-backend",
        LOG,
        r"Using '?(?P<value>[A-Za-z0-9_ ]{1,64}?)'? NvFp4 MoE backend",
        INFO,
        "vLLM chose this NVFP4 MoE kernel backend",
    ),
    _p(
        "nvfp4-moe-drops-activation-scales",
        LOG,
        r"Using '?(?P<value>MARLIN|HUMMING)'? NvFp4 MoE backend",
        BAD,
        "weight-only (W4A16) MoE backend: the checkpoint's NVFP4 activation scales are not applied",
    ),
    _p(
        "fp4-marlin-fallback",
        LOG,
        r"FP4 quantization is being used\. Marlin kernel fallback",
        WARN,
        "no native FP4 on this GPU: FP4 layers run through Marlin, activation scales not applied",
    ),
    _p(
        "kv-cache-scale-1.0",
        LOG,
        r"Using KV cache scaling factor 1\.0 for fp8_e4m3",
        BAD,
        "FP8 KV cache with scale 1.0: the checkpoint's k/v scales are missing or were not loaded",
    ),
    _p(
        "reasoning-parser-autoinit-failed",
        LOG,
        r"Auto-initialization of reasoning token IDs failed",
        BAD,
        "the reasoning parser could not find its start/end tokens: reasoning may land in content",
    ),
    _p(
        "weights-not-initialized",
        LOG,
        r"(?:Following|Some)(?: text encoder)? weights (?:were|are) not initialized from checkpoint",
        BAD,
        "some weights were not loaded from the checkpoint (name mapping or missing shard)",
    ),
    _p(
        "quantization-method",
        LOG,
        r"(?:\bquantization=|'quantization': ')(?P<value>[A-Za-z0-9_.-]+)",
        INFO,
        "quantization method vLLM picked for the model",
    ),
    _p(
        "speculative-config",
        LOG,
        r"speculative_config=(?P<value>None|SpeculativeConfig\([^)]{0,4096}\))",
        INFO,
        "speculative decoding configuration vLLM runs with",
    ),
    _p(
        "gguf-file-type",
        LOG,
        r"\bfile type\s+=\s+(?P<value>\S.*)",
        INFO,
        "llama.cpp: quantization type of the GGUF file",
    ),
    _p(
        "llamacpp-draft-acceptance",
        LOG,
        r"draft acceptance = (?P<value>[0-9.]+)",
        INFO,
        "llama.cpp's own per-request acceptance line (cross-check for /metrics)",
    ),
    _p(
        "think-close-in-content",
        CONTENT,
        r"</think>",
        BAD,
        "`</think>` in response content: reasoning is not being separated from the answer",
    ),
)

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
