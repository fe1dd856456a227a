"""The raw record of a benchmark run, as typed objects that round-trip through versioned JSON.

Everything the analysis and the report need is here as measured, sample by sample, so that a
report can be rebuilt (or a new analysis run) from the JSON file alone. The analysis is written
beside it in the same file for convenience, but it is never read back: it is recomputed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith.bench.client import RequestTiming, TokenLogprob
from weightsmith.bench.config import sweep_base
from weightsmith.bench.metrics import SpecWindow
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import MAX_JSON_BYTES, TooLarge, read_regular, replace_file
from weightsmith.core.jsonable import jsonable
from weightsmith.core.severity import ERROR, WARNING, Severity
from weightsmith.core.terminal import ENV_NAME, short_repr

SCHEMA = "weightsmith.bench.results"
#: Bump on any change a reader of an older file would misread. Version 2 records paths portably
#: (`bench/paths.py`: `$MODEL`, `$DRAFT`, relative to a root, else a file name) and each arm's `files`;
#: version 1 recorded them as the run's machine spelled them and is read as it is (`files` empty).
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)

VISIT_OK = "ok"
VISIT_FAILED = "failed"
VISIT_SKIPPED = "skipped"

#: The log check's former words for the project's severities, as files written before the scale was
#: shared spell them; read as the words they stand for.
_FORMER_SEVERITIES = {"bad": ERROR, "warn": WARNING}


@dataclass
class PromptRef:
    """Which prompt a request sent."""

    prompt_key: str
    target_tokens: int
    prompt_index: int


# Fields come base-last-first: the prompt's, then the timing's, then `started_s`, the order
# results.json has always had.
@dataclass
class RequestRecord(RequestTiming, PromptRef):
    """One measured request; `error` is set when it produced no usable timing."""

    started_s: float = 0.0
    #: This request's own spec-decode counts, from /metrics scraped before and after it (measured at
    #: concurrency 1 only, where no other request shares the counters); None where not measured.
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted: float | None = None

    @property
    def ok(self) -> bool:
        """A request whose timings can be used."""
        return self.error is None

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / drafts for this request alone (`metrics.acceptance_figures`), if it drafted."""
        if not self.spec_drafts or self.spec_accepted is None:
            return None
        return 1.0 + self.spec_accepted / self.spec_drafts


@dataclass
class Evidence:
    """A server-log (or response-content) line matched by the log check's table."""

    pattern: str
    meaning: str
    severity: Severity
    count: int
    first_line: str
    value: str | None = None


@dataclass
class VisitResult:
    """One arm in one repeat: its requests, its /metrics window, and how it ended."""

    arm: str
    repeat: int
    position: int
    status: str = VISIT_OK
    failure: str | None = None
    log_tail: str | None = None
    startup_s: float | None = None
    warmups: int = 0
    requests: list[RequestRecord] = field(default_factory=list)
    spec: SpecWindow | None = None
    log_path: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


@dataclass
class Replicate:
    """One answer to the determinism request."""

    content: str = ""
    error: str | None = None
    positions: list[TokenLogprob] = field(default_factory=list)
    completion_tokens: int | None = None


@dataclass
class DeterminismRun:
    """The same request sent repeatedly to one arm."""

    arm: str
    prompt_key: str
    replicates: list[Replicate] = field(default_factory=list)


@dataclass
class ScenarioOutcome:
    """One scenario's answer in one quality run, and whether its check passed."""

    scenario: str
    category: str
    passed: bool
    #: Why it did not pass, in a few words ("regex did not match", "tests failed: AssertionError"),
    #: or why no answer came (a request error); empty when it passed.
    detail: str = ""
    #: The request failed (no answer to check); such a scenario counts as not passed.
    error: str | None = None
    completion_tokens: int | None = None


@dataclass
class QualityRun:
    """One pass of an arm over a quality suite, within one serve visit."""

    arm: str
    #: The run's index within the arm (0, 1, ...), in the order the runs were made.
    run: int
    suite: str
    outcomes: list[ScenarioOutcome] = field(default_factory=list)


@dataclass
class ArmInfo:
    """What an arm was, and whether it survived the run."""

    name: str
    kind: str
    url: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    sweep_param: str | None = None
    sweep_value: Any = None
    status: str = VISIT_OK
    failure: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    log_paths: list[str] = field(default_factory=list)
    #: The file (or folder) name behind each placeholder the command uses: {"MODEL": "x.gguf"}.
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class PromptInfo:
    """A prompt body's identity and origin (the text itself is rebuilt from the seed)."""

    key: str
    target_tokens: int
    index: int
    source: str
    chars: int


