"""Server kinds: one entry per kind, read by config, metrics, servers, client and the log check."""

from __future__ import annotations

import json

import pytest

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
    assert [k for k in kinds.KINDS if k.cache_env] == [kinds.VLLM]


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
