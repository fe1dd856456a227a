"""The arms file: what to compare, how to load it, and sweep expansion.

A benchmark is described in TOML so that the exact comparison can be kept beside its results and
run again. Every key is checked here, once: a typo in an arms file must stop the run before any
server starts, with one line that names the file and the key, not an hour later.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import tomllib
import types
import typing
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from weightsmith.bench import kinds
from weightsmith.bench.kinds import KIND_NAMES, ServerKind
from weightsmith.bench.quality.scenarios import MAX_SCENARIOS
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import read_text_file
from weightsmith.core.terminal import ENV_NAME

#: Placeholder in a command (and its url/env) replaced by a free loopback port at start time.
PORT_PLACEHOLDER = "{port}"

ENDPOINTS = ("completions", "chat")


#: Upper bounds of the arms file's numbers: generous for any real benchmark, small enough that a
#: typo (or a hostile file) cannot start a run that never ends or allocate without limit.
MAX_TOKENS = 1_048_576
MAX_REPEATS = 100
MAX_PROMPTS_PER_LENGTH = 1000
MAX_PROMPT_LENGTHS = 64
MAX_CONCURRENCY = 256
MAX_TIMEOUT_S = 86_400.0
MAX_ARMS = 100
MAX_NAME_CHARS = 128
MAX_ARMS_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Bound:
    """What one number in the arms file may be: `int` or `float`, and its lowest and highest value.

    Every number goes through `_number`, so NaN, infinity, a bool where an integer is meant and a
    value past its bound all get the same one-line error, which states the allowed range.
    """

    kind: type
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def text(self) -> str:
        """The range in words, e.g. `> 0 and <= 100`."""
        low = f"{'>' if self.low_open else '>='} {_fmt(self.low)}"
        high = f"{'<' if self.high_open else '<='} {_fmt(self.high)}"
        return f"{low} and {high}"

    def holds(self, value: float) -> bool:
        """True when `value` (a finite number) lies in the range."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


def _positive(kind: type, high: float) -> Bound:
    return Bound(kind, 0, high, low_open=True)


#: Field metadata: what the arms file may hold for the field (a `Bound`, a type or a tuple of
#: types) when its Python type does not say it, or `None` for a field the file cannot set.
TOML = "toml"


def _key(default: Any, allowed: Any) -> Any:
    """A field the arms file sets as `allowed` (a `Bound` for a number), defaulting to `default`."""
    return field(default=default, metadata={TOML: allowed})


_NOT_IN_FILE: dict[str, Any] = {TOML: None}


@dataclass(frozen=True)
class SweepSpec:
    """Expand one arm over the values of one server parameter.

    `flag` is the command-line flag; with `key`, the flag's value is a JSON object (vLLM's
    `--speculative-config`) and only that key changes.
    """

    flag: str
    values: tuple[Any, ...]
    key: str | None = None

    @property
    def param(self) -> str:
        """The name a reader knows the swept parameter by (the JSON key, else the flag)."""
        return self.key or self.flag.lstrip("-")


@dataclass
class ArmSpec:
    """One server configuration to measure: an address, or a command that starts a server."""

    name: str
    url: str | None = None
    #: A list of strings, or one string split like a shell would.
    command: list[str] | None = field(default=None, metadata={TOML: (str, list)})
    env: dict[str, str] = field(default_factory=dict)
    #: A `ServerKind` name, or `auto`: guessed from the command (`server_kind`).
    kind: str = kinds.AUTO
    model: str | None = None
    fresh_cache: bool = True
    startup_timeout_s: float = _key(600.0, _positive(float, MAX_TIMEOUT_S))
    extra_body: dict[str, Any] = field(default_factory=dict)
    sweep: SweepSpec | None = None
    sweep_param: str | None = field(default=None, metadata=_NOT_IN_FILE)
    sweep_value: Any = field(default=None, metadata=_NOT_IN_FILE)

    @property
    def server_kind(self) -> ServerKind:
        """The kind of server the arm runs: its cache isolation, metric names and log patterns."""
        return kinds.detect(self.command) if self.kind == kinds.AUTO else kinds.kind_named(self.kind)

    @property
    def resolved_kind(self) -> str:
        """The kind's name, as results and reports show it."""
        return self.server_kind.name


