"""The raw record of a benchmark run, as typed objects that round-trip through versioned JSON.

Everything the analysis and the report need is here as measured, sample by sample, so that a
report can be rebuilt (or a new analysis run) from the JSON file alone. The analysis is written
beside it in the same file for convenience, but it is never read back: it is recomputed.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith.bench.client import TokenLogprob
from weightsmith.bench.metrics import SpecWindow
from weightsmith.errors import WeightsmithError
from weightsmith.jsonable import jsonable

SCHEMA = "weightsmith.bench.results"
#: Bump on any change a reader of an older file would misread.
SCHEMA_VERSION = 1

VISIT_OK = "ok"
VISIT_FAILED = "failed"
VISIT_SKIPPED = "skipped"


@dataclass
class RequestRecord:
    """One measured request; `error` is set when it produced no usable timing."""

    prompt_key: str
    target_tokens: int
    prompt_index: int
    error: str | None = None
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    token_chunks: int = 0
    finish_reason: str | None = None
    started_s: float = 0.0

    @property
    def ok(self) -> bool:
        """A request whose timings can be used."""
        return self.error is None


@dataclass
class Evidence:
    """A server-log (or response-content) line matched by the log check's table."""

    pattern: str
    meaning: str
    severity: str
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
    interrupted: bool = False
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


def _build(tp: Any, data: Any) -> Any:
    """Rebuild a value of type `tp` from its JSON form."""
    origin = typing.get_origin(tp)
    if tp is Any or data is None:
        return data
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(options[0], data) if len(options) == 1 else data
    if origin is list:
        (inner,) = typing.get_args(tp)
        return [_build(inner, v) for v in data]
    if origin is dict:
        _, inner = typing.get_args(tp)
        return {k: _build(inner, v) for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        return tp(**{k: _build(hints[k], v) for k, v in data.items() if k in names})
    if tp is float and isinstance(data, int):
        return float(data)
    return data


def results_from_dict(data: dict[str, Any], path: str = "<results>") -> BenchResults:
    """Check the schema and version, then rebuild the typed record."""
    if data.get("schema") != SCHEMA:
        raise WeightsmithError("not a weightsmith bench results file", file=path)
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise WeightsmithError(f"results schema version {version} is not the supported {SCHEMA_VERSION}", file=path)
    try:
        return _build(BenchResults, data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise WeightsmithError(f"results file is malformed: {exc}", file=path) from None


def load_results(path: str | Path) -> BenchResults:
    """Read a results JSON file written by `write_results`."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WeightsmithError(f"cannot read results: {exc.strerror}", file=p) from None
    except json.JSONDecodeError as exc:
        raise WeightsmithError(f"results file is not JSON: {exc.msg}", file=p) from None
    if not isinstance(data, dict):
        raise WeightsmithError("not a weightsmith bench results file", file=p)
    return results_from_dict(data, str(p))


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically: a reader (or a crash) never sees half a results file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)
