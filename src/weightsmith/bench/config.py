"""The arms file: what to compare, how to load it, and sweep expansion.

A benchmark is described in TOML so that the exact comparison can be kept beside its results and
run again. Every key is checked here, once: a typo in an arms file must stop the run before any
server starts, with one line that names the file and the key, not an hour later.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from weightsmith.errors import WeightsmithError

#: Placeholder in a command (and its url/env) replaced by a free loopback port at start time.
PORT_PLACEHOLDER = "{port}"

ENDPOINTS = ("completions", "chat")
KINDS = ("auto", "vllm", "llama.cpp", "other")


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
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    kind: str = "auto"
    model: str | None = None
    fresh_cache: bool = True
    startup_timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    sweep: SweepSpec | None = None
    sweep_param: str | None = None
    sweep_value: Any = None

    @property
    def resolved_kind(self) -> str:
        """`vllm`, `llama.cpp` or `other`: decides the cache isolation and is shown in reports."""
        if self.kind != "auto":
            return self.kind
        for token in (self.command or [])[:3]:
            base = Path(token).name.lower()
            if "vllm" in base:
                return "vllm"
            if "llama-server" in base:
                return "llama.cpp"
        return "other"


@dataclass
class WorkloadSpec:
    """The requests every arm receives: identical bodies, unique prefixes, greedy decoding."""

    prompt_tokens: list[int] = field(default_factory=lambda: [80, 600, 2048])
    prompts_per_length: int = 4
    max_tokens: int = 64
    concurrency: int = 1
    temperature: float = 0.0
    endpoint: str = "completions"
    ignore_eos: bool = True
    seed: int = 0
    chars_per_token: float | None = None
    request_timeout_s: float = 300.0


@dataclass
class DeterminismSpec:
    """The same request sent `replicates` times per arm, with top-k logprobs (0 turns it off)."""

    replicates: int = 5
    prompt_tokens: int = 600
    max_tokens: int = 32
    top_logprobs: int = 5


@dataclass
class BenchConfig:
    """Everything one benchmark run needs, after sweep expansion."""

    arms: list[ArmSpec]
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    determinism: DeterminismSpec = field(default_factory=DeterminismSpec)
    repeats: int = 2
    warmups: int = 2
    baseline: str | None = None
    prefill_min_tokens: int = 2000
    alpha: float = 0.05
    source: str | None = None

    @property
    def baseline_arm(self) -> str:
        """The arm every other arm is compared against (the first one unless named)."""
        return self.baseline or self.arms[0].name


_TOP_KEYS = {
    "repeats": int,
    "warmups": int,
    "baseline": str,
    "prefill_min_tokens": int,
    "alpha": float,
    "workload": dict,
    "determinism": dict,
    "arms": list,
}
_WORKLOAD_KEYS = {
    "prompt_tokens": list,
    "prompts_per_length": int,
    "max_tokens": int,
    "concurrency": int,
    "temperature": float,
    "endpoint": str,
    "ignore_eos": bool,
    "seed": int,
    "chars_per_token": float,
    "request_timeout_s": float,
}
_DETERMINISM_KEYS = {"replicates": int, "prompt_tokens": int, "max_tokens": int, "top_logprobs": int}
_ARM_KEYS = {
    "name": str,
    "url": str,
    "command": (str, list),
    "env": dict,
    "kind": str,
    "model": str,
    "fresh_cache": bool,
    "startup_timeout_s": float,
    "extra_body": dict,
    "sweep": dict,
}
_SWEEP_KEYS = {"flag": str, "key": str, "values": list}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_ENV_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def _check_table(table: dict[str, Any], allowed: dict[str, Any], where: str, path: str) -> None:
    for key, value in table.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise WeightsmithError(f"{where}: unknown key '{key}' (known: {known})", file=path)
        want = allowed[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if want is int and isinstance(value, bool):
            raise WeightsmithError(f"{where}: '{key}' must be an integer", file=path)
        if not isinstance(value, want):
            names = " or ".join(t.__name__ for t in want) if isinstance(want, tuple) else want.__name__
            raise WeightsmithError(f"{where}: '{key}' must be {names}", file=path)


def _positive(value: float, what: str, path: str, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise WeightsmithError(f"{what} must be {bound}, got {value}", file=path)


def _parse_arm(raw: dict[str, Any], index: int, path: str) -> ArmSpec:
    where = f"arms[{index}]"
    _check_table(raw, _ARM_KEYS, where, path)
    name = raw.get("name")
    if not name:
        raise WeightsmithError(f"{where}: every arm needs a 'name'", file=path)
    if not _NAME_RE.match(name):
        raise WeightsmithError(f"{where}: name '{name}' may use letters, digits and _ . + - only", file=path)
    where = f"arm '{name}'"
    command = raw.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if command is not None:
        if not command or not all(isinstance(t, str) for t in command):
            raise WeightsmithError(f"{where}: 'command' must be a non-empty list of strings", file=path)
        command = [os.path.expandvars(t) for t in command]
        unset = sorted({m.group(1) for t in command for m in _ENV_REF.finditer(t)})
        if unset:
            raise WeightsmithError(
                f"{where}: environment variable(s) used in 'command' are not set: {', '.join(unset)}",
                file=path,
            )
    url = raw.get("url")
    if url is None and command is None:
        raise WeightsmithError(f"{where}: give 'url' (a running server) or 'command'", file=path)
    if command is not None and url is None and not any(PORT_PLACEHOLDER in t for t in command):
        raise WeightsmithError(
            f"{where}: give 'url' (where the command's server listens) or put {PORT_PLACEHOLDER} in the command",
            file=path,
        )
    if url is not None and not re.match(r"^https?://", url):
        raise WeightsmithError(f"{where}: url '{url}' must start with http:// or https://", file=path)
    env = raw.get("env", {})
    for key, value in env.items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise WeightsmithError(f"{where}: env '{key}' must be a string or number", file=path)
    kind = raw.get("kind", "auto")
    if kind not in KINDS:
        raise WeightsmithError(f"{where}: kind '{kind}' is not one of {', '.join(KINDS)}", file=path)
    timeout = float(raw.get("startup_timeout_s", 600.0))
    _positive(timeout, f"{where}: startup_timeout_s", path)
    sweep = None
    if "sweep" in raw:
        sraw = raw["sweep"]
        _check_table(sraw, _SWEEP_KEYS, f"{where}: sweep", path)
        if "flag" not in sraw or not sraw.get("values"):
            raise WeightsmithError(f"{where}: sweep needs 'flag' and a non-empty 'values'", file=path)
        if command is None:
            raise WeightsmithError(f"{where}: only an arm with a 'command' can be swept", file=path)
        sweep = SweepSpec(flag=sraw["flag"], values=tuple(sraw["values"]), key=sraw.get("key"))
    return ArmSpec(
        name=name,
        url=url,
        command=command,
        env={k: str(v) for k, v in env.items()},
        kind=kind,
        model=raw.get("model"),
        fresh_cache=raw.get("fresh_cache", True),
        startup_timeout_s=timeout,
        extra_body=dict(raw.get("extra_body", {})),
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
            except json.JSONDecodeError as exc:
                raise WeightsmithError(
                    f"arm '{arm.name}': the value of {sweep.flag} is not JSON ({exc.msg})", file=path
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


def parse_config(data: dict[str, Any], path: str = "<arms>") -> BenchConfig:
    """Validate a parsed TOML document and build the run's configuration (sweeps expanded)."""
    _check_table(data, _TOP_KEYS, "top level", path)
    wraw = data.get("workload", {})
    _check_table(wraw, _WORKLOAD_KEYS, "workload", path)
    workload = WorkloadSpec(**{k: v for k, v in wraw.items()})
    if not workload.prompt_tokens or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in workload.prompt_tokens
    ):
        raise WeightsmithError("workload: prompt_tokens must be positive integers", file=path)
    workload.prompt_tokens = sorted(set(workload.prompt_tokens))
    for key in ("prompts_per_length", "max_tokens", "concurrency"):
        _positive(getattr(workload, key), f"workload: {key}", path)
    _positive(workload.request_timeout_s, "workload: request_timeout_s", path)
    _positive(workload.temperature, "workload: temperature", path, allow_zero=True)
    if workload.chars_per_token is not None:
        workload.chars_per_token = float(workload.chars_per_token)
        _positive(workload.chars_per_token, "workload: chars_per_token", path)
    if workload.endpoint not in ENDPOINTS:
        raise WeightsmithError(
            f"workload: endpoint '{workload.endpoint}' is not one of {', '.join(ENDPOINTS)}",
            file=path,
        )
    draw = data.get("determinism", {})
    _check_table(draw, _DETERMINISM_KEYS, "determinism", path)
    determinism = DeterminismSpec(**draw)
    _positive(determinism.replicates, "determinism: replicates", path, allow_zero=True)
    if determinism.replicates == 1:
        raise WeightsmithError("determinism: replicates must be 0 (off) or at least 2", file=path)
    for key in ("prompt_tokens", "max_tokens"):
        _positive(getattr(determinism, key), f"determinism: {key}", path)
    _positive(determinism.top_logprobs, "determinism: top_logprobs", path, allow_zero=True)

    raw_arms = data.get("arms", [])
    if not raw_arms:
        raise WeightsmithError("no [[arms]] given", file=path)
    arms: list[ArmSpec] = []
    for index, raw in enumerate(raw_arms):
        if not isinstance(raw, dict):
            raise WeightsmithError(f"arms[{index}] must be a table", file=path)
        arms.extend(expand_sweep(_parse_arm(raw, index, path), path))
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise WeightsmithError(f"arm names must be unique: {', '.join(dupes)}", file=path)
    config = BenchConfig(
        arms=arms,
        workload=workload,
        determinism=determinism,
        repeats=data.get("repeats", 2),
        warmups=data.get("warmups", 2),
        baseline=data.get("baseline"),
        prefill_min_tokens=data.get("prefill_min_tokens", 2000),
        alpha=float(data.get("alpha", 0.05)),
        source=path,
    )
    _positive(config.repeats, "repeats", path)
    _positive(config.warmups, "warmups", path, allow_zero=True)
    if not 0 < config.alpha < 0.5:
        raise WeightsmithError(f"alpha must be between 0 and 0.5, got {config.alpha}", file=path)
    if config.baseline is not None and config.baseline not in names:
        raise WeightsmithError(f"baseline '{config.baseline}' is not an arm (arms: {', '.join(names)})", file=path)
    return config


def load_config(path: str | Path) -> BenchConfig:
    """Read and validate an arms file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise WeightsmithError(f"cannot read arms file: {exc.strerror}", file=p) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WeightsmithError(f"not valid TOML: {exc}", file=p) from None
    return parse_config(data, str(p))
