"""Every registered family against a tiny random model built from its own transformers config.

What a family states (its classes, its experts' config keys and projection names, its router's tensors,
the norms a pre-pass may fold) is held against what transformers actually builds and saves for it, in
seconds per family; a family the registry does not know is refused by GPTQ and calibrate in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from clirun import one_error_line, run
from engine.tiny_models import FAMILIES as DENSE
from engine.tiny_models import MOE_FAMILIES, moe_shapes, save_tiny
from weightsmith.audit.verify import verify
from weightsmith.families import FAMILIES

pytest.importorskip("torch")

#: A tiny model of every registered family: the shapes the engine's tests use, and Llama's defaults.
SHAPES = {"llama": {}, **DENSE, **{f: moe_shapes(f) for f in MOE_FAMILIES}}
REGISTERED = sorted({family.name(): family for family in FAMILIES.values()})


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: save_tiny(root / name, name, shapes=SHAPES[name]) for name in REGISTERED}


def test_every_registered_family_has_a_tiny_model() -> None:
    """A family without a tiny model here would go untested: the registry and the test matrix agree."""
    assert set(REGISTERED) <= set(SHAPES), set(REGISTERED) - set(SHAPES)


def _tensors(folder: Path) -> dict[str, list[int]]:
    with safe_open(folder / "model.safetensors", "np") as f:
        return {name: f.get_slice(name).get_shape() for name in f.keys()}  # noqa: SIM118


@pytest.mark.parametrize("name", REGISTERED)
def test_what_a_family_states_is_what_transformers_builds(built: dict[str, Path], name: str) -> None:
    folder = built[name]
    family = FAMILIES[name]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] in family.model_types and config["architectures"][0] in family.architectures
    tensors = _tensors(folder)
    layer = max(int(n.split(".")[2]) for n in tensors if n.startswith("model.layers."))
    for norm in family.foldable_norms:  # the pre-pass folds into these: each layer has them, one weight each
        assert tensors[f"model.layers.{layer}.{norm}.weight"] == [config["hidden_size"]]
    report = verify(folder)
    assert report.clean, [f.message for f in report.findings if f.severity == "error"]
    checks = {c.id: c.scope for c in report.checks}
    if family.experts is None:
        assert not any(".experts." in n for n in tensors)
        return
    experts = family.experts
    count, size = config[experts.count_key(config)], config[experts.size]
    projections = {n.rsplit(".", 2)[-2] for n in tensors if f".{layer}." in n and ".experts.0." in n}
    assert projections == {*experts.reads, experts.writes}
    hidden = config["hidden_size"]
    for proj in experts.reads:
        assert tensors[next(n for n in tensors if n.endswith(f".experts.0.{proj}.weight"))] == [size, hidden]
    router = family.router
    assert router is not None
    gates = [n for n in tensors if n.endswith(f".{router.module}.weight") and ".experts." not in n]
    assert gates and all(tensors[g] == [count, hidden] for g in gates)
    assert f"of {count} experts" in checks["experts"] and f"{router.scoring} scores" in checks["experts"]
    assert router.shared_gate == any("shared_expert_gate" in n for n in tensors)
    if router.score_bias is not None and router.score_bias.startswith("gate."):  # transformers saves DeepSeek's
        assert any(n.endswith(router.score_bias) for n in tensors)


def test_a_router_of_another_size_is_found(built: dict[str, Path], tmp_path: Path) -> None:
    """The router is checked against the family's statement of it: a router for another expert count
    fails to load in vLLM, and verify says so."""
    from safetensors.torch import load_file, save_file

    bad = Path(shutil.copytree(built["qwen2_moe"], tmp_path / "bad"))
    tensors = load_file(bad / "model.safetensors")
    tensors["model.layers.1.mlp.gate.weight"] = tensors["model.layers.1.mlp.gate.weight"][:5]
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    found = [(f.check, f.tensor, f.message) for f in verify(bad).findings if f.check.startswith("moe.")]
    assert found == [("moe.router", "model.layers.1.mlp.gate.weight", "is [5, 64] but config.json implies [8, 64] "
                      "(num_experts 8, hidden_size 64)")]  # fmt: skip


@pytest.mark.parametrize(
    "command", [("calibrate", "--out", "{out}"), ("quantize", "{out}", "--method", "gptq", "--group-size", "32")]
)
def test_gptq_and_calibrate_refuse_a_family_they_do_not_know(
    built: dict[str, Path], tmp_path: Path, capsys, monkeypatch, command: tuple[str, ...]
) -> None:
    """OLMoE: a MoE model transformers builds and runs, whose experts and router no family here states."""
    other = save_tiny(tmp_path / "other", "olmoe", shapes={"num_experts": 8, "num_experts_per_tok": 2})
    capsys.readouterr()  # transformers' own progress while saving it
    out = tmp_path / "out"
    args = [a.replace("{out}", str(out)) for a in command]
    code, _, err = run(capsys, monkeypatch, args[0], other, *args[1:])
    line = one_error_line(err)
    assert code != 0 and "model_type 'olmoe'" in line and "knows no such architecture family" in line, line
    assert "deepseek_v3" in line and "weightsmith/families/" in line and "config.json" in line
    assert not out.exists()


def test_a_score_bias_the_config_does_not_ask_for_is_found(built: dict[str, Path], tmp_path: Path) -> None:
    """vLLM's DeepSeek layer builds `gate.e_score_correction_bias` only under `topk_method: noaux_tc`; a
    checkpoint that has the bias under a config without it stops vLLM at load with a KeyError (seen on
    vLLM CPU 0.32.0), and verify says so beforehand."""
    bad = Path(shutil.copytree(built["deepseek_v3"], tmp_path / "bad"))
    config = json.loads((bad / "config.json").read_text())
    del config["topk_method"]
    (bad / "config.json").write_text(json.dumps(config))
    found = [(f.check, f.tensor) for f in verify(bad).findings if f.check.startswith("moe.")]
    assert found == [("moe.router", "model.layers.1.mlp.gate.e_score_correction_bias")]