@dataclass
class WorkloadSpec:
    """The requests every arm receives: identical bodies, unique prefixes, greedy decoding."""

    prompt_tokens: list[int] = field(default_factory=lambda: [80, 600, 2048])
    prompts_per_length: int = _key(4, _positive(int, MAX_PROMPTS_PER_LENGTH))
    max_tokens: int = _key(64, _positive(int, MAX_TOKENS))
    concurrency: int = _key(1, _positive(int, MAX_CONCURRENCY))
    temperature: float = _key(0.0, Bound(float, 0, 2))
    endpoint: str = "completions"
    ignore_eos: bool = True
    seed: int = _key(0, Bound(int, 0, 2**32 - 1))
    chars_per_token: float | None = _key(None, _positive(float, 100))
    request_timeout_s: float = _key(300.0, _positive(float, MAX_TIMEOUT_S))


@dataclass
class DeterminismSpec:
    """The same request sent `replicates` times per arm, with top-k logprobs (0 turns it off)."""

    replicates: int = _key(5, Bound(int, 0, MAX_REPEATS))
    prompt_tokens: int = _key(600, _positive(int, MAX_TOKENS))
    max_tokens: int = _key(32, _positive(int, MAX_TOKENS))
    top_logprobs: int = _key(5, Bound(int, 0, 100))


@dataclass
class QualitySpec:
    """A task suite run `runs` times per arm at temperature 0, in the arm's first serve visit.

    `suite` is `builtin:humaneval`, `builtin:tool-use` or a JSONL file (relative to the arms file);
    `categories` keeps only those, `limit` the first N scenarios of each category.
    """

    suite: str = ""
    runs: int = _key(2, _positive(int, MAX_REPEATS))
    max_tokens: int = _key(512, _positive(int, MAX_TOKENS))
    limit: int | None = _key(None, _positive(int, MAX_SCENARIOS))
    categories: list[str] = field(default_factory=list)


@dataclass
class BenchConfig:
    """Everything one benchmark run needs, after sweep expansion."""

    arms: list[ArmSpec]
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)
    quality: QualitySpec | None = None
    repeats: int = _key(2, _positive(int, MAX_REPEATS))
    warmups: int = _key(2, Bound(int, 0, MAX_REPEATS))
    baseline: str | None = None
    #: The arm (or swept arm's name before `@`) whose draft every other draft's acceptance is compared
    #: with, prompt by prompt at the same swept value; None compares no drafts.
    acceptance_baseline: str | None = None
    prefill_min_tokens: int = _key(2000, Bound(int, 0, MAX_TOKENS))
    alpha: float = _key(0.05, Bound(float, 0, 0.5, low_open=True, high_open=True))
    source: str | None = field(default=None, metadata=_NOT_IN_FILE)

    @property
    def baseline_arm(self) -> str:
        """The arm every other arm is compared against (the first one unless named)."""
        return self.baseline or self.arms[0].name


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _q(text: str, limit: int = 60) -> str:
    """A string from the file, quoted for a one-line message (control characters escaped, cut short)."""
    if text.isprintable() and len(text) <= limit:
        return f"'{text}'"
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _shown(value: Any) -> str:
    """A value from the file as an error message shows it (never a huge or multi-line rendering)."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else "an integer beyond 2**64"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return _q(value)
    if isinstance(value, dict | list):
        return "a table" if isinstance(value, dict) else "an array"
    return f"a {type(value).__name__}"  # a TOML date or time


def _number(value: Any, bound: Bound, where: str, key: str, path: str) -> Any:
    """`value` as a checked `int` or `float`, or one line naming the key and the allowed range."""
    if bound.kind is int:
        right_type = isinstance(value, int) and not isinstance(value, bool)
    else:
        right_type = isinstance(value, int | float) and not isinstance(value, bool)
    if not right_type:
        raise WeightsmithError(
            f"{where}: '{key}' must be {bound.kind.__name__} ({bound.text()}), got {_shown(value)}", file=path
        )
    finite = isinstance(value, int) or math.isfinite(value)
    if not finite or not bound.holds(value):
        raise WeightsmithError(f"{where}: {key} must be {bound.text()}, got {_shown(value)}", file=path)
    return float(value) if bound.kind is float else value


def _file_type(hint: Any) -> Any:
    """What the arms file holds for a field of Python type `hint`: a table for a dataclass, an
    array for a list or tuple, else the type itself (`X | None` as `X`)."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    (tp,) = options
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(origin):
        return dict
    if origin in (list, tuple):
        return list
    if origin not in (str, bool, dict):
        raise TypeError(f"no arms-file type for {hint!r}: give the field a {TOML!r} metadata entry")
    return origin


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _file_keys(spec: type) -> dict[str, Any]:
    """The keys the arms file may give for dataclass `spec`, each with what it may hold: its
    `toml` metadata where it has one, else what its type says; a field marked `None` is left out."""
    hints = typing.get_type_hints(spec)
    keys = {}
    for f in dataclasses.fields(spec):
        allowed = f.metadata[TOML] if TOML in f.metadata else _file_type(hints[f.name])
        if allowed is not None:
            keys[f.name] = allowed
    return keys


