"""`weightsmith bench` as a user runs it: exit codes, one-line errors, files written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from standin_vllm import standin_command


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weightsmith.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _arms_file(path: Path, arms: list[tuple[str, list[str]]]) -> Path:
    lines = [
        "repeats = 2",
        "warmups = 1",
        "[workload]",
        "prompt_tokens = [40]",
        "prompts_per_length = 3",
        "max_tokens = 8",
        "[determinism]",
        "replicates = 0",
    ]
    for name, command in arms:
        lines += ["[[arms]]", f'name = "{name}"', f"command = {json.dumps(command)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_report_and_refusal_to_overwrite(tmp_path: Path) -> None:
    arms = _arms_file(
        tmp_path / "arms.toml",
        [("a", standin_command("--accept-pattern", "2")), ("b", standin_command("--accept-pattern", "3"))],
    )
    out = tmp_path / "out"
    proc = _cli("run", str(arms), "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["failed_arms"] == [] and not summary["interrupted"]
    assert {v["metric"] for v in summary["verdicts"]} == {"decode_tok_s", "ttft_s", "e2e_s"}
    for name in ("results.json", "report.md", "ttft.png", "decode.png", "acceptance.png"):
        assert (out / name).is_file(), name

    again = _cli("run", str(arms), "--out", str(out))
    assert again.returncode == 2
    assert again.stderr.strip().count("\n") == 0 and "exists" in again.stderr

    rerendered = tmp_path / "rerendered"
    proc = _cli("report", str(out / "results.json"), "--out", str(rerendered))
    assert proc.returncode == 0, proc.stderr
    assert (rerendered / "report.md").read_text().startswith("# Serving benchmark: `a`, `b`")

    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    proc = _cli("report", str(bad))
    assert proc.returncode == 2 and "not a weightsmith bench results file" in proc.stderr


def test_failed_arm_exits_1_and_keeps_results(tmp_path: Path) -> None:
    arms = _arms_file(tmp_path / "arms.toml", [("ok", standin_command()), ("broken", standin_command("--fail-start"))])
    out = tmp_path / "out"
    proc = _cli("run", str(arms), "--out", str(out), "--quiet")
    assert proc.returncode == 1
    assert "arm 'broken' failed" in proc.stderr and "server did not start" in proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert [a["status"] for a in results["arms"]] == ["ok", "failed"]
    assert "Arm `broken` failed" in (out / "report.md").read_text()


def test_logcheck_command(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO ok\nWARNING Using KV cache scaling factor 1.0 for fp8_e4m3.\n")
    clean = tmp_path / "clean.log"
    clean.write_text("INFO nothing to see\n")
    proc = _cli("logcheck", str(log), str(clean))
    assert proc.returncode == 1
    assert "kv-cache-scale-1.0" in proc.stdout and "nothing matched" in proc.stdout
    assert _cli("logcheck", str(clean)).returncode == 0
    proc = _cli("logcheck", str(tmp_path / "missing.log"))
    assert proc.returncode == 2 and "no such log file" in proc.stderr
