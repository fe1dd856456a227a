"""Recipes: several schemes in one checkpoint, resolved by vLLM's rules to the scheme each rule gave.

The model is Laguna-shaped: a dense first layer, then MoE layers with routed experts, a shared
expert and a router, and attention with a `g_proj` gate. The recipe of the audited NVFP4 Laguna-S
artifact puts the experts in a 4-bit format and attention plus the shared expert in another, and
keeps the rest BF16.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from clirun import one_error_line, run
from synth import write_checkpoint
from weightsmith.audit.verify import verify
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.declaration import read_declaration
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantization.plan import build_plan
from weightsmith.quantization.recipe import load_recipe
from weightsmith.schemes import make_scheme

HIDDEN, EXPERTS, MOE_I, DENSE_I, LAYERS = 128, 4, 128, 256, 3
CONFIG = {
    "architectures": ["LagunaForCausalLM"],
    "model_type": "laguna",
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_experts": EXPERTS,
    "vocab_size": 256,
}


def laguna_like(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)

    t = {
        "model.embed_tokens.weight": w(256, HIDDEN),
        "model.norm.weight": np.ones(HIDDEN, ml_dtypes.bfloat16),
        "lm_head.weight": w(256, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = np.ones(HIDDEN, ml_dtypes.bfloat16)
        for proj, out in (("q_proj", 128), ("k_proj", 64), ("v_proj", 64), ("g_proj", 4)):
            t[f"{p}.self_attn.{proj}.weight"] = w(out, HIDDEN)
        t[f"{p}.self_attn.o_proj.weight"] = w(HIDDEN, 128)
        mlps = [f"{p}.mlp"] if i == 0 else [f"{p}.mlp.shared_expert"] + [f"{p}.mlp.experts.{e}" for e in range(EXPERTS)]
        inter = DENSE_I if i == 0 else MOE_I
        for m in mlps:
            t[f"{m}.gate_proj.weight"] = w(inter, HIDDEN)
            t[f"{m}.up_proj.weight"] = w(inter, HIDDEN)
            t[f"{m}.down_proj.weight"] = w(HIDDEN, inter)
        if i:
            t[f"{p}.mlp.gate.weight"] = w(EXPERTS, HIDDEN)
    return t


LAGUNA_RECIPE = """
ignore = ["re:.*self_attn\\\\.g_proj$"]

[[rule]]
targets = ["category:routed experts"]
scheme = "nvfp4a16"

[[rule]]
targets = ["category:attention", "category:shared expert"]
scheme = "fp8-dynamic"
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("laguna") / "src", laguna_like(), CONFIG, shards=3)


def _recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


