"""Server kinds: one entry per kind, read by config, metrics, servers, client and the log check."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from weightsmith.bench import kinds, logcheck
from weightsmith.bench import metrics as m
from weightsmith.bench.config import ArmSpec, parse_config
from weightsmith.bench.results import results_from_dict, to_jsonable
from weightsmith.bench.runner import new_results


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        (["vllm", "serve", "m"], kinds.VLLM),
        (["/opt/venv/bin/vllm", "serve", "m"], kinds.VLLM),
        (["env", "llama-server", "-m", "m.gguf"], kinds.LLAMA_CPP),
        (["sglang", "serve", "--model-path", "m"], kinds.SGLANG),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m"], kinds.SGLANG),
        (["python", "-m", "my_server"], kinds.OTHER),
        (None, kinds.OTHER),
    ],
)
def test_the_kind_is_detected_from_the_program(command: list[str] | None, kind: kinds.ServerKind) -> None:
    arm = ArmSpec("a", url="http://h:1", command=command)
    assert arm.server_kind is kind and arm.resolved_kind == kind.name


def test_a_named_kind_wins_over_the_command_and_every_kind_has_one_spelling() -> None:
    assert ArmSpec("a", command=["vllm", "serve"], kind="other").server_kind is kinds.OTHER
    names = [k.name for k in kinds.KINDS]
    assert len(set(names)) == len(names) and (kinds.AUTO, *names) == kinds.KIND_NAMES
    assert [k for k in kinds.KINDS if k.cache_env] == [kinds.VLLM, kinds.SGLANG]


def test_every_kind_log_pattern_is_in_the_log_check_in_the_kinds_order() -> None:
    ids = [p.id for k in kinds.KINDS for p in k.log_patterns]
    assert [p.id for p in logcheck.PATTERNS if p.source == logcheck.LOG] == ids
    assert all(p.source == kinds.LOG for k in kinds.KINDS for p in k.log_patterns)


def test_the_tokenize_body_carries_each_kinds_field() -> None:
    body = kinds.tokenize_body("m", "text")
    assert body == {"model": "m", "prompt": "text", "content": "text", "add_special_tokens": False}


def _window(flavour: str | None) -> m.SpecWindow:
    return m.SpecWindow(status=m.OK, flavour=flavour)


def test_the_metrics_flavour_is_checked_against_the_arms_kind() -> None:
    assert m.kind_mismatch(_window("vllm"), kinds.VLLM) is None
    assert m.kind_mismatch(_window("llamacpp"), kinds.OTHER) is None
    assert m.kind_mismatch(_window(None), kinds.VLLM) is None
    line = m.kind_mismatch(_window("llamacpp"), kinds.VLLM)
    assert line == "the arm's kind is vllm, but /metrics has llama.cpp's counters (llamacpp:)"


def test_results_written_with_the_former_severity_words_are_read_in_the_current_ones() -> None:
    config = parse_config({"arms": [{"name": "a", "url": "http://h:1"}]})
    data = json.loads(json.dumps(to_jsonable(new_results(config))))
    data["arms"][0]["evidence"] = [
        {"pattern": p, "meaning": "x", "severity": old, "count": 1, "first_line": "l"}
        for p, old in (("kv-cache-scale-1.0", "bad"), ("fp4-marlin-fallback", "warn"), ("gguf-file-type", "info"))
    ]
    results = results_from_dict(data)
    assert [e.severity for e in results.arms[0].evidence] == [logcheck.ERROR, logcheck.WARNING, logcheck.INFO]
    data["arms"][0]["evidence"][0]["severity"] = "fatal"
    with pytest.raises(Exception, match=r"arms\[0\]\.evidence\[0\]\.severity: must be one of error, warning, info"):
        results_from_dict(data)


def _sglang_metrics(generated: float, accept_length: float) -> m.Snapshot:
    """/metrics as prometheus_client writes SGLang's registrations (metrics/collector.py): the
    tokenizer manager's generation-token counter (labels model_name, engine_type) and the
    scheduler's two spec-decode gauges, which hold its last log interval's averages."""
    registry = CollectorRegistry()
    tokens = Counter(
        "sglang:generation_tokens_total", "Number of generation tokens processed.", ["model_name", "engine_type"],
        registry=registry,
    )  # fmt: skip
    tokens.labels(model_name="m", engine_type="unified").inc(generated)
    scheduler = ["model_name", "tp_rank", "dp_rank", "pp_rank", "moe_ep_rank"]
    for name, value in (("sglang:spec_accept_length", accept_length), ("sglang:spec_accept_rate", accept_length / 8)):
        gauge = Gauge(name, "Speculative decoding.", scheduler, registry=registry)
        gauge.labels(model_name="m", tp_rank="0", dp_rank="0", pp_rank="0", moe_ep_rank="0").set(value)
    return m.Snapshot(samples=m.parse_exposition(generate_latest(registry).decode()))


def test_an_sglang_arm_is_parsed_detected_and_its_acceptance_is_absent_not_zero() -> None:
    command = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "{port}", "--enable-metrics"]
    config = parse_config(
        {"arms": [{"name": "s", "command": command}, {"name": "u", "url": "http://h:1", "kind": "sglang"}]}
    )
    assert [(a.server_kind, a.resolved_kind) for a in config.arms] == [(kinds.SGLANG, "sglang")] * 2
    before, after = _sglang_metrics(100, 3.1), _sglang_metrics(612, 3.4)
    assert "sglang:generation_tokens_total" in after.samples and m.detect_flavour(after) is None
    window = m.spec_window(before, after, "m")
    assert (window.status, window.flavour) == (m.UNAVAILABLE, "sglang")
    assert "no spec-decode counters" in window.detail
    assert (window.drafts, window.acceptance_rate, window.mean_acceptance_length) == (None, None, None)
    assert m.kind_mismatch(window, kinds.SGLANG) is None
    assert m.kind_mismatch(window, kinds.VLLM) == "the arm's kind is vllm, but /metrics has sglang's counters (sglang:)"


def test_sglang_log_lines_are_evidence() -> None:
    # lines as SGLang's f-strings build them (load_model_utils.py, engine.py, scheduler_metrics_mixin.py)
    log = [
        "[2026-01-05 10:00:01 TP0] Using FP8 KV cache but no scaling factors provided. "
        "Defaulting to scaling factors of 1.0.",
        "[2026-01-05 10:00:00] server_args={'model_path': 'm', 'quantization': 'modelopt_fp4', "
        "'speculative_algorithm': 'EAGLE3', 'speculative_num_steps': 3}",
        "[2026-01-05 10:01:00 TP0] Decode batch, #running-req: 4, #token: 2048, token usage: 0.01, "
        "accept len: 3.12, accept rate: 0.53, cuda graph: True, gen throughput (token/s): 812.40, #queue-req: 0, ",
    ]
    found = {e.pattern: e for e in logcheck.scan_lines(log)}
    assert found["sglang-kv-cache-scale-1.0"].severity == logcheck.WARNING
    assert found["sglang-speculative-algorithm"].value == "EAGLE3"
    assert found["sglang-accept-length"].value == "3.12"
    # vLLM's pattern reads the quantization from SGLang's server_args line as well
    assert found["quantization-method"].value == "modelopt_fp4"