@dataclass
class BenchResults:
    """A whole run, raw."""

    created: str
    weightsmith_version: str
    host: dict[str, str]
    config: dict[str, Any]
    baseline: str
    prefill_min_tokens: int
    alpha: float
    chars_per_token: float
    chars_per_token_source: str
    prompts: list[PromptInfo] = field(default_factory=list)
    order: list[list[Any]] = field(default_factory=list)
    arms: list[ArmInfo] = field(default_factory=list)
    visits: list[VisitResult] = field(default_factory=list)
    determinism: list[DeterminismRun] = field(default_factory=list)
    quality: list[QualityRun] = field(default_factory=list)
    interrupted: bool = False
    #: The draft the other drafts' acceptance is compared with (an arm, or a swept arm's base name).
    acceptance_baseline: str | None = None
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION

    def arm(self, name: str) -> ArmInfo:
        """The arm called `name`."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(name)


#: The bench name for the shared conversion (runner, report and tests import it from here).
to_jsonable = jsonable


#: Deeper than any file `bench run` writes (about 6 levels); a deeper one is not a results file,
#: and walking it would only exhaust the stack.
MAX_JSON_DEPTH = 64


class _Malformed(Exception):
    """A value in the results file is not what its field holds; `where` is the field's path."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")


_KIND = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a number"}


def _kind(data: Any) -> str:
    """What a JSON value is, in words."""
    return "null" if data is None else _KIND.get(type(data), type(data).__name__)


def _build(tp: Any, data: Any, where: str) -> Any:
    """Rebuild a value of type `tp` from its JSON form, checking it is that type on the way."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return data
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if data not in allowed:
            raise _Malformed(where, f"must be one of {', '.join(map(str, allowed))}, got {_kind(data)}")
        return data
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return _build(options[0], data, where) if len(options) == 1 else data
    if origin is list:
        if not isinstance(data, list):
            raise _Malformed(where, f"must be an array, got {_kind(data)}")
        (inner,) = typing.get_args(tp)
        return [_build(inner, v, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        if not isinstance(data, dict):
            raise _Malformed(where, f"must be an object, got {_kind(data)}")
        _, inner = typing.get_args(tp)
        # a non-finite number inside a map (a -inf logprob) was written as null
        return {k: None if v is None else _build(inner, v, f"{where}.{k}") for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise _Malformed(where, f"must be an object, got {_kind(data)}")
        hints = typing.get_type_hints(tp)
        prefix = f"{where}." if where else ""
        fields = dataclasses.fields(tp)
        required = [
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = next((name for name in required if name not in data), None)
        if missing is not None:
            raise _Malformed(f"{prefix}{missing}", "missing")
        names = {f.name for f in fields}
        built: Any = tp  # a dataclass type, called with its fields
        return built(**{k: _build(hints[k], v, f"{prefix}{k}") for k, v in data.items() if k in names})
    if tp is bool:
        ok = isinstance(data, bool)
    elif tp is int:
        ok = isinstance(data, int) and not isinstance(data, bool)
    elif tp is float:
        ok = isinstance(data, int | float) and not isinstance(data, bool)
        data = float(data) if ok else data
    else:
        ok = isinstance(data, tp)
    if not ok:
        raise _Malformed(where, f"must be {_KIND.get(tp, tp.__name__)}, got {_kind(data)}")
    return data


def _check_values(results: BenchResults) -> None:
    """What the analysis and the report rely on beyond types.

    Every env key is a variable name; every arm a visit, a determinism run, a quality run or the baseline
    names is one of the file's arms; statuses are known; alpha lies where a confidence level can; the workload
    settings are tables.
    """
    if not 0 < results.alpha < 0.5:
        raise _Malformed("alpha", "must be > 0 and < 0.5")
    for key in ("workload", "determinism"):
        if not isinstance(results.config.get(key, {}), dict):
            raise _Malformed(f"config.{key}", f"must be an object, got {_kind(results.config[key])}")
    for i, info in enumerate(results.arms):
        for key in info.env:  # printed before the arm's command in the report and the card
            if not ENV_NAME.fullmatch(key):
                raise _Malformed(f"arms[{i}].env", f"{short_repr(key)} is not a variable name")
    names = {a.name for a in results.arms}
    if results.baseline not in names:
        raise _Malformed("baseline", f"{results.baseline[:60]!r} is not one of the arms")
    bases = names | {sweep_base(a.name) for a in results.arms}
    if results.acceptance_baseline is not None and results.acceptance_baseline not in bases:
        raise _Malformed("acceptance_baseline", f"{results.acceptance_baseline[:60]!r} is not one of the arms")
    named = (
        ("visits", [v.arm for v in results.visits]),
        ("determinism", [d.arm for d in results.determinism]),
        ("quality", [q.arm for q in results.quality]),
    )
    for field_name, arms in named:
        for i, arm in enumerate(arms):
            if arm not in names:
                raise _Malformed(f"{field_name}[{i}].arm", f"{arm[:60]!r} is not one of the arms")
    statuses = (VISIT_OK, VISIT_FAILED, VISIT_SKIPPED)
    for i, visit in enumerate(results.visits):
        if visit.status not in statuses:
            raise _Malformed(f"visits[{i}].status", f"must be one of {', '.join(statuses)}")


def results_from_dict(data: dict[str, Any], path: str = "<results>") -> BenchResults:
    """Check the schema and version, then rebuild the typed record, checking every field's type."""
    if data.get("schema") != SCHEMA:
        raise WeightsmithError("not a weightsmith bench results file", file=path)
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        shown = version if isinstance(version, int) and abs(version) < 1000 else _kind(version)
        supported = " or ".join(map(str, READABLE_VERSIONS))
        raise WeightsmithError(f"results schema version {shown} is not a supported one ({supported})", file=path)
    try:
        results: BenchResults = _build(BenchResults, _current_severities(data), "")
        _check_values(results)
    except _Malformed as exc:
        raise WeightsmithError(f"results file is malformed: field {exc}", file=path) from None
    return results