_TOP_KEYS = _file_keys(BenchConfig)
_WORKLOAD_KEYS = _file_keys(WorkloadSpec)
_PROMPT_TOKENS = _positive(int, MAX_TOKENS)
_DETERMINISM_KEYS = _file_keys(DeterminismSpec)
_QUALITY_KEYS = _file_keys(QualitySpec)
_ARM_KEYS = _file_keys(ArmSpec)
_SWEEP_KEYS = _file_keys(SweepSpec)
#: What an `env` number or a sweep value may be: anything a command line can carry as text.
_SCALAR = Bound(float, -(2.0**63), 2.0**63)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def _check_table(table: dict[str, Any], allowed: dict[str, Any], where: str, path: str) -> dict[str, Any]:
    """`table` with every key known and every value of its type (numbers checked against their bounds)."""
    checked = {}
    for key, value in table.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise WeightsmithError(f"{where}: unknown key {_q(key)} (known: {known})", file=path)
        want = allowed[key]
        if isinstance(want, Bound):
            value = _number(value, want, where, key, path)
        elif not isinstance(value, want):
            names = " or ".join(t.__name__ for t in want) if isinstance(want, tuple) else want.__name__
            raise WeightsmithError(f"{where}: '{key}' must be {names}, got {_shown(value)}", file=path)
        checked[key] = value
    return checked


def _scalar(value: Any, where: str, key: str, path: str) -> Any:
    """A string, or a finite number within 2**63: what an env value or a sweep value may be."""
    if isinstance(value, str):
        return _no_nul(value, where, key, path)
    if isinstance(value, bool):
        return value
    if not isinstance(value, int | float):
        raise WeightsmithError(f"{where}: {key} must be a string or a number, got {_shown(value)}", file=path)
    _number(value, _SCALAR, where, key, path)
    return value


def _no_nul(text: str, where: str, key: str, path: str) -> str:
    """`text`, which goes into a command line: a NUL cannot (the server could not be started)."""
    if "\x00" in text:
        raise WeightsmithError(f"{where}: {key} contains a NUL character", file=path)
    return text


def _finite_json(value: Any, where: str, path: str, depth: int = 0) -> None:
    """`extra_body` goes into every request and into results.json: no NaN, no infinity, not too deep."""
    if depth > 32:
        raise WeightsmithError(f"{where}: extra_body is nested deeper than 32 levels", file=path)
    if isinstance(value, float) and not math.isfinite(value):
        raise WeightsmithError(f"{where}: extra_body holds {value!r}, which JSON cannot carry", file=path)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        raise WeightsmithError(f"{where}: extra_body holds an integer beyond 2**64", file=path)
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        _finite_json(child, where, path, depth + 1)


