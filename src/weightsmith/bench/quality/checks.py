"""Judge one answer: each check returns (passed, detail), the detail empty when it passed.

A check never raises on what the model wrote: malformed tool-call JSON, a regex that would
backtrack for hours on a long answer, or code that crashes are all a failed scenario with a reason.
"""

from __future__ import annotations

import json
import re
from typing import Any

import regex

from weightsmith.bench.client import Answer
from weightsmith.bench.quality.sandbox import run_program
from weightsmith.bench.quality.scenarios import Check, Scenario
from weightsmith.formats.targets import MATCH_TIMEOUT_S

Verdict = tuple[bool, str]

_FENCE = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)```", re.DOTALL)


def _short(text: str, limit: int = 60) -> str:
    return json.dumps(text[:limit]) + ("..." if len(text) > limit else "")


def exact(expected: str, answer: Answer) -> Verdict:
    """The answer's text equals `expected`, surrounding whitespace ignored."""
    if answer.content.strip() == expected.strip():
        return True, ""
    return False, f"answer {_short(answer.content.strip())} is not {_short(expected.strip())}"


def regex_search(pattern: str, answer: Answer) -> Verdict:
    """`pattern` is found in the answer's text, within the time limit patterns get elsewhere."""
    try:
        found = regex.search(pattern, answer.content, timeout=MATCH_TIMEOUT_S)
    except TimeoutError:
        return False, f"regex took over {MATCH_TIMEOUT_S:g} s on the answer ({len(answer.content)} characters)"
    return (True, "") if found else (False, "regex did not match")


def json_schema(name: str, arguments: dict[str, Any], answer: Answer) -> Verdict:
    """The first tool call names `name`, and its arguments parse as JSON that meets the schema."""
    import jsonschema

    if not answer.tool_calls:
        return False, "no tool call"
    call = answer.tool_calls[0]
    if call.name != name:
        return False, f"called {_short(call.name)}, not {_short(name)}"
    try:
        parsed = json.loads(call.arguments or "{}")
    except (json.JSONDecodeError, RecursionError):
        return False, "tool call arguments are not JSON"
    try:
        jsonschema.validate(parsed, arguments, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "arguments"
        return False, f"{where}: {exc.message[:120]}"
    return True, ""


def no_tool_call(answer: Answer) -> Verdict:
    """Restraint: the answer calls no tool."""
    if answer.tool_calls:
        return False, f"called {_short(answer.tool_calls[0].name)} when no tool was needed"
    return True, ""


def program(scenario: Scenario, answer: Answer) -> str:
    """The program `python_tests` runs: a completion continues its prompt; a chat answer is its
    first fenced code block (or the whole text); then the tests, then `check(entry_point)`."""
    if scenario.prompt is not None:
        code = scenario.prompt + cut_at_stop(answer.content, scenario.stop)
    else:
        fenced = _FENCE.search(answer.content)
        code = fenced.group(1) if fenced else answer.content
    parts = [code, scenario.check.tests]
    if scenario.check.entry_point:
        parts.append(f"check({scenario.check.entry_point})")
    return "\n\n".join(parts) + "\n"


def cut_at_stop(text: str, stop: list[str] | None) -> str:
    """`text` up to its first stop sequence: not every server honours `stop` the same way."""
    cut = len(text)
    for s in stop or []:
        at = text.find(s)
        if at != -1:
            cut = min(cut, at)
    return text[:cut]


def python_tests(scenario: Scenario, answer: Answer, *, sandboxed: bool) -> Verdict:
    """The program (`program`) exits 0 in the sandbox within its limits."""
    outcome = run_program(program(scenario, answer), sandboxed=sandboxed)
    return outcome.passed, "" if outcome.passed else f"tests failed: {outcome.detail}"


def judge(check: Check, scenario: Scenario, answer: Answer, *, sandboxed: bool = True) -> Verdict:
    """Run the scenario's check on the answer."""
    if check.kind == "exact":
        return exact(check.value, answer)
    if check.kind == "regex":
        return regex_search(check.pattern, answer)
    if check.kind == "json_schema":
        return json_schema(check.name, check.arguments, answer)
    if check.kind == "no_tool_call":
        return no_tool_call(answer)
    if check.kind == "python_tests":
        return python_tests(scenario, answer, sandboxed=sandboxed)
    raise ValueError(f"unknown check {check.kind!r}")  # the loader admits only the kinds above