def _current_severities(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each evidence severity in the current words (a copy where one was rewritten)."""
    arms = data.get("arms")
    if not isinstance(arms, list):
        return data
    upgraded = []
    for arm in arms:
        evidence = arm.get("evidence") if isinstance(arm, dict) else None
        if isinstance(evidence, list):
            evidence = [
                {**e, "severity": _FORMER_SEVERITIES[e["severity"]]}
                if isinstance(e, dict) and isinstance(e.get("severity"), str) and e["severity"] in _FORMER_SEVERITIES
                else e
                for e in evidence
            ]
            arm = {**arm, "evidence": evidence}
        upgraded.append(arm)
    return {**data, "arms": upgraded}


def _depth(data: Any) -> int:
    """How deeply `data` nests, found without recursion."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return deepest


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number as a float, refused where it is beyond a float's range (`1e400` reads as inf)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond a float's range")
    return value


def load_results(path: str | Path) -> BenchResults:
    """Read a results JSON file written by `write_results`; anything else is one line naming the field."""
    p = Path(path)
    try:
        text = read_regular(p, MAX_JSON_BYTES).decode("utf-8")
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except TooLarge as exc:
        raise WeightsmithError(f"results file {exc.strerror}", file=p) from None
    except OSError as exc:
        raise WeightsmithError(f"cannot read results: {exc.strerror}", file=p) from None
    except UnicodeDecodeError as exc:
        raise WeightsmithError(f"results file is not UTF-8 text (byte {exc.start})", file=p) from None
    except json.JSONDecodeError as exc:
        raise WeightsmithError(f"results file is not JSON: {exc.msg} (line {exc.lineno})", file=p) from None
    except RecursionError:
        raise WeightsmithError(f"results file is nested deeper than {MAX_JSON_DEPTH} levels", file=p) from None
    except ValueError as exc:  # NaN, Infinity or 1e400, or an integer of more than 4300 digits
        raise WeightsmithError(f"results file is not JSON: {str(exc)[:80]}", file=p) from None
    if not isinstance(data, dict):
        raise WeightsmithError("not a weightsmith bench results file", file=p)
    if _depth(data) > MAX_JSON_DEPTH:
        raise WeightsmithError(f"results file is nested deeper than {MAX_JSON_DEPTH} levels", file=p)
    return results_from_dict(data, str(p))


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically: a reader (or a crash) never sees half a results file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, (json.dumps(payload, indent=1, allow_nan=False) + "\n").encode())
