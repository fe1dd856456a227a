"""Speculative-decoding acceptance from a server's Prometheus `/metrics`, as window deltas.

The metric names are each server kind's (`bench/kinds.py`). vLLM registers counters
`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens` and
`..._num_accepted_tokens_per_pos` (labels `model_name`, `engine`, and `position`), exposed with the
`_total` suffix (vllm/v1/spec_decode/metrics.py); llama.cpp's llama-server (`--metrics`) exposes the
same four under `llamacpp:` with only a `position` label, and updates them when a request ends.

Definitions (vLLM's `SpecDecodingProm` docstrings; llama.cpp uses the same):
    acceptance rate        = d(accepted_tokens) / d(draft_tokens)
    mean acceptance length = 1 + d(accepted_tokens) / d(drafts)      (counts the bonus token)
    per-position rate[i]   = d(accepted_per_pos[i]) / d(drafts)

A kind whose /metrics has no such counters (`kinds.CounterlessMetrics`) is recognised by its prefix,
and each of its windows is `unavailable` with the kind's reason: acceptance absent, never zero.

Counters are summed over `engine` (one series per data-parallel engine) and filtered by
`model_name` where that label exists. A window in which the server restarted is void (the delta
would mix two processes): a counter went down, or a counter's `_created` time or the process start
time changed (a restart followed by enough requests can climb back past the old value).

A server's numbers are not trusted: a window whose counters are not counts (NaN, infinite, negative,
past 2**53 where a float stops counting exactly, a draft position past `MAX_POSITION`), or whose
`_created` or start time is not finite, is `invalid`, naming the series, and gives no figures.
Every scrape is one read through `serverio`: its deadline and byte cap hold however the server answers.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from weightsmith.bench import kinds, serverio
from weightsmith.bench.kinds import CounterlessMetrics, ServerKind, SpecMetricNames, counterless_metrics, metric_names
from weightsmith.core.terminal import one_line

#: Every kind's spec-decode names (`bench/kinds.py`); a server is matched against all of them and
#: the arm's kind is checked against the one found (`kind_mismatch`).
FLAVOURS = metric_names()
#: Kinds whose /metrics is known but has no spec-decode counters: their acceptance is absent, not zero.
COUNTERLESS = counterless_metrics()

#: prometheus_client's process collector: changes when the server process is a new one.
PROCESS_START = "process_start_time_seconds"

MODEL_LABEL = "model_name"
POSITION_LABEL = "position"

#: Window status values, as written to the results file.
OK = "ok"
UNAVAILABLE = "unavailable"
NOT_SPECULATING = "not-speculating"
NO_DRAFTS = "no-drafts"
VOID = "void"
INVALID = "invalid"

#: The highest draft position read from a per-position counter's label: preflight's `--k` stops at
#: 1,024 drafted tokens, and a label of 10**9 would otherwise size a list of a billion rates.
MAX_POSITION = 1024
_POSITION = re.compile(r"[0-9]{1,4}")
#: How much of a series' name and labels a window's detail shows.
_SHOWN_SERIES = 160


@dataclass
class Snapshot:
    """Every sample of one scrape: name -> list of (labels, value)."""

    samples: dict[str, list[tuple[dict[str, str], float]]]


@dataclass
class SpecWindow:
    """Acceptance over one measured window; `status` says why a number is missing."""

    status: str
    detail: str = ""
    flavour: str | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_pos: list[float] = field(default_factory=list)
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position_rate: list[float] = field(default_factory=list)


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse Prometheus text with prometheus_client's parser, keyed by sample name."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


class MetricsUnavailable(Exception):
    """The server has no usable /metrics endpoint; the message (one line, naming the URL) says what
    happened, and `timed_out` whether the scrape ran out of time."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def metrics_url(base_url: str) -> str:
    """A server's Prometheus endpoint: what `scrape` reads and a window's detail names."""
    return base_url.rstrip("/") + "/metrics"


