"""verify's MoE experts against config.json, on a tiny random model of each MoE family built from its
transformers config: clean as saved and as quantized (packed experts compared by their logical
shape); an expert short, an expert without a projection, a shared expert of another size, a count the
config contradicts, each one error line; a family it has no expectations for, one info line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.tiny_models import MOE_FAMILIES, save_tiny
from weightsmith.audit.verify import verify


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    return {f: save_tiny(root / f, f, shapes=MOE_FAMILIES[f]) for f in sorted(MOE_FAMILIES)}


def _experts(folder: Path) -> tuple[list[tuple[str, str | None, str]], str]:
    report = verify(folder)
    scope = next(c.scope for c in report.checks if c.id == "experts")
    return [(f.check, f.tensor, f.message) for f in report.findings if f.check.startswith("moe.")], scope


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_every_family_is_clean_as_saved_and_as_quantized(
    families: dict[str, Path], tmp_path: Path, family: str
) -> None:
    import weightsmith as ws

    found, scope = _experts(families[family])
    layers = 3 if family == "mixtral" else 2
    shared = 6 if {"shared_expert_intermediate_size", "n_shared_experts"} & set(MOE_FAMILIES[family]) else 0
    assert found == [] and scope.startswith(f"{layers} MoE layers of 8 experts (")
    assert scope.endswith(f", {shared} shared projections")
    out = tmp_path / "q"
    ws.quantize(ws.QuantizeRequest(source=families[family], output=out, group_size=32))  # the tiny widths take 32
    assert _experts(out) == (found, scope) and verify(out).clean


def test_an_expert_short_incomplete_or_of_another_size_is_an_error(families: dict[str, Path], tmp_path: Path) -> None:
    bad = shutil.copytree(families["qwen2_moe"], tmp_path / "bad")
    tensors = load_file(bad / "model.safetensors")
    for name in [n for n in tensors if ".layers.1.mlp.experts.7." in n]:
        del tensors[name]
    del tensors["model.layers.2.mlp.experts.3.up_proj.weight"]
    down = "model.layers.2.mlp.shared_expert.down_proj.weight"
    tensors[down] = tensors[down][:, :32].copy()
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    found, _ = _experts(bad)
    assert found == [
        ("moe.expert-count", None, "model.layers.1.mlp.experts holds 7 experts but config.json's num_experts is 8: "
         "no expert 7; vLLM builds 8"),
        ("moe.expert-incomplete", None, "model.layers.2.mlp.experts.3 has no up_proj, which the layer's other experts "
         "have; vLLM loads every expert's projections into one FusedMoE layer"),
        ("moe.shape", down, "is [64, 32] but config.json implies [64, 64] (shared_expert_intermediate_size 64, "
         "hidden_size 64)"),
    ]  # fmt: skip
    assert not verify(bad).clean


def test_a_config_that_contradicts_the_experts_is_an_error(families: dict[str, Path], tmp_path: Path) -> None:
    bad = shutil.copytree(families["mixtral"], tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    config["num_local_experts"], config["intermediate_size"] = 6, 96
    (bad / "config.json").write_text(json.dumps(config))
    found, _ = _experts(bad)
    counts = [m for c, _, m in found if c == "moe.expert-count"]
    shapes = [(t, m) for c, t, m in found if c == "moe.shape"]
    assert counts == [
        f"model.layers.{i}.block_sparse_moe.experts holds 8 experts but config.json's num_local_experts is 6: "
        "expert 6, 7 beyond them; vLLM builds 6"
        for i in range(3)
    ]
    assert len(shapes) == 3 * 8 * 3 and shapes[0] == (
        "model.layers.0.block_sparse_moe.experts.0.w1.weight",
        "is [128, 64] but config.json implies [96, 64] (intermediate_size 96, hidden_size 64)",
    )
    config["num_local_experts"] = "8"
    (bad / "config.json").write_text(json.dumps(config))
    assert _experts(bad)[0] == [
        ("moe.config", None, "num_local_experts is '8', not a positive integer; vLLM sizes the experts by it")
    ]


def test_a_family_without_expectations_is_said_to_be_unchecked(families: dict[str, Path], tmp_path: Path) -> None:
    other = shutil.copytree(families["qwen2_moe"], tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    config["model_type"], config["architectures"] = "olmoe", ["OlmoeForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    found, scope = _experts(other)
    assert scope == "model_type olmoe: experts not checked"
    message = (
        "model_type olmoe: no expectations for its experts, so their count and shapes were not checked (checked "
        "for deepseek_v3, laguna, mixtral, qwen2_moe, qwen3_moe)"
    )
    assert found == [("moe.not-checked", None, message)]


def test_a_hostile_count_or_index_costs_nothing(families: dict[str, Path], tmp_path: Path) -> None:
    """A config declaring 10^12 experts is one line listing the first few missing, not a loop over all of
    them; an expert index of 5,000 digits (beyond what Python parses into an int by default) is no expert,
    not a traceback."""
    from weightsmith.engine.experts import expert_table

    bad = shutil.copytree(families["qwen2_moe"], tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    config["num_experts"] = 10**12
    (bad / "config.json").write_text(json.dumps(config))
    tensors = load_file(bad / "model.safetensors")
    long = "9" * 5000
    down = tensors["model.layers.1.mlp.experts.0.down_proj.weight"]
    tensors[f"model.layers.1.mlp.experts.{long}.down_proj.weight"] = down
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    counts = [m for c, _, m in _experts(bad)[0] if c == "moe.expert-count"]
    assert counts[0] == (
        "model.layers.1.mlp.experts holds 8 experts but config.json's num_experts is 1,000,000,000,000: no expert 8, "
        "9, 10, 11, 12 and 999,999,999,987 more; vLLM builds 1,000,000,000,000"
    )
    merged = {"m.experts.gate_up_proj": [f"m.experts.{i}.gate_proj.weight" for i in ("0", "1", long)]}
    assert expert_table(merged) == {}
