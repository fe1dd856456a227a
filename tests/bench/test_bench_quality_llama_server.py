"""Quality end to end against a real llama-server serving SmolLM2-135M on the CPU: both built-in
suites, two arms of identical bytes, two runs each. Whatever the 135M model scores is what is kept;
the test asserts that every scenario was asked, answered and judged, not how well it did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightsmith.bench.config import parse_config
from weightsmith.bench.quality import sandbox
from weightsmith.bench.report import write_all
from weightsmith.bench.results import VISIT_OK, load_results
from weightsmith.bench.runner import run_bench


def _config(binary: Path, gguf: Path, suite: str, limit: int, max_tokens: int) -> dict[str, object]:
    command = [
        str(binary),
        "-m", str(gguf),
        "--jinja",  # tool calls need the chat template engine
        "--metrics",
        "--host", "127.0.0.1",
        "--port", "{port}",
        "-c", "4096",
        "-np", "1",
        "-t", "1",  # one thread: no spin-waiting threads fighting over a shared 2-core machine
    ]  # fmt: skip
    return {
        "repeats": 1,
        "warmups": 1,
        "workload": {"prompt_tokens": [32], "prompts_per_length": 2, "max_tokens": 8},
        "determinism": {"replicates": 0},
        "quality": {"suite": suite, "runs": 2, "limit": limit, "max_tokens": max_tokens},
        "arms": [
            {"name": "smollm2-a", "command": command, "startup_timeout_s": 120},
            {"name": "smollm2-b", "command": command, "startup_timeout_s": 120},
        ],
    }


@pytest.mark.e2e  # builds llama.cpp's llama-server (6 to 23 minutes on two cores)
@pytest.mark.skipif(sandbox.unavailable() is not None, reason="HumanEval's tests need the sandbox")
@pytest.mark.parametrize(
    ("suite", "limit", "max_tokens", "per_run"),
    [("builtin:humaneval", 4, 160, 4), ("builtin:tool-use", 3, 96, 12)],
)
def test_builtin_suites_on_llama_server(
    tmp_path: Path,
    llama_server_binary: Path,
    smollm2_gguf: Path,
    suite: str,
    limit: int,
    max_tokens: int,
    per_run: int,
) -> None:
    config = parse_config(_config(llama_server_binary, smollm2_gguf, suite, limit, max_tokens), "quality.toml")
    results = run_bench(config, tmp_path)

    assert [v.status for v in results.visits] == [VISIT_OK] * 2, [v.failure for v in results.visits]
    assert [(q.arm, q.run, q.suite) for q in results.quality] == [
        ("smollm2-a", 0, suite),
        ("smollm2-a", 1, suite),
        ("smollm2-b", 0, suite),
        ("smollm2-b", 1, suite),
    ]
    for q in results.quality:
        assert len(q.outcomes) == per_run
        # every scenario got an answer from the server and a verdict from its check
        assert all(o.error is None for o in q.outcomes), [o.error for o in q.outcomes]
        assert all(o.passed or o.detail for o in q.outcomes)
        assert all(o.completion_tokens is not None for o in q.outcomes)
    scores = {f"{q.arm} run {q.run}": sum(o.passed for o in q.outcomes) for q in results.quality}
    print(f"\n{suite}: passed per run of {per_run}: {json.dumps(scores)}")
    for q in results.quality:
        for o in q.outcomes:
            print(f"  {q.arm} r{q.run} {o.scenario:40} {'pass' if o.passed else 'FAIL'} {o.detail[:90]}")

    analysis, files = write_all(results, tmp_path / "report")
    again = load_results(files["results"])
    assert again.quality == results.quality
    # the report's Quality section and its plot are written from these runs
    assert analysis.quality is not None and [a.arm for a in analysis.quality.arms] == ["smollm2-a", "smollm2-b"]
    report = files["report"].read_text()
    section = report.split("## Quality", 1)[1]
    assert f"`{suite}`" in section and "2 run(s) per arm" in section and "smollm2-b" in section
    assert files["quality"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(section.split("\n## ", 1)[0][:3000])
