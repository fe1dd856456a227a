"""Paths in a results file: what a reader can run, never this machine's layout.

`bench` keeps the exact command of every arm, but a results file (and the model card written from
it) gets published, and an absolute path names a home folder, a user or a temporary virtualenv. So
a recorded command says `$MODEL` and `$DRAFT` for the model and the draft it served (their file
names kept beside it in the arm's `files`), a path under a declared root is written relative to it
(`$MODEL/...` inside the model folder, `$ARMS_DIR/...` inside the arms file's folder, and relative
to the output folder, where results.json lives, for the server logs), and any other absolute path
as its file name. The same rules rewrite free text the run kept (log lines, failure messages).

`make_portable` is the one place this happens: the runner applies it to every record it saves and
returns, and it can be applied to an older results file (a portable record comes back as it was).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith.bench.results import SCHEMA_VERSION, ArmInfo, BenchResults

MODEL, DRAFT, ARMS_DIR = "MODEL", "DRAFT", "ARMS_DIR"
#: The variables a recorded command may use, which a reader sets before pasting it.
PLACEHOLDERS = (MODEL, DRAFT, ARMS_DIR)
#: Flags whose value is the served model or the draft, in llama.cpp's and vLLM's spellings.
ROLE_FLAGS = {"-m": MODEL, "--model": MODEL, "-md": DRAFT, "--model-draft": DRAFT}
SPEC_CONFIG_FLAG = "--speculative-config"

_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_STOP = r"\s`'\"<>|,;()\[\]{}"
#: A local absolute path inside free text: a Unix path of at least two parts, a home-relative or a
#: Windows path, or a word holding a Python environment's package folder. A URL's `//` (after a `:`)
#: and a ratio such as `tok/s` (after a letter) are not paths. Each match may only start where a word
#: or a path starts (the lookbehinds), so a line of any length is scanned in linear time.
LOCAL_PATH = re.compile(
    rf"(?<![\w:/.\\-])(?:~/|/(?=[^{_STOP}/]+/)|[A-Za-z]:\\)[^{_STOP}]+"
    rf"|(?<![^{_STOP}])[^{_STOP}]*?[/\\](?:site|dist)-packages[/\\][^{_STOP}]*"
)


def is_local_absolute(text: str) -> bool:
    """True for `/x`, `~/x`, `C:\\x`, `\\\\host\\x`: a path that only means something on one machine."""
    return text.startswith(("/", "~/", "\\\\")) or bool(_WINDOWS_DRIVE.match(text))


def file_name(path: str) -> str:
    """The last part of `path`, whichever separator it uses."""
    return re.split(r"[/\\]", path.rstrip("/\\"))[-1] or path


def local_paths(text: str) -> list[str]:
    """Every local absolute path in `text` (for a card's check: a published file must hold none)."""
    return [m.group(0) for m in LOCAL_PATH.finditer(text)]


def served_model(arm: ArmInfo) -> str | None:
    """The model an arm served, as a reader can name it: a file name, a Hub id, never a local path."""
    model = arm.model
    if model is None:
        return None
    if model.startswith("$"):
        role, _, rest = model[1:].partition("/")
        name = arm.files.get(role, model)
        return f"{name}/{rest}" if rest else name
    return file_name(model) if is_local_absolute(model) else model


@dataclass
class PathMap:
    """Absolute roots and what a results file writes for them ("" for: relative to this root)."""

    roots: list[tuple[str, str]] = field(default_factory=list)

    def add(self, root: str | Path | None, shown: str) -> None:
        if root is not None and str(root) and is_local_absolute(str(root)):
            self.roots.append((str(root).rstrip("/\\") or "/", shown))

    def path(self, p: str) -> str:
        """`p` as the results file records it: under a root, relative to it; else its file name (a
        relative path inside a package folder too)."""
        if not is_local_absolute(p):
            return file_name(p) if re.search(r"[/\\](?:site|dist)-packages[/\\]", p) else p
        for root, shown in sorted(self.roots, key=lambda r: -len(r[0])):
            if p.rstrip("/\\") == root:
                return shown or "."
            for sep in ("/", "\\"):
                if p.startswith(root + sep):
                    rest = p[len(root) + 1 :]
                    return f"{shown}/{rest}" if shown else rest
        return file_name(p)

    def value(self, s: str) -> str:
        """A value that may be one path (an environment variable's), or text holding some."""
        return self.path(s) if is_local_absolute(s) and not re.search(r"\s", s) else self.text(s)

    def text(self, s: str) -> str:
        """Free text with every known root and every other local path rewritten as `path` does."""
        for root, shown in sorted(self.roots, key=lambda r: -len(r[0])):
            s = re.sub(re.escape(root) + r"(?=$|[/\\" + _STOP + "])", shown or ".", s)
        return LOCAL_PATH.sub(lambda m: self.path(m.group(0)), s)


def _roles(command: list[str]) -> dict[str, str]:
    """MODEL and DRAFT paths named in `command` (flags, `vllm serve PATH`, the speculative config)."""
    found: dict[str, str] = {}
    for i, token in enumerate(command):
        flag, eq, inline = token.partition("=")
        value = inline if eq else (command[i + 1] if i + 1 < len(command) else None)
        if value is None:
            continue
        if flag in ROLE_FLAGS:
            found.setdefault(ROLE_FLAGS[flag], value)
        elif flag == SPEC_CONFIG_FLAG:
            spec = _json_object(value)
            if spec is not None and isinstance(spec.get("model"), str):
                found.setdefault(DRAFT, spec["model"])
    if len(command) > 2 and file_name(command[0]) == "vllm" and command[1] == "serve" and command[2][:1] != "-":
        found.setdefault(MODEL, command[2])
    return {role: path for role, path in found.items() if is_local_absolute(path)}


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, nested past the stack, or a 5,000-digit integer
        return None
    return value if isinstance(value, dict) else None


def _command(command: list[str], pm: PathMap, roles: dict[str, str]) -> list[str]:
    out = []
    for i, token in enumerate(command):
        flag, eq, inline = token.partition("=")
        previous = command[i - 1] if i else ""
        if flag in ROLE_FLAGS and eq and inline == roles.get(ROLE_FLAGS[flag]):
            out.append(f"{flag}=${ROLE_FLAGS[flag]}")
        elif previous in ROLE_FLAGS and token == roles.get(ROLE_FLAGS[previous]):
            out.append("$" + ROLE_FLAGS[previous])
        elif i == 2 and command[1:2] == ["serve"] and token == roles.get(MODEL):
            out.append("$" + MODEL)
        elif previous == SPEC_CONFIG_FLAG or (flag == SPEC_CONFIG_FLAG and eq):
            out.append(_spec_config(token, pm, roles))
        elif eq and is_local_absolute(inline):
            out.append(f"{flag}={pm.path(inline)}")
        else:
            out.append(pm.path(token))
    return out


def _spec_config(token: str, pm: PathMap, roles: dict[str, str]) -> str:
    prefix, eq, body = token.partition("=") if token.startswith(SPEC_CONFIG_FLAG + "=") else ("", "", token)
    spec = _json_object(body)
    model = spec.get("model") if spec is not None else None
    if spec is None or not isinstance(model, str) or not is_local_absolute(model):
        return token
    spec["model"] = "$" + DRAFT if model == roles.get(DRAFT) else pm.path(model)
    return prefix + eq + json.dumps(spec, separators=(",", ":"))


def arm_map(command: list[str] | None, arms_dir: Path | None, out_dir: Path | None) -> tuple[PathMap, dict[str, str]]:
    """The roots of one arm, and its MODEL/DRAFT paths (absolute, as the command named them)."""
    roles = _roles(command or [])
    pm = PathMap()
    for role, path in roles.items():
        pm.add(path, "$" + role)
    pm.add(arms_dir, "$" + ARMS_DIR)
    pm.add(out_dir, "")
    return pm, roles


def _arm(arm: ArmInfo, arms_dir: Path | None, out_dir: Path | None) -> PathMap:
    pm, roles = arm_map(arm.command, arms_dir, out_dir)
    if arm.command:
        arm.command = _command(arm.command, pm, roles)
    for role, path in roles.items():
        arm.files[role] = file_name(path)
    arm.env = {k: pm.value(v) for k, v in arm.env.items()}
    if arm.model is not None:
        arm.model = pm.path(arm.model)
    if arm.failure is not None:
        arm.failure = pm.text(arm.failure)
    arm.log_paths = [pm.path(p) for p in arm.log_paths]
    for ev in arm.evidence:
        ev.first_line = pm.text(ev.first_line)
        ev.value = None if ev.value is None else pm.text(ev.value)
    return pm


def _config(config: dict[str, Any], arms_dir: Path | None, out_dir: Path | None) -> None:
    """The arms as the run parsed them (`config.arms`), with the same rewriting as the arms' record."""
    source = config.get("source")
    if isinstance(source, str) and is_local_absolute(source):
        config["source"] = file_name(source)
    for raw in config.get("arms") or []:
        if not isinstance(raw, dict):
            continue
        command = raw.get("command")
        if isinstance(command, list) and all(isinstance(t, str) for t in command):
            pm, roles = arm_map(command, arms_dir, out_dir)
            raw["command"] = _command(command, pm, roles)
            if isinstance(raw.get("model"), str):
                raw["model"] = pm.path(raw["model"])
            if isinstance(raw.get("env"), dict):
                raw["env"] = {k: pm.value(v) if isinstance(v, str) else v for k, v in raw["env"].items()}


def make_portable(results: BenchResults, arms_dir: Path | None, out_dir: Path | None) -> BenchResults:
    """A copy of `results` with every path rewritten by the rules in the module's docstring."""
    results = copy.deepcopy(results)
    maps = {arm.name: _arm(arm, arms_dir, out_dir) for arm in results.arms}
    for visit in results.visits:
        pm = maps.get(visit.arm, PathMap())
        if visit.log_path is not None:
            visit.log_path = pm.path(visit.log_path)
        if visit.failure is not None:
            visit.failure = pm.text(visit.failure)
        if visit.log_tail is not None:
            visit.log_tail = pm.text(visit.log_tail)
    for run in results.determinism:
        pm = maps.get(run.arm, PathMap())
        for rep in run.replicates:
            if rep.error is not None:
                rep.error = pm.text(rep.error)
    suites = PathMap()
    suites.add(arms_dir, "$" + ARMS_DIR)
    quality = results.config.get("quality")
    if isinstance(quality, dict) and isinstance(quality.get("suite"), str):
        quality["suite"] = suites.path(quality["suite"])
    for qrun in results.quality:
        qrun.suite = suites.path(qrun.suite)
        pm = maps.get(qrun.arm, PathMap())
        for outcome in qrun.outcomes:
            outcome.detail = pm.text(outcome.detail)
            outcome.error = None if outcome.error is None else pm.text(outcome.error)
    _config(results.config, arms_dir, out_dir)
    results.schema_version = SCHEMA_VERSION
    return results
