"""Quality runs inside the bench: stand-in vLLM servers answer a suite, the runner judges and keeps
every answer, and the speed window stays exactly as it is without them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from standin_vllm import standin_command

from weightsmith.bench import client as cl
from weightsmith.bench.config import parse_config
from weightsmith.bench.quality import sandbox
from weightsmith.bench.quality.runs import prepare
from weightsmith.bench.report import RESULTS_FILE, write_all, write_results_file
from weightsmith.bench.results import VISIT_OK, load_results
from weightsmith.bench.runner import run_bench

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SUITE = [
    {"id": "add", "category": "arithmetic", "prompt": "[add] 2+2=", "check": {"type": "exact", "value": "4"}},
    {"id": "mul", "category": "arithmetic", "prompt": "[mul] 6*7=", "check": {"type": "regex", "pattern": r"\b42\b"}},
    {
        "id": "weather",
        "category": "tools",
        "messages": [{"role": "user", "content": "[weather] rain in Oslo?"}],
        "tools": [TOOL],
        "check": {
            "type": "json_schema",
            "name": "get_weather",
            "arguments": {"properties": {"city": {"const": "Oslo"}}, "required": ["city"]},
        },
    },
    {
        "id": "hello",
        "category": "tools",
        "messages": [{"role": "user", "content": "[hello] hi!"}],
        "tools": [TOOL],
        "check": {"type": "no_tool_call"},
    },
    {
        "id": "double",
        "category": "code",
        "prompt": "# [double]\ndef double(x):\n",
        # HumanEval's five: the server takes at most four (vLLM answers 400 to five), the check cuts at all
        "stop": ["\nclass ", "\nif __name__", "\nprint(", "\n#", "\ndef "],
        "check": {"type": "python_tests", "tests": "def check(f):\n    assert f(3) == 6\n", "entry_point": "double"},
    },
]
#: Arm a answers every scenario right; arm b gets `mul`, `weather` and `double` wrong.
RIGHT = {
    "[add]": {"content": " 4"},
    "[mul]": {"content": "That is 42."},
    "[weather]": {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
    "[hello]": {"content": "Hello!"},
    "[double]": {"content": "    return 2 * x\ndef unrelated(:\n"},
}
WRONG = {
    **RIGHT,
    "[mul]": {"content": "That is 48."},
    "[weather]": {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Bergen"}}]},
    "[double]": {"content": "    return x + 2\n"},
}


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _config(tmp_path: Path, quality: dict[str, Any] | None) -> dict[str, Any]:
    arms = []
    for name, answers in (("a", RIGHT), ("b", WRONG)):
        path = tmp_path / f"answers-{name}.json"
        path.write_text(json.dumps(answers))
        arms.append({"name": name, "kind": "vllm", "command": standin_command("--k", "3", "--answers", str(path))})
    data: dict[str, Any] = {
        "repeats": 2,
        "warmups": 1,
        "workload": {"prompt_tokens": [40], "prompts_per_length": 3, "max_tokens": 11},
        "determinism": {"replicates": 0},
        "arms": arms,
    }
    if quality is not None:
        data["quality"] = quality
    return data


@pytest.mark.skipif(sandbox.unavailable() is not None, reason="no sandbox on this machine")
def test_quality_runs_in_the_first_visit_and_leave_the_window_alone(tmp_path: Path) -> None:
    _write(tmp_path / "suite.jsonl", SUITE)
    plain = run_bench(parse_config(_config(tmp_path, None)), tmp_path / "plain")
    config = parse_config(_config(tmp_path, {"suite": str(tmp_path / "suite.jsonl"), "runs": 2}))
    phases: list[str] = []

    class Observer:
        def __getattr__(self, name: str) -> Any:
            return (lambda text: phases.append(text)) if name == "phase" else (lambda *a: None)

    results = run_bench(config, tmp_path / "out", Observer())  # type: ignore[arg-type]
    assert all(v.status == VISIT_OK for v in results.visits)
    # the suite's local path is recorded portably (its file name: no arms file to be relative to)
    assert [(q.arm, q.run, q.suite) for q in results.quality] == [
        ("a", 0, "suite.jsonl"),
        ("a", 1, "suite.jsonl"),
        ("b", 0, "suite.jsonl"),
        ("b", 1, "suite.jsonl"),
    ]
    assert results.config["quality"]["suite"] == "suite.jsonl"
    for q in results.quality:
        passed = {o.scenario: o.passed for o in q.outcomes}
        want_wrong = set() if q.arm == "a" else {"mul", "weather", "double"}
        assert passed == {s["id"]: s["id"] not in want_wrong for s in SUITE}
        assert [o.category for o in q.outcomes] == [s["category"] for s in SUITE]
        assert all(o.error is None and o.completion_tokens for o in q.outcomes)
    wrong = {o.scenario: o.detail for o in results.quality[2].outcomes if not o.passed}
    assert wrong["mul"] == "regex did not match"
    assert wrong["weather"].startswith("city: 'Oslo' was expected")
    assert wrong["double"].startswith("tests failed: AssertionError")
    assert "quality run 2/2: scenario 5/5" in phases
    # the quality requests came after the window: its counters read exactly as without them
    for with_q, without in zip(results.visits, plain.visits, strict=True):
        assert with_q.spec is not None and without.spec is not None
        assert (with_q.spec.drafts, with_q.spec.accepted) == (without.spec.drafts, without.spec.accepted)
    write_results_file(results, None, tmp_path / "out")
    again = load_results(tmp_path / "out" / RESULTS_FILE)
    assert again.quality == results.quality
    # the report reads them: arm b's three misses are the discordant scenarios, none a within-arm flip
    analysis, files = write_all(results, tmp_path / "report")
    assert analysis.quality is not None
    (comparison,) = analysis.quality.comparisons
    assert (comparison.baseline, comparison.arm) == ("a", "b")
    assert sorted(comparison.baseline_better) == ["double", "mul", "weather"]
    assert comparison.arm_better == [] and comparison.also_flip == []
    section = files["report"].read_text().split("## Quality", 1)[1]
    assert "2 run(s) per arm" in section and "`b`" in section


def test_a_bad_suite_stops_the_run_before_any_server(tmp_path: Path) -> None:
    _write(tmp_path / "suite.jsonl", [SUITE[0], {**SUITE[1], "check": {"type": "bleu"}}])
    config = parse_config(_config(tmp_path, {"suite": "suite.jsonl"}), str(tmp_path / "arms.toml"))
    (tmp_path / "arms.toml").write_text("")
    with pytest.raises(Exception, match=r"suite.jsonl: line 2: check: type \"bleu\""):
        prepare(config)
    with pytest.raises(Exception, match="line 2"):
        run_bench(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_client_reads_vllm_tool_calls(standin: Any, tmp_path: Path) -> None:
    url = standin(answers={"[weather]": {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}})
    body = {
        "model": "standin/model",
        "messages": [{"role": "user", "content": "[weather] rain?"}],
        "tools": [TOOL],
        "max_tokens": 32,
    }
    with httpx.Client() as client:
        raw = client.post(url + "/v1/chat/completions", json=body).json()
        answer = cl.complete(client, url, "chat", body, 10.0)
        plain = cl.complete(
            client, url, "completions", {"model": "standin/model", "prompt": "x", "max_tokens": 5}, 10.0
        )
    # vLLM's layout: arguments a JSON string, tool call ids chatcmpl-tool-..., finish reason tool_calls
    call = raw["choices"][0]["message"]["tool_calls"][0]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert raw["choices"][0]["finish_reason"] == "tool_calls" and raw["choices"][0]["message"]["content"] is None
    assert answer == cl.Answer(
        content="",
        tool_calls=[cl.ToolCall("get_weather", '{"city": "Oslo"}')],
        completion_tokens=answer.completion_tokens,
        finish_reason="tool_calls",
    )
    assert plain.error is None and plain.completion_tokens == 5 and plain.finish_reason == "length" and plain.content


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ([], "the response is not a JSON object"),
        ({"choices": []}, "the response has no choices"),
        ({"choices": [{"text": "x"}]}, "choices[0] has no message"),
        ({"choices": [{"message": {"tool_calls": {}}}]}, "tool_calls is not a list"),
        ({"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}, "tool_calls[0] has no function name"),
        (
            {"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": 3}}]}}]},
            "tool_calls[0].function.arguments is not a string",
        ),
    ],
)
def test_malformed_chat_answers_are_errors_not_crashes(payload: Any, error: str) -> None:
    assert cl.answer_from_json("chat", payload).error == error


def test_arguments_sent_as_an_object_are_kept_as_json_text() -> None:
    payload = {
        "choices": [{"message": {"content": None, "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}}]
    }
    assert cl.answer_from_json("chat", payload).tool_calls == [cl.ToolCall("f", '{"a": 1}')]


def test_unsandboxed_runs_are_allowed_only_through_a_prepared_plan() -> None:
    """`--allow-unsandboxed` reaches `quality.prepare`; `run_bench` has no second way to say it."""
    import inspect

    assert "allow_unsandboxed" not in inspect.signature(run_bench).parameters
    assert "allow_unsandboxed" in inspect.signature(prepare).parameters