def _check_url(url: str, where: str, path: str) -> None:
    if not re.match(r"^https?://", url):
        raise WeightsmithError(f"{where}: url {_q(url)} must start with http:// or https://", file=path)
    probe = url.replace(PORT_PLACEHOLDER, "1")
    try:
        parts = urllib.parse.urlsplit(probe)
        _ = parts.port
    except ValueError:
        parts = None
    if parts is None or not parts.hostname or not probe.isascii() or not probe.isprintable() or " " in probe:
        raise WeightsmithError(f"{where}: url {_q(url)} is not an http(s)://host[:port][/path] address", file=path)


def _command(raw: Any, where: str, path: str) -> list[str]:
    """The arm's command as a list of strings, `$VAR` expanded; one line for anything else."""
    if isinstance(raw, str):
        try:
            raw = shlex.split(raw)
        except ValueError as exc:
            raise WeightsmithError(
                f"{where}: 'command' cannot be split like a shell would ({exc})", file=path
            ) from None
    if not raw or not all(isinstance(t, str) for t in raw):
        raise WeightsmithError(f"{where}: 'command' must be a non-empty list of strings", file=path)
    if any("\x00" in t for t in raw):
        raise WeightsmithError(f"{where}: 'command' contains a NUL character", file=path)
    command = [os.path.expandvars(t) for t in raw]
    unset = sorted({m.group(1) for t in command for m in _ENV_REF.finditer(t)})
    if unset:
        raise WeightsmithError(
            f"{where}: environment variable(s) used in 'command' are not set: {', '.join(unset)}",
            file=path,
        )
    return command


def _env(raw: dict[str, Any], where: str, path: str) -> dict[str, str]:
    env = {}
    for key, value in raw.items():
        if not ENV_NAME.fullmatch(key):  # `A;B` or `X=$(cmd)` would be command words in a printed line
            raise WeightsmithError(f"{where}: env name {_q(key)} is not a usable variable name", file=path)
        env[key] = str(_scalar(value, where, f"env {_q(key)}", path))
    return env


def _sweep(raw: dict[str, Any], where: str, path: str) -> SweepSpec:
    sraw = _check_table(raw, _SWEEP_KEYS, f"{where}: sweep", path)
    if "flag" not in sraw or not sraw.get("values"):
        raise WeightsmithError(f"{where}: sweep needs 'flag' and a non-empty 'values'", file=path)
    if len(sraw["values"]) > MAX_ARMS:
        raise WeightsmithError(f"{where}: sweep has more than {MAX_ARMS} values", file=path)
    values = tuple(_scalar(v, f"{where}: sweep", f"values[{i}]", path) for i, v in enumerate(sraw["values"]))
    flag, key = sraw["flag"], sraw.get("key")
    for what, text in (("flag", flag), ("key", key or "")):
        _no_nul(text, f"{where}: sweep", what, path)
    return SweepSpec(flag=flag, values=values, key=key)