def scrape(client: httpx.Client, base_url: str, deadline_s: float | None = None) -> Snapshot:
    """GET /metrics once, within `deadline_s` (default `serverio.METRICS_DEADLINE_S`) and
    `serverio.MAX_METRICS_BYTES`; raise `MetricsUnavailable` rather than return anything like zero."""
    url = metrics_url(base_url)
    try:
        reply = serverio.fetch(
            client,
            "GET",
            url,
            deadline_s=serverio.METRICS_DEADLINE_S if deadline_s is None else deadline_s,
            max_bytes=serverio.MAX_METRICS_BYTES,
        )
    except serverio.ServerReadError as exc:
        raise MetricsUnavailable(str(exc), timed_out=exc.timed_out) from None
    if reply.status != 200:
        hint = f" ({kinds.metrics_hints()})" if reply.status in (404, 501) else ""
        raise MetricsUnavailable(f"{url}: answered HTTP {reply.status}{hint}")
    try:
        samples = parse_exposition(reply.text())
    except ValueError as exc:
        raise MetricsUnavailable(one_line(f"{url}: not Prometheus text: {exc}")) from None
    return Snapshot(samples=samples)


def detect_flavour(snapshot: Snapshot) -> SpecMetricNames | None:
    """The family whose spec-decode counters this server exposes, if any."""
    for names in FLAVOURS:
        if names.drafts in snapshot.samples:
            return names
    return None


def detect_counterless(snapshot: Snapshot) -> CounterlessMetrics | None:
    """The counterless kind whose Prometheus prefix this server's samples carry, if any."""
    for names in COUNTERLESS:
        if any(name.startswith(f"{names.flavour}:") for name in snapshot.samples):
            return names
    return None


def _series(snapshot: Snapshot, name: str, model: str | None) -> dict[tuple[tuple[str, str], ...], float]:
    """Series of one sample name (filtered by model where labelled), keyed by their labels."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in snapshot.samples.get(name, []):
        if model is not None and MODEL_LABEL in labels and labels[MODEL_LABEL] != model:
            continue
        out[tuple(sorted(labels.items()))] = value
    return out


def _shown(name: str, key: tuple[tuple[str, str], ...]) -> str:
    """A series as a window's detail names it, its labels cut short: a server picks their length."""
    return one_line(f"{name}{dict(key)}", _SHOWN_SERIES)


def _value_problem(value: float, *, count: bool) -> str | None:
    """What is wrong with a sample a window would use, in words a report can show: not finite, or for
    a counter, negative or past `serverio.MAX_COUNT`."""
    if math.isnan(value):
        return "is not a number"
    if math.isinf(value):
        return "is infinite"
    if count and value < 0:
        return f"is negative ({value:g})"
    if count and value > serverio.MAX_COUNT:
        return f"is beyond 2**53 ({value:.3g}), where a float no longer counts exactly"
    return None


def _invalid(names: SpecMetricNames, model: str | None, *snapshots: Snapshot) -> str | None:
    """The first sample of the scrapes that a window would use and that is not what it claims to
    be: a counter that is no count, a `_created` or start time that is not finite, a draft position
    past MAX_POSITION."""
    for snapshot in snapshots:
        for name in names.counters():
            for key, value in _series(snapshot, name, model).items():
                problem = _value_problem(value, count=True)
                if problem:
                    return f"{_shown(name, key)} {problem}"
        for name in _restart_watched(names):
            for key, value in _series(snapshot, name, None).items():
                problem = _value_problem(value, count=False)
                if problem:
                    return f"{_shown(name, key)} {problem}"
        for key in _series(snapshot, names.accepted_per_pos, model):
            position = dict(key).get(POSITION_LABEL, "")
            if position.isascii() and position.isdigit() and not _used_position(position):
                return f"{_shown(names.accepted_per_pos, key)}: position {position[:20]} is beyond {MAX_POSITION}"
    return None


