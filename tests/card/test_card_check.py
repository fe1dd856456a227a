"""`weightsmith card`: sections only from measured inputs, every number cited, and `--check` catching drift."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from clirun import run
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.bench.metrics import OK, SpecWindow
from weightsmith.bench.results import (
    ArmInfo,
    BenchResults,
    PromptInfo,
    QualityRun,
    RequestRecord,
    ScenarioOutcome,
    VisitResult,
    to_jsonable,
)
from weightsmith.card.cite import find_cited


def bench_results() -> BenchResults:
    """Two arms, two repeats, two prompts: enough samples for intervals, acceptance and a verdict."""
    arms = [
        ArmInfo("plain", "llama.cpp", command=["llama-server", "-m", "m.gguf", "--port", "{port}"], model="m.gguf"),
        ArmInfo("draft", "llama.cpp", command=["llama-server", "-m", "m.gguf", "-md", "m.gguf"], model="m.gguf"),
    ]
    prompts = [PromptInfo(f"p{i}", 32, i, "stdlib", 120) for i in range(4)]
    visits = []
    for repeat in range(2):
        for pos, arm in enumerate(arms):
            speed = 100.0 if arm.name == "plain" else 130.0
            requests = [
                RequestRecord(p.key, 32, p.index, ttft_s=0.02 + 0.001 * p.index, decode_tok_s=speed + p.index + repeat,
                              e2e_s=0.3, prompt_tokens=33, completion_tokens=16, token_chunks=16)
                for p in prompts
            ]  # fmt: skip
            spec = None
            if arm.name == "draft":
                spec = SpecWindow(OK, flavour="llama.cpp", drafts=10, draft_tokens=30, accepted=21,
                                  accepted_per_pos=[9, 7, 5], acceptance_rate=0.7)  # fmt: skip
            visits.append(VisitResult(arm.name, repeat, 2 * repeat + pos, requests=requests, spec=spec))
    return BenchResults(
        created="2026-01-01T00:00:00Z", weightsmith_version="0.1.0", host={"cpu": "test"},
        config={"repeats": 2, "warmups": 1}, baseline="plain", prefill_min_tokens=256, alpha=0.05,
        chars_per_token=3.5, chars_per_token_source="fixed", prompts=prompts, order=[[0, 1], [1, 0]],
        arms=arms, visits=visits,
    )  # fmt: skip


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("card")
    src = write_checkpoint(root / "src", llama_tensors())
    out = root / "w4a16"
    quantize(QuantizeRequest(src, out, scheme="w4a16", group_size=64, workers=1, pre_pass=None))
    return out


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    eval_doc = {
        "schema": "weightsmith.eval", "schema_version": 1, "orig": "src", "quant": "w4a16",
        "weights": {
            "source_format": "dense", "layers": [], "unsupported": [], "kept": [], "bytes_read": 0, "seconds": 0.1,
            "categories": [{"name": "attention", "layers": 8, "numel": 655360, "sq_error": 1.0, "sq_norm": 90.0,
                            "rel_mse": 0.0111, "sqnr_db": 19.546}],
            "overall": {"name": "overall", "layers": 14, "numel": 1441792, "sq_error": 2.0, "sq_norm": 170.0,
                        "rel_mse": 0.01176, "sqnr_db": 19.295},
        },
        "logits": {"status": "ok", "reason": None, "text_source": "json/decoder.py", "tokens": 128, "kl": 0.0123,
                   "top1_agreement": 0.953, "ppl_orig": 7.25, "ppl_quant": 7.5, "seconds": 1.0},
        "weightsmith_version": "0.1.0",
    }  # fmt: skip
    eval_path, bench_path = tmp_path / "in-eval.json", tmp_path / "in-bench.json"
    eval_path.write_text(json.dumps(eval_doc))
    bench_path.write_text(json.dumps(to_jsonable(bench_results())))
    return eval_path, bench_path


def card_folder(quantized: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ckpt"
    shutil.copytree(quantized, out)
    return out


def test_full_card_has_every_section_and_cites_sources(
    quantized: Path, inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    out = card_folder(quantized, tmp_path)
    eval_path, bench_path = inputs
    code, _, err = run(capsys, monkeypatch, "card", out, "--eval", eval_path, "--bench", bench_path,
                            "--base", "org/tiny-llama", "--license", "apache-2.0")  # fmt: skip
    assert code == 0, err
    card = (out / "README.md").read_text()
    for heading in ("How it was made", "Where the bytes are", "Verified", "Fidelity", "Serving",
                    "Provenance and credit"):  # fmt: skip
        assert f"## {heading}" in card
    sources = {c.source: c.value for c in find_cited(card)}
    manifest = json.loads((out / "weightsmith.json").read_text())
    assert sources["weightsmith.json: recipe.group_size"] == "64"
    assert sources["weightsmith.json: sizes.bytes_after"] == f"{manifest['sizes']['bytes_after'] / 1e6:,.2f}"
    assert sources["eval.json: weights.overall.sqnr_db"] == "19.30"
    assert sources["eval.json: logits.top1_agreement"] == "95.3"
    assert sources["bench.json: analysis.acceptance[draft].acceptance_rate"] == "0.700"
    assert sources["bench.json: arms[draft].command"] == "`llama-server -m m.gguf -md m.gguf`"
    assert "bench.json: analysis.cells[draft,32].decode_median_ci[0]" in sources
    assert "bench.json: analysis.noise[decode_tok_s]" in sources
    assert sources["verify.json: errors"] == "0"
    assert sources["inspect.json: rows[attention].bits_per_param"] == "4.000"
    # every input the card cites is in the folder, so the card can be checked from the folder alone
    assert {c.split(":")[0] for c in sources} <= {p.name for p in out.iterdir()}
    assert "lm_head" in card and "ParallelLMHead" in card  # what was kept, and why


def test_absent_inputs_leave_sections_out(
    quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = card_folder(quantized, tmp_path)
    code, _, err = run(capsys, monkeypatch, "card", out)
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert "## Fidelity" not in card and "## Serving" not in card
    assert "eval.json" not in card and "bench.json" not in card
    assert not re.search(r"TODO|TBD|N/A|\?\?|lorem|placeholder", card, re.IGNORECASE)
    assert "base_model" not in card and "license:" not in card


def test_front_matter_parses_as_key_values(
    quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = card_folder(quantized, tmp_path)
    run(capsys, monkeypatch, "card", out, "--base", "org/tiny-llama", "--license", "mit")
    lines = (out / "README.md").read_text().splitlines()
    assert lines[0] == "---"
    end = lines.index("---", 1)
    meta: dict[str, str | list[str]] = {}
    key = ""
    for line in lines[1:end]:
        if line.startswith("- "):
            items = meta[key]
            assert isinstance(items, list)
            items.append(line[2:])
        elif line.endswith(":"):
            key = line[:-1]
            meta[key] = []
        else:
            key, sep, value = line.partition(": ")
            assert sep and key and value and key not in meta, line
            meta[key] = value
    assert meta["base_model"] == "org/tiny-llama"
    assert meta["license"] == "mit"
    assert meta["pipeline_tag"] == "text-generation"
    assert meta["tags"] == ["weightsmith", "compressed-tensors", "w4a16", "4-bit"]


def test_check_passes_then_names_an_edited_figure(
    quantized: Path, inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    out = card_folder(quantized, tmp_path)
    eval_path, bench_path = inputs
    run(capsys, monkeypatch, "card", out, "--eval", eval_path, "--bench", bench_path)
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout
    assert "re-derived by running inspect and verify" in stdout

    card_path = out / "README.md"
    card = card_path.read_text()
    anchor = "<!-- eval.json: logits.kl -->"
    assert "0.0123" + anchor in card
    card_path.write_text(card.replace("0.0123" + anchor, "0.0099" + anchor))
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 1
    bad = [ln for ln in stdout.splitlines() if "does not match" in ln]
    assert len(bad) == 1
    assert "0.0099" in bad[0] and "eval.json: logits.kl" in bad[0] and "gives 0.0123" in bad[0]


def test_check_without_safetensors_reads_kept_results_and_sees_source_drift(
    quantized: Path, inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    out = card_folder(quantized, tmp_path)
    eval_path, bench_path = inputs
    run(capsys, monkeypatch, "card", out, "--eval", eval_path, "--bench", bench_path)
    for shard in out.glob("*.safetensors"):
        shard.unlink()
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout
    assert "no safetensors here" in stdout

    manifest_path = out / "weightsmith.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["sizes"]["bytes_after"] += 5_000_000
    manifest_path.write_text(json.dumps(manifest))
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 1
    assert any("weightsmith.json: sizes.bytes_after" in ln for ln in stdout.splitlines())


def test_bad_inputs_are_one_line_errors(
    quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = card_folder(quantized, tmp_path)
    not_eval = tmp_path / "x.json"
    not_eval.write_text("{}")
    code, _, err = run(capsys, monkeypatch, "card", out, "--eval", not_eval)
    assert code == 2 and "weightsmith eval --json" in err
    code, _, err = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 2 and "no README.md" in err
    assert not (out / "README.md").exists()


def test_dflash_draft_card_names_its_target_layers_and_the_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from weightsmith.quantization.demo import write_demo_checkpoint

    src = write_demo_checkpoint(tmp_path / "draft")
    out = tmp_path / "draft-w4a16"
    quantize(QuantizeRequest(src, out, scheme="w4a16", group_size=128, preset="dflash-draft", workers=2, pre_pass=None))
    code, _, err = run(capsys, monkeypatch, "card", out)
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert "A DFlash speculative draft" in card and "serve it with that target" in card
    assert "config.json does not name the target" in card
    sources = {c.source: c.value for c in find_cited(card)}
    config = json.loads((src / "config.json").read_text())
    ids = config["dflash_config"]["target_layer_ids"]
    cited = [sources[f"config.json: dflash_config.target_layer_ids[{i}]"] for i in range(len(ids))]
    assert cited == [str(i) for i in ids]
    # what the preset kept in BF16, with the preset's reason: which releases read q/k/v directly, and where
    assert "preset dflash-draft: vLLM's DFlash drafters read qkv_proj.weight directly" in card
    assert "unguarded in vLLM 0.25.1 (qwen3_dflash.py:421, laguna_dflash.py:159)" in card
    assert "only for an unquantized layer in vLLM 0.32.0 (qwen3_dflash.py:537 behind :533)" in card
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout


def test_card_of_a_checkpoint_that_fails_verify_says_so(
    quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = card_folder(quantized, tmp_path)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    # an FP8 KV cache declared, but no k_scale/v_scale shipped: vLLM would run with scales of 1.0
    config["quantization_config"]["kv_cache_scheme"] = {
        "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True,
    }  # fmt: skip
    config_path.write_text(json.dumps(config))
    code, _, err = run(capsys, monkeypatch, "card", out)
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert "**not clean**" in card
    sources = {c.source: c.value for c in find_cited(card)}
    assert int(sources["verify.json: errors"]) > 0
    assert "k_scale" in card  # the finding itself is quoted, so a reader knows what is wrong
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout


def with_quality(results: BenchResults, arm_fails: set[int]) -> BenchResults:
    """`results` with two quality runs per arm over 40 scenarios: `plain` fails s1 always and s0 in its
    second run (its one flip); `draft` fails those and `arm_fails` in both runs."""
    for name, failing in (("plain", {1}), ("draft", {1} | arm_fails)):
        for run_index in range(2):
            failed = failing | ({0} if run_index == 1 else set())
            outcomes = [ScenarioOutcome(f"s{k}", ("code", "tools")[k % 2], k not in failed) for k in range(40)]
            results.quality.append(QualityRun(name, run_index, "builtin:tool-use", outcomes))
    return results


@pytest.mark.parametrize(
    ("arm_fails", "verdict"),
    [
        (set(range(2, 14)), "a difference shown, `plain` passed more scenarios of this suite"),
        ({2, 3, 4}, "**no ordering shown** (3<!-- bench.json: analysis.quality.comparisons[draft].discordant -->"),
    ],
)
def test_card_cites_quality_verdicts_noise_floor_first(
    quantized: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    arm_fails: set[int], verdict: str,
) -> None:  # fmt: skip
    out = card_folder(quantized, tmp_path)
    bench_path = tmp_path / "in-bench.json"
    bench_path.write_text(json.dumps(to_jsonable(with_quality(bench_results(), arm_fails))))
    code, _, err = run(capsys, monkeypatch, "card", out, "--bench", bench_path)
    assert code == 0, err
    card = (out / "README.md").read_text()
    claims = card[card.index("## What we can and cannot claim") : card.index("## How it was made")]
    floor, versus = claims.index("**Task scores, noise floor first.**"), claims.index("against `plain`, task scores:")
    assert floor < versus
    assert verdict in claims
    sources = {c.source: c.value for c in find_cited(card)}
    assert sources["bench.json: analysis.quality.arms[plain].flips"] == "1"
    assert sources["bench.json: analysis.quality.arms[plain].earned[1]"] == "38"
    assert sources["bench.json: analysis.quality.comparisons[draft].discordant"] == str(len(arm_fails))
    p = sources["bench.json: analysis.quality.comparisons[draft].p"]

    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout
    anchor = "<!-- bench.json: analysis.quality.comparisons[draft].p -->"
    (out / "README.md").write_text(card.replace(p + anchor, "0.5" + anchor))
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 1
    assert any("analysis.quality.comparisons[draft].p" in ln and f"gives {p}" in ln for ln in stdout.splitlines())


def test_card_of_a_benchmark_without_quality_claims_no_task_scores(
    quantized: Path, inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    out = card_folder(quantized, tmp_path)
    run(capsys, monkeypatch, "card", out, "--bench", inputs[1])
    card = (out / "README.md").read_text()
    assert "the benchmark ran no quality suite, so this card claims nothing about task scores" in card
