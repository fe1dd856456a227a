"""The runner end to end against stand-in vLLM servers started as real processes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from standin_vllm import standin_command

from weightsmith.bench import metrics as m
from weightsmith.bench.analysis import analyse
from weightsmith.bench.config import parse_config
from weightsmith.bench.progress import RichProgress
from weightsmith.bench.report import RESULTS_FILE, write_all
from weightsmith.bench.results import (
    SCHEMA_VERSION,
    VISIT_FAILED,
    VISIT_OK,
    VISIT_SKIPPED,
    load_results,
    to_jsonable,
)
from weightsmith.bench.runner import QuietObserver, run_bench
from weightsmith.bench.stats import SHOWN
from weightsmith.core.errors import WeightsmithError

KV_LINE = (
    "WARNING 05-14 10:41:43 [kv_cache.py:123] Using KV cache scaling factor 1.0 for fp8_e4m3. "
    "If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint."
)


def _config(arms: list[dict], **top) -> dict:
    data = {
        "repeats": 2,
        "warmups": 2,
        "workload": {"prompt_tokens": [40, 120], "prompts_per_length": 3, "max_tokens": 11},
        "determinism": {"replicates": 3, "prompt_tokens": 40, "max_tokens": 8, "top_logprobs": 3},
        "arms": arms,
    }
    data.update(top)
    return data


def _png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_two_arms_counterbalanced_with_exact_acceptance(tmp_path: Path) -> None:
    config = parse_config(
        _config(
            [
                {
                    "name": "a",
                    "kind": "vllm",
                    "command": standin_command("--k", "3", "--accept-pattern", "3,1,2,0", "--log-line", KV_LINE),
                },
                {"name": "b", "kind": "vllm", "command": standin_command("--k", "2", "--accept-pattern", "1")},
            ]
        )
    )
    saved = []
    results = run_bench(config, tmp_path, save=lambda r: saved.append(len(r.visits)))
    assert saved == [1, 2, 3, 4]
    assert [(v.arm, v.repeat) for v in results.visits] == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    for v in results.visits:
        assert v.status == VISIT_OK and v.warmups == 2
        assert len(v.requests) == 6 and all(r.ok for r in v.requests)
        assert all(r.completion_tokens == 11 for r in v.requests)
        assert v.spec is not None and v.spec.status == m.OK and v.spec.flavour == "vllm"
        # 6 measured requests exactly: the 2 warmups per visit are not in the window
        if v.arm == "a":  # 11 tokens = 1 + (3+1) + (1+1) + (2+1) + (0+1): 4 drafts, 6 accepted each
            assert (v.spec.drafts, v.spec.draft_tokens, v.spec.accepted) == (24, 72, 36)
            assert v.spec.accepted_per_pos == [18, 12, 6]
        else:  # 11 tokens = 1 + 5 x (1+1): 5 drafts, 5 accepted each
            assert (v.spec.drafts, v.spec.draft_tokens, v.spec.accepted) == (30, 60, 30)
    analysis = analyse(results)
    acc = {a.arm: a for a in analysis.acceptance}
    assert acc["a"].mean_acceptance_length == pytest.approx(2.5)
    assert acc["a"].per_position_rate == pytest.approx([0.75, 0.5, 0.25])
    assert acc["b"].acceptance_rate == pytest.approx(0.5) and acc["b"].mean_acceptance_length == 2.0
    # prompts were sized with the server's /tokenize (4 chars per token in the stand-in)
    assert results.chars_per_token == pytest.approx(4.0, rel=0.01)
    assert "/tokenize" in results.chars_per_token_source
    # each body was cut to its target with that tokenizer; the unique first line adds 11 tokens
    for v in results.visits:
        for r in v.requests:
            assert abs(r.prompt_tokens - 11 - r.target_tokens) <= 0.02 * r.target_tokens + 2, r
    cells = {(c.arm, c.target_tokens): c for c in analysis.cells}
    assert cells[("a", 40)].prefill_note is not None and cells[("a", 40)].prefill_tok_s is None
    assert cells[("a", 40)].tokens_per_chunk > 2
    # each vLLM arm got its own, fresh VLLM_CACHE_ROOT
    logs = {a.name: (tmp_path / a.log_paths[0]).read_text() for a in results.arms}
    assert f"VLLM_CACHE_ROOT={tmp_path / 'cache' / 'a'}\n" in logs["a"]
    assert f"VLLM_CACHE_ROOT={tmp_path / 'cache' / 'b'}\n" in logs["b"]
    evidence = {e.pattern for e in results.arm("a").evidence}
    assert evidence == {"kv-cache-scale-1.0"} and not results.arm("b").evidence
    # determinism: the stand-in is deterministic, so everything is bitwise stable
    assert {d.arm: d.bitwise_stable_share for d in analysis.determinism} == {"a": 1.0, "b": 1.0}
    assert analysis.determinism_pairs[0].first_divergence is None

    analysis, files = write_all(results, tmp_path)
    for name in ("ttft", "decode", "acceptance"):
        assert _png(files[name]), name
    report = files["report"].read_text()
    for heading in (
        "## Verdicts",
        "## Per arm and prompt length",
        "## Speculative decoding acceptance",
        "## Determinism",
        "## Server log check",
        "## Noise floor",
        "## Setup",
    ):
        assert heading in report
    assert "kv-cache-scale-1.0" in report and "![TTFT distributions](ttft.png)" in report
    # the JSON file round-trips to the same analysis
    again = load_results(tmp_path / RESULTS_FILE)
    assert to_jsonable(again) == to_jsonable(results)
    assert to_jsonable(analyse(again)) == to_jsonable(analysis)
    payload = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert payload["schema"] == "weightsmith.bench.results" and payload["schema_version"] == SCHEMA_VERSION
    assert "analysis" in payload


def test_failures_are_one_line_and_partial_results_are_kept(tmp_path: Path) -> None:
    config = parse_config(
        _config(
            [
                {"name": "good", "command": standin_command()},
                {"name": "nostart", "command": standin_command("--fail-start")},
                {"name": "dies", "command": standin_command("--die-after", "5")},
                {"name": "nometrics", "command": standin_command("--no-metrics")},
                {"name": "restarts", "command": standin_command("--reset-after", "3")},
                {"name": "slow", "command": standin_command("--startup-delay-s", "30"), "startup_timeout_s": 1},
            ],
            warmups=1,
            determinism={"replicates": 0},
        )
    )
    results = run_bench(config, tmp_path)
    visits = {(v.arm, v.repeat): v for v in results.visits}
    assert len(results.visits) == 12

    nostart = visits[("nostart", 0)]
    assert nostart.status == VISIT_FAILED
    assert nostart.failure == "server did not start: server exited with status 3 before answering"
    assert "CUDA out of memory" in (nostart.log_tail or "")
    assert visits[("nostart", 1)].status == VISIT_SKIPPED

    dies = visits[("dies", 0)]
    assert dies.status == VISIT_FAILED
    assert dies.failure == "server exited with status 7 during the measured window"
    ok = [r for r in dies.requests if r.ok]
    assert len(ok) == 4, "the requests measured before the server died are kept"
    assert dies.spec is not None and dies.spec.status == m.VOID
    assert visits[("dies", 1)].status == VISIT_SKIPPED

    for repeat in (0, 1):
        assert visits[("nometrics", repeat)].status == VISIT_OK
        spec = visits[("nometrics", repeat)].spec
        assert spec is not None and spec.status == m.UNAVAILABLE and "HTTP 404" in spec.detail
        restart = visits[("restarts", repeat)].spec
        assert restart is not None and restart.status == m.VOID and "restarted" in restart.detail
        assert visits[("good", repeat)].status == VISIT_OK

    slow = visits[("slow", 0)]
    assert slow.failure is not None and " within 1 s (last: http://127.0.0.1:" in slow.failure

    assert {a.name for a in results.arms if a.status == VISIT_FAILED} == {"nostart", "dies", "slow"}
    analysis, files = write_all(results, tmp_path)
    acc = {a.arm: a for a in analysis.acceptance}
    assert acc["nometrics"].status == m.UNAVAILABLE and acc["nometrics"].acceptance_rate is None
    assert acc["restarts"].status == m.VOID and acc["restarts"].mean_acceptance_length is None
    report = files["report"].read_text()
    assert "## Read first" in report
    assert "**Arm `nostart` failed**: server did not start" in report
    assert "CUDA out of memory" in report


def test_url_arms(tmp_path: Path, standin) -> None:
    url = standin(k=2, accept_pattern=[2])
    config = parse_config(
        _config(
            [{"name": "running", "url": url}, {"name": "absent", "url": "http://127.0.0.1:9"}],
            repeats=1,
            determinism={"replicates": 2, "prompt_tokens": 40, "max_tokens": 4},
        )
    )
    results = run_bench(config, tmp_path)
    running, absent = results.visits
    assert running.status == VISIT_OK and running.log_path is None and len(running.requests) == 6
    assert running.spec is not None and running.spec.status == m.OK
    assert absent.status == VISIT_FAILED and absent.failure is not None
    assert absent.failure.startswith(
        "server did not start: no server answering: http://127.0.0.1:9/health: connection failed"
    )
    _, files = write_all(results, tmp_path)
    assert "no server log (a `url` arm" in files["report"].read_text()


def test_concurrent_requests_are_all_measured(tmp_path: Path, standin) -> None:
    url = standin(k=2, accept_pattern=[1])
    data = _config([{"name": "c", "url": url}], repeats=1, determinism={"replicates": 0})
    data["workload"]["concurrency"] = 3
    results = run_bench(parse_config(data), tmp_path)
    (visit,) = results.visits
    assert visit.status == VISIT_OK and len(visit.requests) == 6 and all(r.ok for r in visit.requests)
    assert visit.spec is not None and visit.spec.drafts == 30  # 6 requests x 5 drafts, none lost


class _InterruptAfter(QuietObserver):
    def __init__(self, n: int) -> None:
        self.n = n

    def request_done(self, record) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


def test_ctrl_c_keeps_the_visit_in_progress_and_stops_the_server(tmp_path: Path) -> None:
    config = parse_config(
        _config([{"name": "a", "command": standin_command()}, {"name": "b", "command": standin_command()}])
    )
    results = run_bench(config, tmp_path, _InterruptAfter(8))
    assert results.interrupted
    first, second = results.visits
    assert first.status == VISIT_OK and len(first.requests) == 6
    assert second.status == VISIT_FAILED and second.failure == "interrupted" and len(second.requests) == 2
    log = tmp_path / (second.log_path or "")
    assert log.is_file()
    # the server behind the interrupted visit was stopped: its port no longer answers
    port = next(line for line in log.read_text().splitlines() if line.startswith("$ ")).split("--port ")[1].split()[0]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_live_progress_display(tmp_path: Path, standin) -> None:
    url = standin(k=2, accept_pattern=[1])
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    config = parse_config(_config([{"name": "live", "url": url}], repeats=1, determinism={"replicates": 0}))
    with RichProgress(console) as progress:
        run_bench(config, tmp_path, progress)
    text = buffer.getvalue()
    assert "live repeat 1: decode median" in text and "mean acceptance length 2.00" in text
    assert "(6/6 requests ok)" in text


def test_a_hung_server_fails_after_three_timeouts_not_after_every_request(tmp_path: Path, standin) -> None:
    url = standin(ttft_s=5.0)
    data = _config([{"name": "hung", "url": url}], repeats=1, warmups=0, determinism={"replicates": 0})
    data["workload"]["request_timeout_s"] = 0.3
    results = run_bench(parse_config(data), tmp_path)
    (visit,) = results.visits
    assert visit.status == VISIT_FAILED
    assert visit.failure == "server stopped answering (3 requests in a row timed out or were refused)"
    assert [r.error for r in visit.requests] == [f"{url}/v1/completions: no complete answer within 0.3 s"] * 3


def test_sweep_over_a_flag_gives_a_decode_against_k_plot(tmp_path: Path) -> None:
    data = _config(
        [
            {
                "name": "spec",
                "command": standin_command("--accept-pattern", "3", "--step-ms", "10"),
                "sweep": {"flag": "--k", "values": [1, 3]},
            }
        ],
        repeats=1,
        warmups=0,
        determinism={"replicates": 0},
    )
    data["workload"] = {"prompt_tokens": [40], "prompts_per_length": 3, "max_tokens": 13}
    results = run_bench(parse_config(data), tmp_path)
    analysis, files = write_all(results, tmp_path)
    (sweep,) = analysis.sweeps
    assert (sweep.base, sweep.param) == ("spec", "k")
    points = {p.value: p for p in sweep.points}
    assert points[1].mean_acceptance_length == 2.0 and points[3].mean_acceptance_length == 4.0
    # k=3 emits 4 tokens per 10 ms step, k=1 only 2: about twice the decode rate
    assert points[3].decode_geomean > 1.5 * points[1].decode_geomean
    assert sweep.best_value == 3
    assert _png(files["sweep-spec"])
    assert "![decode against k](sweep-spec.png)" in files["report"].read_text()


def test_drafts_are_compared_prompt_by_prompt_on_their_own_acceptance(tmp_path: Path) -> None:
    """Planted truth: a draft the stand-in always accepts (3 of 3) against one it accepts 1 of 3 of,
    each swept over k; every request carries its own counts, which add up to its window's."""
    data = _config(
        [
            {
                "name": "good",
                "command": standin_command("--accept-pattern", "3"),
                "sweep": {"flag": "--k", "values": [1, 3]},
            },
            {
                "name": "poor",
                "command": standin_command("--accept-pattern", "1"),
                "sweep": {"flag": "--k", "values": [1, 3]},
            },
        ],
        acceptance_baseline="good",
        warmups=1,
        determinism={"replicates": 0},
    )
    data["workload"] = {"prompt_tokens": [40], "prompts_per_length": 6, "max_tokens": 9}
    results = run_bench(parse_config(data), tmp_path)
    assert results.acceptance_baseline == "good"
    for v in results.visits:
        assert v.status == VISIT_OK and v.spec is not None and v.spec.status == m.OK
        assert sum(r.spec_drafts for r in v.requests) == v.spec.drafts
        assert sum(r.spec_accepted for r in v.requests) == v.spec.accepted
        assert sum(r.spec_draft_tokens for r in v.requests) == v.spec.draft_tokens
    analysis, files = write_all(results, tmp_path)
    comparisons = {c.arm: c for c in analysis.acceptance_comparisons}
    assert set(comparisons) == {"poor@k=1", "poor@k=3"}
    assert comparisons["poor@k=3"].baseline == "good@k=3" and comparisons["poor@k=1"].baseline == "good@k=1"
    # k=1: both accept their one token, identical on every prompt: nothing shown
    assert comparisons["poor@k=1"].effect == 0 and comparisons["poor@k=1"].verdict != SHOWN
    # k=3: 1 + 3 against 1 + 1 on all 6 prompts (the last step of a request may be cut short)
    worse = comparisons["poor@k=3"]
    assert worse.n_pairs == 6 and worse.n_lower == 6 and worse.verdict == SHOWN and worse.arm_better is False
    assert analysis.acceptance_noise is not None and analysis.acceptance_noise.value == 0
    report = files["report"].read_text()
    assert "### Drafts compared" in report and "`good@k=3`" in report
    assert to_jsonable(analyse(load_results(tmp_path / RESULTS_FILE))) == to_jsonable(analysis)


def test_a_wrong_acceptance_baseline_is_refused() -> None:
    data = _config([{"name": "a", "command": standin_command()}], acceptance_baseline="nope")
    with pytest.raises(WeightsmithError, match="acceptance_baseline 'nope' is not an arm"):
        parse_config(data)