def _parse_arm(raw: dict[str, Any], index: int, path: str) -> ArmSpec:
    where = f"arms[{index}]"
    raw = _check_table(raw, _ARM_KEYS, where, path)
    name = raw.get("name")
    if not name:
        raise WeightsmithError(f"{where}: every arm needs a 'name'", file=path)
    if not _NAME_RE.match(name) or len(name) > MAX_NAME_CHARS:
        raise WeightsmithError(
            f"{where}: name {_q(name)} may use letters, digits and _ . + - only, at most {MAX_NAME_CHARS}",
            file=path,
        )
    where = f"arm '{name}'"
    command = _command(raw["command"], where, path) if "command" in raw else None
    url = raw.get("url")
    if url is None and command is None:
        raise WeightsmithError(f"{where}: give 'url' (a running server) or 'command'", file=path)
    if command is not None and url is None and not any(PORT_PLACEHOLDER in t for t in command):
        raise WeightsmithError(
            f"{where}: give 'url' (where the command's server listens) or put {PORT_PLACEHOLDER} in the command",
            file=path,
        )
    if url is not None:
        _check_url(url, where, path)
    kind = raw.get("kind", kinds.AUTO)
    if kind not in KIND_NAMES:
        raise WeightsmithError(f"{where}: kind {_q(kind)} is not one of {', '.join(KIND_NAMES)}", file=path)
    extra_body = raw.get("extra_body", {})
    _finite_json(extra_body, where, path)
    sweep = None
    if "sweep" in raw:
        sweep = _sweep(raw["sweep"], where, path)
        if command is None:
            raise WeightsmithError(f"{where}: only an arm with a 'command' can be swept", file=path)
    return ArmSpec(
        name=name,
        url=url,
        command=command,
        env=_env(raw.get("env", {}), where, path),
        kind=kind,
        model=raw.get("model"),
        fresh_cache=raw.get("fresh_cache", True),
        startup_timeout_s=raw.get("startup_timeout_s", 600.0),
        extra_body=dict(extra_body),
        sweep=sweep,
    )


def _set_flag(command: list[str], flag: str, value: str) -> list[str]:
    """Return `command` with `flag`'s value replaced (both `--f v` and `--f=v`), or appended."""
    out = list(command)
    for i, token in enumerate(out):
        if token == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if token.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


