"""End to end against a real llama-server (built from source here) serving SmolLM2-135M on the CPU,
with /metrics and speculative decoding on: two arms of a sweep over the draft length."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from weightsmith.bench import metrics as m
from weightsmith.bench.config import parse_config
from weightsmith.bench.report import write_all
from weightsmith.bench.results import VISIT_OK
from weightsmith.bench.runner import run_bench


@pytest.mark.e2e  # builds llama.cpp's llama-server (6 to 23 minutes on two cores)
def test_llama_server_self_draft_sweep(tmp_path: Path, llama_server_binary: Path, smollm2_gguf: Path) -> None:
    gguf = str(smollm2_gguf)
    command = [
        str(llama_server_binary),
        "-m", gguf,
        "-md", gguf,
        "--spec-type", "draft-simple",
        "--spec-draft-n-max", "3",
        "--metrics",
        "--host", "127.0.0.1",
        "--port", "{port}",
        "-c", "2048",
        "-np", "1",
        "-t", "1",  # one thread: no spin-waiting threads fighting over a shared 2-core machine
    ]  # fmt: skip
    config = parse_config(
        {
            "repeats": 2,
            "warmups": 1,
            "workload": {"prompt_tokens": [32, 128], "prompts_per_length": 2, "max_tokens": 16},
            "determinism": {"replicates": 2, "prompt_tokens": 64, "max_tokens": 8, "top_logprobs": 3},
            "arms": [
                {
                    "name": "self-draft",
                    "command": command,
                    "startup_timeout_s": 120,
                    "sweep": {"flag": "--spec-draft-n-max", "values": [2, 4]},
                }
            ],
        },
        "llama-server.toml",
    )
    assert [a.name for a in config.arms] == ["self-draft@spec-draft-n-max=2", "self-draft@spec-draft-n-max=4"]
    results = run_bench(config, tmp_path)

    assert [v.status for v in results.visits] == [VISIT_OK] * 4, [v.failure for v in results.visits]
    assert results.arms[0].kind == "llama.cpp"
    assert "/tokenize" in results.chars_per_token_source
    for v in results.visits:
        assert len(v.requests) == 4 and all(r.ok for r in v.requests), [r.error for r in v.requests]
        assert all(r.completion_tokens == 16 for r in v.requests)
        assert all(r.prompt_tokens and r.prompt_tokens > 16 for r in v.requests)
        # the acceptance counters moved in every measured window
        assert v.spec is not None and v.spec.status == m.OK and v.spec.flavour == "llamacpp", v.spec
        assert v.spec.drafts and v.spec.drafts > 0 and v.spec.accepted is not None and v.spec.accepted > 0
        assert v.spec.mean_acceptance_length is not None and v.spec.mean_acceptance_length > 1
        rates = v.spec.per_position_rate
        k = 2 if v.arm.endswith("=2") else 4
        assert len(rates) == k and all(a >= b for a, b in pairwise(rates))

    analysis, files = write_all(results, tmp_path / "report")
    acc = {a.arm: a for a in analysis.acceptance}
    assert all(a.status == m.OK for a in acc.values())
    assert acc["self-draft@spec-draft-n-max=4"].mean_acceptance_length <= 5
    for name in ("ttft", "decode", "acceptance", "sweep-self-draft"):
        assert files[name].is_file() and files[name].stat().st_size > 5000, name
    assert analysis.sweeps and analysis.sweeps[0].best_value in (2, 4)
    # llama-server's own acceptance lines were found in its log
    evidence = {e.pattern: e for e in results.arms[0].evidence}
    assert evidence["llamacpp-draft-acceptance"].count >= 4
    # under speculative decoding llama-server streams logprobs for only some tokens: the study
    # notices and compares the replicates as text instead of by misaligned positions
    assert len(analysis.determinism) == 2
    for d in analysis.determinism:
        assert d.replicates == 2 and not d.logprobs and "of 8 tokens" in d.note, d
    report = files["report"].read_text()
    assert "llamacpp" in report and "## Sweeps" in report
