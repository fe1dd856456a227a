"""Drive a benchmark run: visit the arms in counterbalanced order, measure, keep everything.

Per visit (`serving` owns the server: start or find it, stop it, read its log): warm it up
(discarded), scrape /metrics, send the measured requests, scrape again once the counters have
settled, and run the determinism replicates and the quality suite (`[quality]`) on the arm's first visit, after the
measured requests so that neither falls inside the speed window. The results file is rewritten after every
visit, so a crash, a Ctrl-C or a server that dies keeps what was already measured.

Failures are one line each and never stop the other arms: a server that does not start (with the
end of its log), dies during the window (requests measured so far are kept), or answers with
errors. The arm is marked failed and its remaining visits are skipped.

Every read from a server goes through `serverio` (`new_client`): a total deadline and a byte cap
each, so a server that drips or never ends an answer costs a failed request or a window left out,
never a hung run. A window whose counters lie (not counts, or going backwards between the scrapes
read after each request) is left out, named, and its requests' own counts with it.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from weightsmith.bench import client as cl
from weightsmith.bench import logcheck
from weightsmith.bench import metrics as m
from weightsmith.bench.config import ArmSpec, BenchConfig
from weightsmith.bench.outdir import claim, own
from weightsmith.bench.paths import make_portable
from weightsmith.bench.quality import runs as quality
from weightsmith.bench.results import (
    VISIT_FAILED,
    VISIT_SKIPPED,
    ArmInfo,
    BenchResults,
    DeterminismRun,
    PromptInfo,
    Replicate,
    RequestRecord,
    VisitResult,
    to_jsonable,
)
from weightsmith.bench.schedule import Visit, counterbalanced_order
from weightsmith.bench.serverio import ServerReadError, new_client
from weightsmith.bench.servers import RunningServer, ServerError, start_server
from weightsmith.bench.workloads import (
    FALLBACK_CHARS_PER_TOKEN,
    SIZE_TOLERANCE,
    Prompt,
    build_prompts,
    interleaved,
    stdlib_corpus,
    unique_prefix,
)
from weightsmith.core.errors import OutputError
from weightsmith.core.files import outside
from weightsmith.core.version import __version__

#: Consecutive connection failures or timeouts after which a server counts as gone (alive or not):
#: without it, a hung server would cost `request_timeout_s` for every remaining request.
_MAX_CONNECTION_FAILURES = 3
# how long a refused or timed-out request waits for a dying server to be reported gone
_EXIT_GRACE_S = 3.0
_CALIBRATION_CHARS = 12000


class Observer(Protocol):
    """Receives progress; the command line shows it live, tests ignore it."""

    def run_started(self, visits: int, requests_per_visit: int) -> None: ...
    def visit_started(self, visit: Visit, index: int) -> None: ...
    def phase(self, text: str) -> None: ...
    def request_done(self, record: RequestRecord) -> None: ...
    def visit_finished(self, result: VisitResult) -> None: ...
    def message(self, text: str) -> None: ...


class QuietObserver:
    """An observer that shows nothing."""

    def run_started(self, visits: int, requests_per_visit: int) -> None:
        """Nothing to show."""

    def visit_started(self, visit: Visit, index: int) -> None:
        """Nothing to show."""

    def phase(self, text: str) -> None:
        """Nothing to show."""

    def request_done(self, record: RequestRecord) -> None:
        """Nothing to show."""

    def visit_finished(self, result: VisitResult) -> None:
        """Nothing to show."""

    def message(self, text: str) -> None:
        """Nothing to show."""


def slug(name: str) -> str:
    """A file-name-safe form of an arm name."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def host_info() -> dict[str, str]:
    """The machine the client ran on, and how busy it was at the start."""
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": str(os.cpu_count()),
    }
    if hasattr(os, "getloadavg"):
        info["loadavg_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return info


@dataclass
class _Workload:
    measured: list[Prompt]
    warmup: list[Prompt]
    determinism: Prompt


@dataclass
class _RunState:
    config: BenchConfig
    out_dir: Path
    client: httpx.Client
    observer: Observer
    results: BenchResults
    t0: float
    arm_infos: dict[str, ArmInfo]
    workload: _Workload | None = None
    quality: quality.QualityPlan | None = None
    failed_arms: set[str] = field(default_factory=set)
    caches_cleared: set[str] = field(default_factory=set)
    current: VisitResult | None = None


def _calibrate(state: _RunState, arm: ArmSpec, url: str, model: str) -> None:
    """Fix the prompts, cut to length with this (the first serving) arm's tokenizer if it has one.

    A tokenizer that stops answering is asked no more (each failed call can cost its whole deadline):
    the prompts left are cut by the ratio alone, and the results say so.
    """
    spec = state.config.workload
    sample = "".join(text for _, text in stdlib_corpus()[:20])[:_CALIBRATION_CHARS]
    measured = cl.count_tokens(state.client, url, model, sample)
    stopped: list[bool] = []

    def count(text: str) -> int | None:
        n = None if stopped else cl.count_tokens(state.client, url, model, text)
        if n is None:
            stopped.append(True)
        return n

    counter = count if measured else None
    if spec.chars_per_token is not None:
        ratio, source = spec.chars_per_token, "arms file"
    elif measured:
        ratio, source = len(sample) / measured, f"/tokenize of arm '{arm.name}'"
    else:
        ratio, source = FALLBACK_CHARS_PER_TOKEN, "fixed estimate (no /tokenize on the server)"
    if counter is not None:
        source += f"; each prompt cut to within {SIZE_TOLERANCE:.0%} of its target with that tokenizer"
    measured_prompts = build_prompts(spec.prompt_tokens, spec.prompts_per_length, ratio, spec.seed, counter)
    warmup = build_prompts(spec.prompt_tokens, 1, ratio, spec.seed + 1000, counter)
    det = state.config.determinism
    determinism = build_prompts([det.prompt_tokens], 1, ratio, spec.seed + 2000, counter)[0]
    if counter is not None and stopped:
        source += "; /tokenize stopped answering partway, so the prompts after that were cut by the ratio alone"
    state.results.chars_per_token = ratio
    state.results.chars_per_token_source = source
    state.workload = _Workload(interleaved(measured_prompts, spec.seed), warmup, determinism)
    state.results.prompts = [
        PromptInfo(p.key, p.target_tokens, p.index, p.source, len(p.text)) for p in measured_prompts
    ]


def _send(
    state: _RunState,
    arm: ArmSpec,
    url: str,
    model: str,
    text: str,
    top_logprobs: int = 0,
    max_tokens: int | None = None,
) -> cl.StreamOutcome:
    spec = state.config.workload
    body = cl.request_body(
        spec.endpoint,
        model,
        text,
        max_tokens=max_tokens or spec.max_tokens,
        temperature=spec.temperature,
        ignore_eos=spec.ignore_eos,
        top_logprobs=top_logprobs,
        extra=arm.extra_body,
    )
    return cl.stream_request(state.client, url, spec.endpoint, body, spec.request_timeout_s)


def _record(prompt: Prompt, outcome: cl.StreamOutcome, started_s: float) -> RequestRecord:
    return RequestRecord(prompt.key, prompt.target_tokens, prompt.index, started_s=started_s, **outcome.timing())


def _server_gone(server: RunningServer, consecutive_failures: int) -> str | None:
    if not server.alive(_EXIT_GRACE_S if consecutive_failures else 0.0):
        return f"server exited with status {server.exit_code()} during the measured window"
    if consecutive_failures >= _MAX_CONNECTION_FAILURES:
        return f"server stopped answering ({consecutive_failures} requests in a row timed out or were refused)"
    return None


@dataclass
class _Measured:
    """How the measured requests ended: why the server went away, if it did; the /metrics scrape
    taken after the last request, when there is one (it closes the window: no second scrape); and the
    window itself when a scrape read after a request found counters that lie or went backwards (the
    window is then left out, whatever its two ends say)."""

    gone: str | None = None
    last: m.Snapshot | None = None
    spoiled: m.SpecWindow | None = None


def _measure(
    state: _RunState,
    arm: ArmSpec,
    server: RunningServer,
    model: str,
    vr: VisitResult,
    contents: list[str],
    before: m.Snapshot | None,
) -> _Measured:
    """Send the measured requests and say how they ended (`_Measured`).

    One at a time on a speculating server, /metrics is read again after each request, so that each
    request carries its own acceptance (`_own_acceptance`): what pairs prompts across drafts.
    """
    assert state.workload is not None
    prompts = state.workload.measured
    failures = 0
    measured = _Measured()
    last = before if before is not None and m.detect_flavour(before) is not None else None
    if last is not None and (invalid := m.invalid_counters(last, model)) is not None:
        invalid.detail = f"{m.metrics_url(server.url)}: {invalid.detail}"
        measured.spoiled, last = invalid, None  # no window can start here: read no more after each request

    def one(prompt: Prompt) -> tuple[RequestRecord, cl.StreamOutcome]:
        started = time.perf_counter() - state.t0
        outcome = _send(state, arm, server.url, model, unique_prefix() + prompt.text)
        return _record(prompt, outcome, started), outcome

    def keep(record: RequestRecord, outcome: cl.StreamOutcome) -> None:
        vr.requests.append(record)
        contents.append(outcome.content)
        state.observer.request_done(record)

    if state.config.workload.concurrency == 1:
        for index, prompt in enumerate(prompts, 1):
            measured.gone = _server_gone(server, failures)
            if measured.gone:
                return measured
            record, outcome = one(prompt)
            if last is not None:
                last, measured.spoiled = _own_acceptance(state, server.url, model, last, record, index)
            keep(record, outcome)
            failures = failures + 1 if outcome.unreachable else 0
        measured.gone, measured.last = _server_gone(server, failures), last
        return measured
    with ThreadPoolExecutor(max_workers=state.config.workload.concurrency) as pool:
        for record, outcome in pool.map(one, prompts):
            keep(record, outcome)
    measured.gone = _server_gone(server, 0 if any(r.ok for r in vr.requests) else len(vr.requests))
    return measured


def _own_acceptance(
    state: _RunState, url: str, model: str, last: m.Snapshot, record: RequestRecord, index: int
) -> tuple[m.Snapshot | None, m.SpecWindow | None]:
    """Set `record`'s own spec-decode counts from a scrape after it. Returns the scrape, or None once a
    scrape fails or the counters do not add up (the window's totals still come from its own scrapes);
    and, when the counters are not counts or went backwards, that window, naming the request after
    which it was read: the measured window is left out for it (a counter that drops and climbs back
    would pass unseen between the window's two ends)."""
    now, _ = _scrape_settled(state, url)
    if now is None:
        return None, None
    own = m.spec_window(last, now, model)
    if own.status in (m.VOID, m.INVALID):
        own.detail = f"{m.metrics_url(url)} after measured request {index}: {own.detail}"
        return None, own
    if own.status not in (m.OK, m.NO_DRAFTS):
        return None, None
    record.spec_drafts, record.spec_draft_tokens, record.spec_accepted = own.drafts, own.draft_tokens, own.accepted
    return now, None


def _determinism(state: _RunState, arm: ArmSpec, server: RunningServer, model: str) -> None:
    spec = state.config.determinism
    if spec.replicates == 0 or any(r.arm == arm.name for r in state.results.determinism):
        return
    assert state.workload is not None
    prompt = state.workload.determinism
    run = DeterminismRun(arm=arm.name, prompt_key=prompt.key)
    for i in range(spec.replicates):
        if not server.alive():
            break
        state.observer.phase(f"determinism replicate {i + 1}/{spec.replicates}")
        outcome = _send(state, arm, server.url, model, prompt.text, spec.top_logprobs, spec.max_tokens)
        run.replicates.append(
            Replicate(
                content=outcome.content,
                error=outcome.error,
                positions=outcome.positions,
                completion_tokens=outcome.completion_tokens,
            )
        )
    state.results.determinism.append(run)


def _quality(state: _RunState, arm: ArmSpec, server: RunningServer, model: str) -> None:
    """The quality suite, `runs` times in a row on this server (the arm's first visit only)."""
    plan = state.quality
    if plan is None or any(r.arm == arm.name for r in state.results.quality):
        return
    for run in range(plan.spec.runs):
        record = quality.run_suite(
            state.client,
            server.url,
            model,
            plan,
            arm=arm.name,
            run=run,
            extra=arm.extra_body,
            timeout_s=state.config.workload.request_timeout_s,
            alive=server.alive,
            progress=state.observer.phase,
        )
        state.results.quality.append(record)
        errors = [o for o in record.outcomes if o.error]
        if errors:
            state.observer.message(
                f"arm '{arm.name}' quality run {run + 1}: {len(errors)} of {len(record.outcomes)} "
                f"scenarios got no answer, e.g. {errors[0].error}"
            )


def _scrape_settled(state: _RunState, url: str) -> tuple[m.Snapshot | None, str]:
    try:
        return m.settled_scrape(state.client, url), ""
    except m.MetricsUnavailable as exc:
        return None, str(exc)


def _fail(state: _RunState, vr: VisitResult, line: str, log_tail: str | None = None) -> None:
    vr.status = VISIT_FAILED
    vr.failure = line
    vr.log_tail = log_tail or None
    state.failed_arms.add(vr.arm)
    info = state.arm_infos[vr.arm]
    info.status = VISIT_FAILED
    info.failure = info.failure or line
    state.observer.message(f"arm '{vr.arm}' repeat {vr.repeat + 1}: {line}")


def _cache_root(state: _RunState, arm: ArmSpec) -> Path | None:
    """A fresh compile cache per arm whose kind has one (cleared once per run, shared by its visits)."""
    if arm.server_kind.cache_env is None or not arm.fresh_cache:
        return None
    name = f"cache/{slug(arm.name)}"
    root = state.out_dir / name
    if outside(state.out_dir, name) is not None or root.is_symlink():  # rmtree would reach beyond --out
        raise ServerError(f"{root} is, or lies in, a link; not used as a compile cache")
    _own(state, name, "as a compile cache")
    if arm.name not in state.caches_cleared:
        shutil.rmtree(root, ignore_errors=True)
        state.caches_cleared.add(arm.name)
    return root


def _own(state: _RunState, name: str, use: str) -> None:
    """Make `--out/name` bench's to write (`outdir.own`), or fail the arm: an entry bench did not write
    (a user's cache folder or log) is never emptied, replaced or appended to."""
    try:
        own(state.out_dir, name)
    except OutputError:
        raise ServerError(f"{state.out_dir / name} was not written by bench; not used {use}") from None


@contextmanager
def serving(state: _RunState, arm: ArmSpec, vr: VisitResult) -> Iterator[RunningServer]:
    """The arm's server for one visit: started (or found) on entry, stopped on leaving however the
    visit ends, and its log recorded and run through the log check either way.

    A server that does not start raises `ServerError` from the `with` (its log kept all the same).
    """
    log_name = f"logs/{slug(arm.name)}.r{vr.repeat + 1}.log"
    log_path = state.out_dir / log_name
    info = state.arm_infos[arm.name]
    state.observer.phase("starting server")
    _own(state, log_name, "as its log")
    try:
        server = start_server(arm, state.client, state.out_dir, log_name, _cache_root(state, arm))
    except ServerError:
        if log_path.is_file() and not log_path.is_symlink():
            _keep_log(info, vr, log_path)
        raise
    vr.startup_s = server.startup_s
    info.url = server.url
    if server.log_path is not None:
        _keep_log(info, vr, server.log_path, scan=False)
    try:
        yield server
    finally:
        state.observer.phase("stopping server")
        server.stop()
        if server.log_path is not None:
            info.evidence = logcheck.merge(info.evidence, logcheck.scan_log(server.log_path))


def _keep_log(info: ArmInfo, vr: VisitResult, log_path: Path, scan: bool = True) -> None:
    """Record the visit's log (and, with `scan`, its evidence now: the server is not running)."""
    vr.log_path = str(log_path)
    info.log_paths.append(vr.log_path)
    if scan:
        info.evidence = logcheck.merge(info.evidence, logcheck.scan_log(log_path))


def _visit(state: _RunState, arm: ArmSpec, visit: Visit) -> VisitResult:
    vr = VisitResult(arm=arm.name, repeat=visit.repeat, position=visit.position, started_at=_now())
    state.current = vr
    contents: list[str] = []
    try:
        with serving(state, arm, vr) as server:
            _on_server(state, arm, server, vr, contents)
    except ServerError as exc:
        _fail(state, vr, f"server did not start: {exc}", exc.log_tail)
    finally:
        info = state.arm_infos[arm.name]
        info.evidence = logcheck.merge(info.evidence, logcheck.scan_contents(contents))
        vr.finished_at = _now()
    return vr


def _on_server(state: _RunState, arm: ArmSpec, server: RunningServer, vr: VisitResult, contents: list[str]) -> None:
    """One visit's work on a serving server: warm up, measure between two /metrics scrapes, then
    run the determinism replicates and the quality suite; a failure marks the visit failed and ends it."""
    try:
        model = arm.model or cl.fetch_model_id(state.client, server.url)
    except ServerReadError as exc:
        _fail(state, vr, f"cannot read the model id: {exc}", server.log_tail())
        return
    state.arm_infos[arm.name].model = model
    if state.workload is None:
        state.observer.phase("sizing prompts")
        _calibrate(state, arm, server.url, model)
    assert state.workload is not None
    for i in range(state.config.warmups):
        state.observer.phase(f"warmup {i + 1}/{state.config.warmups} (discarded)")
        prompt = state.workload.warmup[i % len(state.workload.warmup)]
        outcome = _send(state, arm, server.url, model, unique_prefix() + prompt.text)
        if outcome.error:
            _fail(state, vr, f"warmup request failed: {outcome.error}", server.log_tail())
            return
        vr.warmups += 1
    state.observer.phase("measuring")
    before, reason = _scrape_settled(state, server.url)
    measured = _measure(state, arm, server, model, vr, contents, before)
    if measured.gone:
        _fail(state, vr, measured.gone, server.log_tail())
        vr.spec = m.SpecWindow(status=m.VOID, detail="server went away during the window")
        return
    vr.spec = measured.spoiled or _closing_window(state, arm, server.url, model, before, reason, measured.last)
    if vr.spec.status in (m.VOID, m.INVALID):
        _leave_out(state, vr)
    errors = [r for r in vr.requests if not r.ok]
    if errors and len(errors) == len(vr.requests):
        _fail(state, vr, f"every measured request failed, e.g. {errors[0].error}")
        return
    if errors:
        state.observer.message(
            f"arm '{arm.name}' repeat {vr.repeat + 1}: {len(errors)} of "
            f"{len(vr.requests)} requests failed, e.g. {errors[0].error}"
        )
    _determinism(state, arm, server, model)
    _quality(state, arm, server, model)


def _closing_window(
    state: _RunState,
    arm: ArmSpec,
    url: str,
    model: str,
    before: m.Snapshot | None,
    reason: str,
    last: m.Snapshot | None,
) -> m.SpecWindow:
    """The measured window, closed by the scrape read after the last request or by a scrape now."""
    if before is None:
        return _window(state, arm, url, None, None, reason, model)
    if last is not None:
        return _window(state, arm, url, before, last, "", model)
    after, reason_after = _scrape_settled(state, url)
    return _window(state, arm, url, before, after, reason_after, model)


def _leave_out(state: _RunState, vr: VisitResult) -> None:
    """A window whose counters lied or reset is left out whole, its requests' own counts too (the same
    counters gave them), and the live display names it."""
    for r in vr.requests:
        r.spec_drafts = r.spec_draft_tokens = r.spec_accepted = None
    assert vr.spec is not None
    state.observer.message(f"arm '{vr.arm}' repeat {vr.repeat + 1}: /metrics window left out: {vr.spec.detail}")


def _window(
    state: _RunState,
    arm: ArmSpec,
    url: str,
    before: m.Snapshot | None,
    after: m.Snapshot | None,
    reason: str,
    model: str,
) -> m.SpecWindow:
    """The measured window's acceptance, its counters checked against the arm's kind; a window its
    counters void or make invalid names the server's /metrics."""
    if before is None or after is None:
        return m.unavailable(reason)
    window = m.spec_window(before, after, model)
    if window.status in (m.VOID, m.INVALID):
        window.detail = f"{m.metrics_url(url)}: {window.detail}"
    mismatch = m.kind_mismatch(window, arm.server_kind)
    if mismatch:
        window.detail = "; ".join(d for d in (window.detail, mismatch) if d)
        state.observer.message(f"arm '{arm.name}': {mismatch}")
    return window


def new_results(config: BenchConfig) -> BenchResults:
    """An empty results record for `config`, before anything is measured."""
    return BenchResults(
        created=_now(),
        weightsmith_version=__version__,
        host=host_info(),
        config=to_jsonable(config),
        baseline=config.baseline_arm,
        acceptance_baseline=config.acceptance_baseline,
        prefill_min_tokens=config.prefill_min_tokens,
        alpha=config.alpha,
        chars_per_token=0.0,
        chars_per_token_source="not measured (no arm served)",
        arms=[
            ArmInfo(
                name=a.name,
                kind=a.resolved_kind,
                url=a.url,
                command=a.command,
                env=dict(a.env),
                model=a.model,
                sweep_param=a.sweep_param,
                sweep_value=a.sweep_value,
            )
            for a in config.arms
        ],
    )


def _arms_dir(config: BenchConfig) -> Path | None:
    """The folder of the arms file the run was read from (a declared root for its paths), if it is a file."""
    source = Path(config.source) if config.source else None
    return source.resolve().parent if source is not None and source.is_file() else None


def run_bench(
    config: BenchConfig,
    out_dir: Path,
    observer: Observer | None = None,
    save: Callable[[BenchResults], None] | None = None,
    *,
    quality_plan: quality.QualityPlan | None = None,
) -> BenchResults:
    """Run every visit of `config`; `save` is called after each visit with the results so far.

    The quality suite is read (and the sandbox checked) before any server starts, unless the caller
    did so already (`quality_plan`, from `quality.prepare`, which is where `--allow-unsandboxed`
    goes); without a plan, code-running checks need the full sandbox.

    What is saved and returned records paths portably (`bench/paths.py`): relative to the arms
    file's folder, the model folder and `out_dir`, else as file names; never this machine's layout.
    """
    observer = observer or QuietObserver()
    if quality_plan is None:
        quality_plan = quality.prepare(config)
    out_dir = out_dir.resolve()  # servers run with this in their environment (their cache root)
    claim(out_dir)  # bench's record: what it writes there, and nothing else, it may replace
    results = new_results(config)
    arms_dir = _arms_dir(config)
    order = counterbalanced_order([a.name for a in config.arms], config.repeats)
    results.order = [[v.arm, v.repeat] for v in order]
    arms = {a.name: a for a in config.arms}
    state = _RunState(
        config=config,
        out_dir=out_dir,
        client=new_client(),
        observer=observer,
        results=results,
        t0=time.perf_counter(),
        arm_infos={a.name: a for a in results.arms},
        quality=quality_plan,
    )
    per_visit = len(config.workload.prompt_tokens) * config.workload.prompts_per_length
    observer.run_started(len(order), per_visit)
    try:
        for index, visit in enumerate(order):
            observer.visit_started(visit, index)
            if visit.arm in state.failed_arms:
                vr = VisitResult(
                    arm=visit.arm,
                    repeat=visit.repeat,
                    position=visit.position,
                    status=VISIT_SKIPPED,
                    failure="arm failed earlier in the run",
                )
            else:
                vr = _visit(state, arms[visit.arm], visit)
            state.current = None
            results.visits.append(vr)
            observer.visit_finished(vr)
            if save is not None:
                save(make_portable(results, arms_dir, out_dir))
    except KeyboardInterrupt:
        results.interrupted = True
        if state.current is not None:
            # Keep the requests of the visit that was running; its window is incomplete.
            state.current.status = VISIT_FAILED
            state.current.failure = "interrupted"
            state.current.spec = None
            results.visits.append(state.current)
    finally:
        state.client.close()
    return make_portable(results, arms_dir, out_dir)
