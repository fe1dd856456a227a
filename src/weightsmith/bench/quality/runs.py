"""Run a quality suite against one serving arm: every scenario sent at temperature 0, not streamed,
its answer judged, one `QualityRun` per pass.

The runner calls `run_suite` inside the arm's first serve visit, after the measured requests, so
quality requests never fall inside the speed measurement window. `prepare` reads the suite and
settles the sandbox question before any server starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from weightsmith.bench import client as cl
from weightsmith.bench.config import BenchConfig, QualitySpec
from weightsmith.bench.quality import sandbox
from weightsmith.bench.quality.checks import judge
from weightsmith.bench.quality.scenarios import Scenario, Suite, load_suite
from weightsmith.bench.results import QualityRun, ScenarioOutcome


@dataclass(frozen=True)
class QualityPlan:
    """What every arm's quality runs use: the suite, its settings, and whether code runs sandboxed."""

    spec: QualitySpec
    suite: Suite
    sandboxed: bool


def prepare(config: BenchConfig, allow_unsandboxed: bool = False) -> QualityPlan | None:
    """The run's quality plan (None without a `[quality]` table), or one line saying why not:
    a bad suite, or code to run and no sandbox to run it in without `--allow-unsandboxed`."""
    spec = config.quality
    if spec is None:
        return None
    source = Path(config.source) if config.source else None
    base = source.resolve().parent if source is not None and source.is_file() else None
    suite = load_suite(spec.suite, base, categories=spec.categories, limit=spec.limit, where=config.source)
    sandboxed = sandbox.require(allow_unsandboxed) if suite.runs_code else True
    return QualityPlan(spec, suite, sandboxed)


#: Stop strings a request may carry: OpenAI's API allows 4, and vLLM refuses a request with more than
#: VLLM_MAX_STOP_STRINGS (4 by default, vllm/envs.py) with a 400; HumanEval has 5.
MAX_SERVER_STOPS = 4


def request_body(scenario: Scenario, model: str, max_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The scenario's request: greedy, ending where the model ends (no ignore_eos); `client.complete`
    sends it not streamed."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0}
    if scenario.prompt is not None:
        body["prompt"] = scenario.prompt
    else:
        body["messages"] = scenario.messages
    if scenario.tools is not None:
        body["tools"] = scenario.tools
    if scenario.stop:
        # the checks cut the answer at every stop string (`checks.cut_at_stop`); the server gets the
        # first MAX_SERVER_STOPS only, to end early
        body["stop"] = scenario.stop[:MAX_SERVER_STOPS]
    body.update(extra)
    return body


def run_suite(
    client: httpx.Client,
    url: str,
    model: str,
    plan: QualityPlan,
    *,
    arm: str,
    run: int,
    extra: dict[str, Any],
    timeout_s: float,
    alive: Callable[[], bool],
    progress: Callable[[str], None],
) -> QualityRun:
    """One pass over the suite; once the server is gone, the scenarios left are recorded as errors."""
    record = QualityRun(arm=arm, run=run, suite=plan.suite.name)
    total = len(plan.suite.scenarios)
    gone: str | None = None
    for index, scenario in enumerate(plan.suite.scenarios):
        progress(f"quality run {run + 1}/{plan.spec.runs}: scenario {index + 1}/{total}")
        if gone is None and not alive():
            gone = "the server went away before this scenario"
        if gone is not None:
            record.outcomes.append(ScenarioOutcome(scenario.id, scenario.category, False, gone, error=gone))
            continue
        body = request_body(scenario, model, plan.spec.max_tokens, extra)
        answer = cl.complete(client, url, scenario.endpoint, body, timeout_s)
        if answer.error is not None:
            record.outcomes.append(
                ScenarioOutcome(scenario.id, scenario.category, False, "request failed", answer.error)
            )
            continue
        passed, detail = judge(scenario.check, scenario, answer, sandboxed=plan.sandboxed)
        record.outcomes.append(
            ScenarioOutcome(scenario.id, scenario.category, passed, detail, completion_tokens=answer.completion_tokens)
        )
    return record