def _used_position(label: str) -> bool:
    """A position label read as a draft position: ASCII digits, at most MAX_POSITION."""
    return _POSITION.fullmatch(label) is not None and int(label) <= MAX_POSITION


def invalid_counters(snapshot: Snapshot, model: str | None) -> SpecWindow | None:
    """The `invalid` window any window starting at `snapshot` would be, when its counters are no counts."""
    names = detect_flavour(snapshot)
    if names is None:
        return None
    problem = _invalid(names, model, snapshot)
    return None if problem is None else SpecWindow(status=INVALID, flavour=names.flavour, detail=problem)


class CounterReset(Exception):
    """A counter is lower after the window than before it."""


def _delta_by(before: Snapshot, after: Snapshot, name: str, model: str | None, group: str | None) -> dict[str, float]:
    """Per-series deltas summed over every label except `group` (so over `engine`)."""
    b = _series(before, name, model)
    a = _series(after, name, model)
    totals: dict[str, float] = {}
    for key, value in a.items():
        previous = b.get(key, 0.0)
        if value < previous:
            raise CounterReset(f"{_shown(name, key)} went from {previous:g} to {value:g}")
        group_value = dict(key).get(group, "") if group else ""
        totals[group_value] = totals.get(group_value, 0.0) + (value - previous)
    for key in b:
        if key not in a:
            raise CounterReset(f"{_shown(name, key)} disappeared")
    return totals


def _restart_watched(names: SpecMetricNames) -> list[str]:
    """The samples that change when the server process is a new one: its start time, and each
    spec-decode counter's `_created` time."""
    return [PROCESS_START, *(name.removesuffix("_total") + "_created" for name in names.counters())]


def _restart_evidence(before: Snapshot, after: Snapshot, names: SpecMetricNames) -> str | None:
    """A restart that later increments could hide from the went-down check: a counter's
    `_created` time or the process start time changes when the process is new."""
    for name in _restart_watched(names):
        b = _series(before, name, None)
        a = _series(after, name, None)
        for key, value in b.items():
            if key in a and a[key] != value:
                return f"{_shown(name, key)} changed from {value:.17g} to {a[key]:.17g}"
    return None


def spec_window(before: Snapshot, after: Snapshot, model: str | None) -> SpecWindow:
    """Acceptance over the window between two scrapes of the same server."""
    names = detect_flavour(after) or detect_flavour(before)
    if names is None:
        counterless = detect_counterless(after) or detect_counterless(before)
        if counterless is not None:
            return SpecWindow(status=UNAVAILABLE, flavour=counterless.flavour, detail=counterless.why)
        return SpecWindow(
            status=NOT_SPECULATING,
            detail="/metrics has no spec-decode counters (server runs without speculative decoding)",
        )
    if model is not None and not _series(after, names.drafts, model):
        found = sorted({labels.get(MODEL_LABEL, "") for labels, _ in after.samples.get(names.drafts, [])})
        return SpecWindow(
            status=UNAVAILABLE,
            flavour=names.flavour,
            detail=f"no spec-decode series for model_name={model!r} (found: {', '.join(found)})",
        )
    invalid = _invalid(names, model, before, after)
    if invalid:
        return SpecWindow(status=INVALID, flavour=names.flavour, detail=invalid)
    restarted = _restart_evidence(before, after, names)
    if restarted:
        return SpecWindow(status=VOID, flavour=names.flavour, detail=f"server restarted inside the window: {restarted}")
    try:
        drafts = sum(_delta_by(before, after, names.drafts, model, None).values())
        draft_tokens = sum(_delta_by(before, after, names.draft_tokens, model, None).values())
        accepted = sum(_delta_by(before, after, names.accepted, model, None).values())
        by_pos = _delta_by(before, after, names.accepted_per_pos, model, POSITION_LABEL)
    except CounterReset as exc:
        return SpecWindow(
            status=VOID,
            flavour=names.flavour,
            detail=f"server restarted inside the window: counter went backwards: {exc}",
        )
    positions = sorted((int(p), v) for p, v in by_pos.items() if _used_position(p))
    per_pos = [0.0] * (positions[-1][0] + 1 if positions else 0)
    for p, v in positions:
        per_pos[p] = v
    window = SpecWindow(
        status=OK,
        flavour=names.flavour,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        accepted_per_pos=per_pos,
    )
    if drafts <= 0:
        window.status = NO_DRAFTS
        window.detail = "spec-decode counters did not move in this window (no drafts were made)"
        return window
    window.acceptance_rate, window.mean_acceptance_length, window.per_position_rate = acceptance_figures(
        drafts, draft_tokens, accepted, per_pos
    )
    return window


