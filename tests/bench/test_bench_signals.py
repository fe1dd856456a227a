"""SIGTERM ends `weightsmith bench run` as Ctrl-C does: the server stopped, what was measured written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from standin_vllm import standin_command

from clirun import sigint_default


def _pids_with(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (the stand-in's unique model name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def _wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the server's process in /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_mid_run_stops_the_server_and_writes_the_results(tmp_path: Path, signum: int) -> None:
    marker = f"standin-{uuid.uuid4().hex}"
    # slow enough (about 0.4 s per request, 24 requests a visit) that the signal lands mid-visit
    command = standin_command("--model", marker, "--step-ms", "40", "--ttft-ms", "20")
    arms = tmp_path / "arms.toml"
    arms.write_text(
        "repeats = 2\nwarmups = 0\n[workload]\nprompt_tokens = [40]\nprompts_per_length = 24\nmax_tokens = 10\n"
        f'[determinism]\nreplicates = 0\n[[arms]]\nname = "a"\ncommand = {json.dumps(command)}\n'
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightsmith.cli", "bench", "run", str(arms), "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        preexec_fn=sigint_default,
    )
    try:
        # stop the run once the stand-in has answered a measured request: mid-visit
        log = out / "logs" / "a.r1.log"
        answered = "POST /v1/completions"
        assert _wait_for(lambda: log.is_file() and answered in log.read_text(errors="replace"), 60), "no request"
        time.sleep(0.5)
        assert _pids_with(marker), "the stand-in is not running"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err
        assert "Traceback" not in err
        assert _wait_for(lambda: not _pids_with(marker), 10), "the stand-in server was left running"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _pids_with(marker):  # a failing run must not leave its server behind either
            os.kill(pid, signal.SIGKILL)
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True
    (visit,) = results["visits"]
    assert visit["status"] == "failed" and visit["failure"] == "interrupted"
    assert 0 < len(visit["requests"]) < 24
    assert "The run was interrupted" in (out / "report.md").read_text()
