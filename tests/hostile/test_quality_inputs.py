"""Hostile quality scenario files handed to `weightsmith bench run` through an arms file's [quality].

Each is refused before any server starts and before --out is made: one line naming the scenario
file, the line and the key, exit 2, nothing in the sandbox changed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from hostile.harness import Sandbox, run_inprocess
from weightsmith.bench.quality import scenarios

ARMS = '[quality]\nsuite = "{suite}"\n{extra}\n[[arms]]\nname = "a"\nurl = "http://127.0.0.1:9"\n'
GOOD = {"id": "s1", "category": "c", "prompt": "2+2=", "check": {"type": "exact", "value": "4"}}


def _line(**changes: Any) -> str:
    raw = {**GOOD, **changes}
    return json.dumps({k: v for k, v in raw.items() if v is not None})


def _refused(capsys: Any, monkeypatch: Any, sandbox: Sandbox, suite: str = "suite.jsonl", extra: str = "") -> str:
    arms = sandbox.root / "arms.toml"
    arms.write_text(ARMS.format(suite=suite, extra=extra))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "bench", "run", arms, "--out", sandbox.root / "out", "--quiet")
    line = result.error_line
    assert result.code == 2, result
    sandbox.assert_untouched()
    assert not (sandbox.root / "out").exists()
    return line


@pytest.mark.parametrize(
    ("lines", "says"),
    [
        ([_line(), '{"id": "s2", "category": '], "line 2: not valid JSON"),
        ([_line(), _line(id=None)], "line 2: missing key 'id'"),
        ([_line(), _line(check=None)], "line 2: missing key 'check'"),
        ([_line(), "", _line(category="d")], "line 3: id 's1' repeats line 1"),
        ([_line(check={"type": "bleu"})], 'line 1: check: type "bleu" is not one of'),
        ([_line(check={"type": "regex", "pattern": "(?P<x"})], "line 1: check: 'pattern' is not a valid regular"),
        ([_line(check={"type": "python_tests", "tests": 3})], "line 1: check: 'tests' must be a string"),
        ([_line(id="x" * 5000)], "line 1: 'id' must be printable and at most 200 characters"),
        (["[" * 200_000], "line 1: not valid JSON"),
        ([_line(), '{"id": ' + "1" * 5000 + "}"], "line 2: not valid JSON (Exceeds the limit (4300 digits)"),
        ([_line(prompt=None, messages=[{"role": "user", "content": "x", "n": float("nan")}])], "NaN is not a JSON"),
        ([_line(prompt=None, messages="hi")], "line 1: 'messages' must be a non-empty list"),
    ],
)
def test_bad_scenario_line(capsys: Any, monkeypatch: Any, sandbox: Sandbox, lines: list[str], says: str) -> None:
    (sandbox.root / "suite.jsonl").write_text("\n".join(lines) + "\n")
    line = _refused(capsys, monkeypatch, sandbox)
    assert line.startswith(f"error: {sandbox.root / 'suite.jsonl'}: "), line
    assert says in line, line


def test_huge_scenario_file(capsys: Any, monkeypatch: Any, sandbox: Sandbox) -> None:
    monkeypatch.setattr(scenarios, "MAX_SUITE_BYTES", 4096)
    (sandbox.root / "suite.jsonl").write_text((_line() + "\n") * 100)
    line = _refused(capsys, monkeypatch, sandbox)
    assert line == f"error: {sandbox.root / 'suite.jsonl'}: scenario file is larger than 4096 bytes"


def test_too_many_scenarios(capsys: Any, monkeypatch: Any, sandbox: Sandbox) -> None:
    monkeypatch.setattr(scenarios, "MAX_SCENARIOS", 3)
    (sandbox.root / "suite.jsonl").write_text("".join(_line(id=f"s{i}") + "\n" for i in range(5)))
    assert "line 4: more than 3 scenarios" in _refused(capsys, monkeypatch, sandbox)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: None, "cannot read scenario file: No such file or directory"),
        (lambda p: p.mkdir(), "cannot read scenario file"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.write_bytes(b'{"id": "\xff"}\n'), "not UTF-8 text (byte 8)"),
        (lambda p: p.write_text("\n\n"), "the suite holds no scenario"),
    ],
)
def test_unreadable_scenario_file(capsys: Any, monkeypatch: Any, sandbox: Sandbox, make: Any, says: str) -> None:
    make(sandbox.root / "suite.jsonl")
    line = _refused(capsys, monkeypatch, sandbox)
    assert str(sandbox.root / "suite.jsonl") in line and says in line, line


def test_unknown_builtin_and_category(capsys: Any, monkeypatch: Any, sandbox: Sandbox) -> None:
    line = _refused(capsys, monkeypatch, sandbox, suite="builtin:mmlu")
    assert line == (
        f"error: {sandbox.root / 'arms.toml'}: quality: suite 'builtin:mmlu' is not one of "
        "builtin:humaneval, builtin:tool-use"
    )
    line = _refused(capsys, monkeypatch, sandbox, suite="builtin:tool-use", extra='categories = ["poetry"]')
    assert "quality: categories poetry are not in suite 'builtin:tool-use'" in line


def test_bad_quality_table(capsys: Any, monkeypatch: Any, sandbox: Sandbox) -> None:
    line = _refused(capsys, monkeypatch, sandbox, suite="builtin:tool-use", extra="runs = 0")
    assert line == f"error: {sandbox.root / 'arms.toml'}: quality: runs must be > 0 and <= 100, got 0"


def test_python_tests_refused_without_sandbox(capsys: Any, monkeypatch: Any, sandbox: Sandbox) -> None:
    from weightsmith.bench.quality import sandbox as sb

    monkeypatch.setattr(sb, "unavailable", lambda: "unshare cannot create namespaces here")
    line = _refused(capsys, monkeypatch, sandbox, suite="builtin:humaneval")
    assert "without its sandbox (unshare cannot create namespaces here); pass --allow-unsandboxed" in line


def test_allow_unsandboxed_lets_the_run_go_on(capsys: Any, monkeypatch: Any, sandbox: Sandbox) -> None:
    from weightsmith.bench.quality import sandbox as sb

    monkeypatch.setattr(sb, "unavailable", lambda: "unshare cannot create namespaces here")
    arms = sandbox.root / "arms.toml"
    extra = "limit = 1\n[determinism]\nreplicates = 0\n"
    arms.write_text("repeats = 1\n" + ARMS.format(suite="builtin:humaneval", extra=extra))
    out = sandbox.root / "out"
    result = run_inprocess(capsys, monkeypatch, "bench", "run", arms, "--out", out, "--quiet", "--allow-unsandboxed")
    assert result.code == 1 and "--allow-unsandboxed" not in result.err  # it went ahead; its only arm is absent
    assert (out / "results.json").is_file()