def acceptance_figures(
    drafts: float, draft_tokens: float, accepted: float, accepted_per_pos: Sequence[float]
) -> tuple[float | None, float, list[float]]:
    """(acceptance rate, mean acceptance length, per-position rates) from counter deltas, as
    defined in the module docstring; the rate is None when no draft tokens were counted.
    `drafts` must be positive (a window without drafts has no acceptance)."""
    rate = accepted / draft_tokens if draft_tokens > 0 else None
    return rate, 1.0 + accepted / drafts, [v / drafts for v in accepted_per_pos]


def sum_per_position(per_pos: Sequence[Sequence[float]]) -> list[float]:
    """Per-position counts of several windows added up, a shorter list counting as zeros beyond its end."""
    width = max(len(p) for p in per_pos)
    return [sum(p[i] for p in per_pos if i < len(p)) for i in range(width)]


def unavailable(reason: str) -> SpecWindow:
    """A window for a server whose /metrics could not be read: no numbers, only the reason."""
    return SpecWindow(status=UNAVAILABLE, detail=reason)


def settled_scrape(client: httpx.Client, base_url: str, settle_s: float = 0.25, timeout_s: float = 5.0) -> Snapshot:
    """Scrape until two scrapes `settle_s` apart agree on the spec-decode and generation counters.

    llama.cpp folds a request into its counters only when its slot is released, which can come
    just after the client has read the last chunk; reading once could miss the last request.

    The first scrape has `serverio.METRICS_DEADLINE_S`. Settling ends `timeout_s` after the start,
    and a scrape still under way then is cut short rather than waited for (one that drips would hold
    the run forever): the last complete scrape is returned, settled or not, as at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    previous = scrape(client, base_url)
    while True:
        left = deadline - time.monotonic() - settle_s
        if left <= 0:
            return previous
        time.sleep(settle_s)
        try:
            current = scrape(client, base_url, min(serverio.METRICS_DEADLINE_S, left))
        except MetricsUnavailable as exc:
            if exc.timed_out and left < serverio.METRICS_DEADLINE_S:
                return previous
            raise
        if _watched(current) == _watched(previous):
            return current
        previous = current


def _watched(snapshot: Snapshot) -> dict[str, list[tuple[dict[str, str], str]]]:
    """The samples settling compares, each value as its repr: a NaN equals itself only so, and a
    server whose counters read NaN would otherwise never settle."""
    keys = {name for names in FLAVOURS for name in (*names.counters(), names.generation_tokens)}
    keys |= {names.generation_tokens for names in COUNTERLESS}
    return {k: [(labels, repr(value)) for labels, value in v] for k, v in snapshot.samples.items() if k in keys}


def kind_mismatch(window: SpecWindow, kind: ServerKind) -> str | None:
    """Why the counters a window was read from are not the arm's kind's, if they are not.

    The kind comes from the arms file or the command; /metrics shows what really served. An arm
    of kind `other`, or one whose kind has no spec-decode counters, is not checked.
    """
    if window.flavour is None or kind.metrics is None or window.flavour == kind.metrics.flavour:
        return None
    served = kinds.with_flavour(window.flavour)
    shown = served.name if served is not None else window.flavour
    return f"the arm's kind is {kind.name}, but /metrics has {shown}'s counters ({window.flavour}:)"