def test_laguna_layout_round_trips(source: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    recipe = _recipe(tmp_path, LAGUNA_RECIPE)
    code, _, err = run(capsys, monkeypatch, "quantize", source, tmp_path / "mixed", "--recipe", recipe, "--no-hash")
    assert code == 0, err
    mixed = Checkpoint.open(tmp_path / "mixed")
    qc = mixed.quantization_config
    assert qc is not None and qc["format"] == "mixed-precision"
    assert list(qc["config_groups"]) == ["NVFP4A16", "FP8_DYNAMIC"]
    assert qc["config_groups"]["NVFP4A16"]["targets"] == [
        r"re:model\.layers\.\d+\.mlp\.experts\.\d+\.(down_proj|gate_proj|up_proj)$"
    ]
    assert "Linear" not in qc["config_groups"]["FP8_DYNAMIC"]["targets"]  # a class target would claim fused layers

    # compressed-tensors accepts the config, and the doctor (vLLM's order) resolves every module to its rule
    from compressed_tensors.quantization import QuantizationConfig

    QuantizationConfig.model_validate(qc)
    decl = read_declaration(mixed.config, None)
    assert decl is not None and not decl.problems
    for name in laguna_like():
        module = name.rsplit(".", 1)[0]
        scheme = None if decl.ignored(module) else decl.scheme_for(module)
        got = scheme.format if scheme else None
        if ".experts." in module:
            assert got == "nvfp4-pack-quantized", module
        elif (".self_attn." in module and not module.endswith("g_proj")) or ".shared_expert." in module:
            assert got == "float-quantized", module
        elif name.endswith("proj.weight") or module.endswith("mlp.gate"):
            assert got is None, module  # dense MLP, router, g_proj: kept BF16 and listed in ignore
    report = verify(tmp_path / "mixed", scan=True)
    assert report.clean, [f.line() for f in report.findings]

    # every quantized tensor is byte for byte what the one-scheme run of its rule writes
    for scheme, extra in (("nvfp4a16", []), ("fp8-dynamic", [])):
        out = tmp_path / scheme
        code, _, err = run(capsys, monkeypatch, "quantize", source, out, "--scheme", scheme, *extra, "--no-hash")
        assert code == 0, err
        single = Checkpoint.open(out)
        group = "NVFP4A16" if scheme == "nvfp4a16" else "FP8_DYNAMIC"
        for name, ref in mixed.tensors.items():
            module = name.rsplit(".", 1)[0]
            if decl.scheme_for(module) is not decl.schemes[list(qc["config_groups"]).index(group)]:
                continue
            if decl.ignored(module) or name not in single.tensors:
                continue
            ours = (tmp_path / "mixed" / ref.shard).read_bytes()[ref.info.offset : ref.info.offset + ref.info.nbytes]
            sref = single.tensors[name]
            theirs = (out / sref.shard).read_bytes()[sref.info.offset : sref.info.offset + sref.info.nbytes]
            assert ours == theirs, name

    manifest = json.loads((tmp_path / "mixed" / "weightsmith.json").read_text())
    rules = manifest["recipe"]["rules"]
    assert [r["config_group"] for r in rules] == ["NVFP4A16", "FP8_DYNAMIC"]
    assert rules[0]["quantized"] == 2 * EXPERTS * 3 and rules[1]["quantized"] == LAYERS * 4 + (LAYERS - 1) * 3


def test_dry_run_predicts_by_rule_and_category(source: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    recipe = _recipe(tmp_path, LAGUNA_RECIPE + '\n[[rule]]\ntargets = ["model.nothing.here"]\nscheme = "w4a16"\n')
    code, out, err = run(
        capsys, monkeypatch, "quantize", source, tmp_path / "o", "--recipe", recipe, "--dry-run", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc["predicted"]["rule"]) == {"rule 1: nvfp4a16", "rule 2: fp8-dynamic", "kept"}
    experts = doc["predicted"]["category"]["routed experts"]
    # FP4, one FP8 scale per 16 and a float32 global scale per weight
    assert experts["bytes_out"] * 8 / experts["params"] == pytest.approx(4.5 + 32 / (MOE_I * HIDDEN))
    assert doc["unmatched_targets"] == [{"rule": 3, "target": "model.nothing.here"}]
    assert "rule 3 target 'model.nothing.here' matches no Linear-like weight" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "rules,split",
    [
        ('targets = ["re:.*q_proj$"]\nscheme = "w4a16"', "qkv_proj"),
        ('targets = ["re:.*experts\\\\.0\\\\."]\nscheme = "w4a16"', "mlp.experts"),
    ],
)
def test_a_recipe_that_splits_one_vllm_layer_is_refused(source: Path, tmp_path: Path, rules: str, split: str) -> None:
    rest = '[[rule]]\ntargets = ["Linear"]\nscheme = "nvfp4a16"\n'
    recipe = load_recipe(_recipe(tmp_path, f"[[rule]]\n{rules}\n{rest}"))
    with pytest.raises(WeightsmithError, match=f"loads \\S*{split} as one layer"):
        build_plan(Checkpoint.open(source), recipe)


@pytest.mark.parametrize(
    "text,message",
    [
        ("[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\nbits = 4\n", "rule 1: unknown key 'bits'"),
        ("[[rule]]\ntargets = ['Linear']\nscheme = 'w3a16'\n", "rule 1: unknown scheme 'w3a16'"),
        ("[[rule]]\ntargets = ['category:experts']\nscheme = 'w4a16'\n", "unknown category 'category:experts'"),
        ("[[rule]]\ntargets = ['re:([']\nscheme = 'w4a16'\n", "not a valid regular expression"),
        ("[[rule]]\ntargets = []\nscheme = 'w4a16'\n", "targets"),
        ("[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\ngroup_size = 1e9\n", "group_size must be an integer"),
        ("[[rule]]\ntargets = ['Linear']\nscheme = 'fp8-dynamic'\ngroup_size = 64\n", "takes no group_size"),
        ("colour = 'blue'\n[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\n", "unknown key 'colour'"),
        ("ignore = 'lm_head'\n", "ignore must be a list"),
        ("title = 'no rules'\n", "unknown key 'title'"),
        ("[[rule]\n", "is not valid TOML"),
    ],
)
def test_bad_recipe_is_one_line(source: Path, tmp_path: Path, capsys, monkeypatch, text: str, message: str) -> None:
    recipe = _recipe(tmp_path, text)
    code, _, err = run(capsys, monkeypatch, "quantize", source, tmp_path / "o", "--recipe", recipe)
    line = one_error_line(err)
    assert code == 2 and message in line and "recipe.toml" in line, line
    assert not (tmp_path / "o").exists()


def test_recipe_and_scheme_together_is_one_line(source: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    recipe = _recipe(tmp_path, "[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\n")
    code, _, err = run(capsys, monkeypatch, "quantize", source, tmp_path / "o", "--recipe", recipe, "--scheme", "w4a16")
    assert code == 2 and "--scheme and --recipe both set the scheme" in one_error_line(err)


def test_one_rule_recipe_is_the_scheme(source: Path, tmp_path: Path) -> None:
    """`--scheme NAME` is the one-rule recipe: same plan, same config, targets ["Linear"]."""
    recipe = load_recipe(_recipe(tmp_path, "[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\n"))
    ckpt = Checkpoint.open(source)
    a, b = build_plan(ckpt, recipe), build_plan(ckpt, make_scheme("w4a16"))
    assert a.quantization_config() == b.quantization_config()
    assert a.quantization_config()["config_groups"]["W4A16"]["targets"] == ["Linear"]
    assert [(d.name, d.action) for d in a.decisions] == [(d.name, d.action) for d in b.decisions]


def test_a_recipe_whose_group_size_fits_no_weight_is_refused(
    source: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Groups wider than every input keep every targeted Linear: the output would declare quantization and
    quantize nothing (which eval and vLLM refuse), so quantize says so, naming a kept weight and why."""
    recipe = _recipe(tmp_path, "[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\ngroup_size = 4096\n")
    code, _, err = run(capsys, monkeypatch, "quantize", source, tmp_path / "o", "--recipe", recipe)
    line = one_error_line(err)
    assert code == 2 and "nothing would be quantized" in line and "not a multiple of the group size 4096" in line, line
    assert not (tmp_path / "o").exists()
