"""Quality scenarios: the JSONL format, the built-in suites, the checks and the [quality] table."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from weightsmith.bench.client import Answer, ToolCall
from weightsmith.bench.config import QualitySpec, parse_config
from weightsmith.bench.quality import checks
from weightsmith.bench.quality.scenarios import (
    CHECK_KEYS,
    HUMANEVAL_STOP,
    load_suite,
    parse_lines,
)
from weightsmith.core.errors import WeightsmithError

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def _line(**overrides: Any) -> str:
    raw: dict[str, Any] = {"id": "s1", "category": "c", "prompt": "2+2=", "check": {"type": "exact", "value": "4"}}
    raw.update(overrides)
    return json.dumps({k: v for k, v in raw.items() if v is not None})


def _error(lines: list[str]) -> str:
    with pytest.raises(WeightsmithError) as info:
        parse_lines(lines, "suite.jsonl")
    assert info.value.file == "suite.jsonl"
    return info.value.message


def test_every_key_is_read() -> None:
    (s,) = parse_lines(
        [
            _line(
                prompt=None,
                messages=[{"role": "user", "content": "weather?"}],
                tools=[WEATHER],
                stop=["\n\n"],
                check={"type": "json_schema", "name": "get_weather", "arguments": {"required": ["city"]}},
            )
        ],
        "f",
    )
    assert (s.id, s.category, s.endpoint, s.stop, s.tools) == ("s1", "c", "chat", ["\n\n"], [WEATHER])
    assert s.check.kind == "json_schema" and s.check.name == "get_weather"
    assert parse_lines(["", _line(), "  "], "f")[0].endpoint == "completions"


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        (["{not json"], "line 1: not valid JSON"),
        ([_line(), "[1, 2]"], "line 2: a scenario must be a JSON object"),
        ([_line(id=None)], "line 1: missing key 'id'"),
        ([_line(category=None)], "line 1: missing key 'category'"),
        ([_line(check=None)], "line 1: missing key 'check'"),
        ([_line(id="")], "line 1: 'id' must be a non-empty string"),
        ([_line(id="a\nb")], "line 1: 'id' must be printable"),
        ([_line(), _line(category="d")], "line 2: id 's1' repeats line 1"),
        ([_line(colour="red")], "line 1: unknown key 'colour'"),
        ([_line(prompt=None)], "line 1: give exactly one of 'prompt' and 'messages'"),
        ([_line(messages=[{"role": "user", "content": "x"}])], "give exactly one of"),
        ([_line(prompt=None, messages=[{"role": "robot"}])], "messages[0]: needs a 'role'"),
        ([_line(prompt=None, messages=[{"role": "user", "content": 5}])], "messages[0]: 'content' must be"),
        ([_line(tools=[WEATHER])], "'tools' needs 'messages'"),
        ([_line(prompt=None, messages=[{"role": "user"}], tools=[{"type": "x"}])], "tools[0]: must be"),
        ([_line(stop="x")], "'stop' must be a list"),
        ([_line(check={"type": "bleu"})], 'check: type "bleu" is not one of exact, regex'),
        ([_line(check=["exact"])], "'check' must be an object"),
        ([_line(check={"type": "exact"})], "check: exact needs 'value'"),
        ([_line(check={"type": "exact", "value": 4})], "check: 'value' must be a string"),
        ([_line(check={"type": "exact", "value": "4", "case": 1})], "check: unknown key 'case' for exact"),
        ([_line(check={"type": "regex", "pattern": "(["})], "check: 'pattern' is not a valid regular expression"),
        (
            [_line(check={"type": "regex", "pattern": "(" * 5000 + ")" * 5000})],
            "check: 'pattern' is not a valid regular expression (maximum recursion depth exceeded)",
        ),
        ([_line(check={"type": "no_tool_call"})], "check: no_tool_call needs 'tools'"),
        (
            [
                _line(
                    prompt=None,
                    messages=[{"role": "user"}],
                    tools=[WEATHER],
                    check={"type": "json_schema", "name": "f", "arguments": {"type": "nonsense"}},
                )
            ],
            "check: 'arguments' is not a valid JSON Schema",
        ),
        ([_line(check={"type": "python_tests", "tests": "", "entry_point": "a b"})], "'entry_point' must be"),
        (["", "  "], "the suite holds no scenario"),
        (["[" * 100_000], "line 1: not valid JSON"),
    ],
)
def test_bad_lines_name_the_line_and_key(lines: list[str], says: str) -> None:
    assert says in _error(lines)


def test_suite_files_are_read_with_bounds(tmp_path: Path) -> None:
    good = tmp_path / "s.jsonl"
    good.write_text(_line() + "\n" + _line(id="s2", category="d") + "\n")
    suite = load_suite("s.jsonl", tmp_path)
    assert [s.id for s in suite.scenarios] == ["s1", "s2"] and suite.categories == ["c", "d"]
    assert [s.id for s in load_suite(str(good), categories=["d"]).scenarios] == ["s2"]
    with pytest.raises(WeightsmithError, match="categories e are not in suite"):
        load_suite(str(good), categories=["e"])
    with pytest.raises(WeightsmithError, match="cannot read scenario file"):
        load_suite(str(tmp_path / "missing.jsonl"))
    with pytest.raises(WeightsmithError, match="not one of builtin:humaneval, builtin:tool-use"):
        load_suite("builtin:mmlu")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(WeightsmithError, match="not UTF-8"):
        load_suite(str(binary))


def test_humaneval_is_read_in_place_with_its_tests() -> None:
    suite = load_suite("builtin:humaneval")
    assert len(suite.scenarios) == 164 and suite.categories == ["humaneval"] and suite.runs_code
    first = suite.scenarios[0]
    assert first.id == "HumanEval/0" and first.prompt is not None and "def has_close_elements" in first.prompt
    assert first.check.entry_point == "has_close_elements" and "def check(candidate)" in first.check.tests
    assert first.stop == list(HUMANEVAL_STOP)
    assert [s.id for s in load_suite("builtin:humaneval", limit=3).scenarios] == [f"HumanEval/{i}" for i in range(3)]


def test_tool_use_suite_has_four_categories_of_at_least_ten() -> None:
    suite = load_suite("builtin:tool-use")
    counts = Counter(s.category for s in suite.scenarios)
    assert set(counts) == {"tool choice", "argument construction", "multi-step", "restraint"}
    assert min(counts.values()) >= 10
    assert all(s.tools and s.messages for s in suite.scenarios)
    kinds = {cat: {s.check.kind for s in suite.scenarios if s.category == cat} for cat in counts}
    assert kinds["restraint"] == {"no_tool_call"}
    assert kinds["tool choice"] == kinds["argument construction"] == kinds["multi-step"] == {"json_schema"}
    # a multi-step scenario carries the earlier call and its result, in the OpenAI wire format
    multi = next(s for s in suite.scenarios if s.category == "multi-step")
    assert multi.messages is not None and [m["role"] for m in multi.messages][-2:] == ["assistant", "tool"]
    limited = load_suite("builtin:tool-use", limit=2)
    assert Counter(s.category for s in limited.scenarios) == dict.fromkeys(counts, 2)


def _tool_use(sid: str) -> Any:
    return next(s for s in load_suite("builtin:tool-use").scenarios if s.id == sid)


def test_tool_use_checks_accept_a_right_call_and_refuse_wrong_ones() -> None:
    s = _tool_use("args-weather-f")
    right = Answer(tool_calls=[ToolCall("get_weather", '{"city": "Chicago", "unit": "fahrenheit"}')])
    assert checks.judge(s.check, s, right) == (True, "")
    ok, detail = checks.judge(s.check, s, Answer(tool_calls=[ToolCall("get_weather", '{"city": "Chicago"}')]))
    assert not ok and "'unit' is a required property" in detail
    ok, detail = checks.judge(s.check, s, Answer(tool_calls=[ToolCall("get_weather", '{"city": "Chic')]))
    assert (ok, detail) == (False, "tool call arguments are not JSON")
    ok, detail = checks.judge(s.check, s, Answer(tool_calls=[ToolCall("set_timer", "{}")]))
    assert not ok and detail.startswith('called "set_timer"')
    assert checks.judge(s.check, s, Answer(content="It is sunny.")) == (False, "no tool call")
    r = _tool_use("restraint-capital")
    assert checks.judge(r.check, r, Answer(content="Paris.")) == (True, "")
    assert not checks.judge(r.check, r, right)[0]


def test_exact_and_regex_checks() -> None:
    assert checks.exact("4", Answer(content=" 4\n")) == (True, "")
    assert checks.exact("4", Answer(content="four"))[0] is False
    assert checks.regex_search(r"\b4\b", Answer(content="it is 4.")) == (True, "")
    assert checks.regex_search(r"\b5\b", Answer(content="it is 4.")) == (False, "regex did not match")


def test_regex_check_is_time_bounded() -> None:
    ok, detail = checks.regex_search(r"(a|aa)+$", Answer(content="a" * 60 + "b"))
    assert not ok and "took over" in detail


def test_python_tests_program_continues_a_prompt_or_takes_a_fenced_block() -> None:
    tests = {"type": "python_tests", "tests": "def check(c):\n    assert c(2) == 4\n", "entry_point": "f"}
    (s,) = parse_lines([_line(prompt="def f(x):\n", check=tests, stop=["\ndef "])], "f")
    program = checks.program(s, Answer(content="    return x * 2\ndef junk(:\n"))
    assert program.startswith("def f(x):\n    return x * 2\n\n") and "junk" not in program
    assert program.rstrip().endswith("check(f)")
    (chat,) = parse_lines([_line(prompt=None, messages=[{"role": "user", "content": "write f"}], check=tests)], "f")
    answer = Answer(content="Here:\n```python\ndef f(x):\n    return 2 * x\n```\nDone.")
    assert checks.program(chat, answer).startswith("def f(x):\n    return 2 * x\n\n")


def test_check_table_covers_every_kind() -> None:
    assert set(CHECK_KEYS) == {"exact", "regex", "json_schema", "no_tool_call", "python_tests"}


def test_quality_table() -> None:
    arms = [{"name": "a", "url": "http://127.0.0.1:1"}]
    config = parse_config({"arms": arms, "quality": {"suite": "builtin:tool-use"}})
    assert config.quality == QualitySpec(suite="builtin:tool-use", runs=2, max_tokens=512, limit=None, categories=[])
    assert parse_config({"arms": arms}).quality is None
    for bad, says in [
        ({"suite": ""}, "'suite' must name"),
        ({"runs": 2}, "'suite' must name"),
        ({"suite": "x", "runs": 0}, "runs must be > 0"),
        ({"suite": "x", "limit": 0}, "limit must be > 0"),
        ({"suite": "x", "max_tokens": 1.5}, "'max_tokens' must be int"),
        ({"suite": "x", "categories": [""]}, "categories[0] must be a non-empty string"),
        ({"suite": "x", "seed": 1}, "unknown key 'seed'"),
    ]:
        with pytest.raises(WeightsmithError) as info:
            parse_config({"arms": arms, "quality": bad}, "arms.toml")
        assert says in info.value.message and info.value.file == "arms.toml"