def _flag_value(command: list[str], flag: str) -> str | None:
    for i, token in enumerate(command):
        if token == flag and i + 1 < len(command):
            return command[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def sweep_base(name: str) -> str:
    """The arm a sweep arm was expanded from (`name` itself for an arm without a sweep)."""
    return name.split("@", 1)[0]


def sweep_point(name: str) -> str:
    """A sweep arm's `param=value` ("" for an arm without a sweep)."""
    return name.split("@", 1)[1] if "@" in name else ""


def expand_sweep(arm: ArmSpec, path: str = "") -> list[ArmSpec]:
    """One arm per sweep value, named `name@param=value`; an arm without a sweep is returned as is.

    With a `key`, the flag's value is parsed as a JSON object and only that key is set, so the
    rest of e.g. `--speculative-config` (method, draft model) stays exactly as written.
    """
    sweep = arm.sweep
    if sweep is None or arm.command is None:
        return [arm]
    expanded = []
    for value in sweep.values:
        if sweep.key is None:
            command = _set_flag(arm.command, sweep.flag, str(value))
        else:
            current = _flag_value(arm.command, sweep.flag)
            try:
                obj = json.loads(current) if current is not None else {}
            except (ValueError, RecursionError) as exc:  # also nesting past the stack, a 5,000-digit integer
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply or a number too long"
                raise WeightsmithError(
                    f"arm '{arm.name}': the value of {sweep.flag} is not JSON ({why})", file=path
                ) from None
            if not isinstance(obj, dict):
                raise WeightsmithError(f"arm '{arm.name}': the value of {sweep.flag} is not a JSON object", file=path)
            obj[sweep.key] = value
            command = _set_flag(arm.command, sweep.flag, json.dumps(obj, separators=(",", ":")))
        expanded.append(
            replace(
                arm,
                name=f"{arm.name}@{sweep.param}={value}",
                command=command,
                sweep=None,
                sweep_param=sweep.param,
                sweep_value=value,
            )
        )
    return expanded


def _prompt_tokens(raw: Any, path: str) -> list[int]:
    if not raw or len(raw) > MAX_PROMPT_LENGTHS:
        raise WeightsmithError(f"workload: prompt_tokens must list 1 to {MAX_PROMPT_LENGTHS} lengths", file=path)
    lengths = [_number(n, _PROMPT_TOKENS, "workload", f"prompt_tokens[{i}]", path) for i, n in enumerate(raw)]
    return sorted(set(lengths))


def _quality(raw: dict[str, Any], path: str) -> QualitySpec:
    """The `[quality]` table; the suite itself is read when the run starts (`quality.scenarios`)."""
    quality = QualitySpec(**_check_table(raw, _QUALITY_KEYS, "quality", path))
    if not quality.suite.strip():
        raise WeightsmithError("quality: 'suite' must name a built-in suite or a JSONL file", file=path)
    if "\x00" in quality.suite:
        raise WeightsmithError("quality: 'suite' contains a NUL character", file=path)
    for i, category in enumerate(quality.categories):
        if not isinstance(category, str) or not category:
            raise WeightsmithError(f"quality: categories[{i}] must be a non-empty string", file=path)
    return quality


def parse_config(data: dict[str, Any], path: str = "<arms>") -> BenchConfig:
    """Validate a parsed TOML document and build the run's configuration (sweeps expanded)."""
    data = _check_table(data, _TOP_KEYS, "top level", path)
    wraw = _check_table(data.get("workload", {}), _WORKLOAD_KEYS, "workload", path)
    workload = WorkloadSpec(**wraw)
    workload.prompt_tokens = _prompt_tokens(wraw.get("prompt_tokens", workload.prompt_tokens), path)
    if workload.endpoint not in ENDPOINTS:
        raise WeightsmithError(
            f"workload: endpoint {_q(workload.endpoint)} is not one of {', '.join(ENDPOINTS)}",
            file=path,
        )
    determinism = DeterminismSpec(**_check_table(data.get("determinism", {}), _DETERMINISM_KEYS, "determinism", path))
    if determinism.replicates == 1:
        raise WeightsmithError("determinism: replicates must be 0 (off) or at least 2", file=path)

    quality = _quality(data["quality"], path) if "quality" in data else None

    raw_arms = data.get("arms", [])
    if not raw_arms:
        raise WeightsmithError("no [[arms]] given", file=path)
    arms: list[ArmSpec] = []
    for index, raw in enumerate(raw_arms):
        if not isinstance(raw, dict):
            raise WeightsmithError(f"arms[{index}] must be a table", file=path)
        arms.extend(expand_sweep(_parse_arm(raw, index, path), path))
        if len(arms) > MAX_ARMS:
            raise WeightsmithError(f"more than {MAX_ARMS} arms (sweeps included)", file=path)
    names = [a.name for a in arms]
    long = next((n for n in names if len(n) > 2 * MAX_NAME_CHARS), None)
    if long is not None:
        raise WeightsmithError(f"arm name {_q(long)} is longer than {2 * MAX_NAME_CHARS} characters", file=path)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise WeightsmithError(f"arm names must be unique: {', '.join(map(_q, dupes))}", file=path)
    config = BenchConfig(
        arms=arms,
        workload=workload,
        determinism=determinism,
        quality=quality,
        repeats=data.get("repeats", 2),
        warmups=data.get("warmups", 2),
        baseline=data.get("baseline"),
        acceptance_baseline=data.get("acceptance_baseline"),
        prefill_min_tokens=data.get("prefill_min_tokens", 2000),
        alpha=data.get("alpha", 0.05),
        source=path,
    )
    if config.baseline is not None and config.baseline not in names:
        raise WeightsmithError(
            f"baseline {_q(config.baseline)} is not an arm (arms: {', '.join(map(_q, names))})", file=path
        )
    bases = sorted({sweep_base(a.name) for a in arms} - set(names))
    if config.acceptance_baseline is not None and config.acceptance_baseline not in (*names, *bases):
        raise WeightsmithError(
            f"acceptance_baseline {_q(config.acceptance_baseline)} is not an arm "
            f"(arms: {', '.join(map(_q, [*bases, *names]))})",
            file=path,
        )
    return config


def load_config(path: str | Path) -> BenchConfig:
    """Read and validate an arms file."""
    p = Path(path)
    text = read_text_file(p, MAX_ARMS_FILE_BYTES, "arms file")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WeightsmithError(f"not valid TOML: {exc}", file=p) from None
    except RecursionError:
        raise WeightsmithError("not valid TOML: nested too deeply", file=p) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise WeightsmithError(f"not valid TOML: {str(exc).splitlines()[0][:80]}", file=p) from None
    return parse_config(data, str(p))
