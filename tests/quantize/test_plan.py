"""The plan: every tensor's fate and the reason, fused agreement, vLLM's ignore matching."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.targets import Targets
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantization.plan import DECODE, KEEP, QUANTIZE, build_plan
from weightsmith.schemes import make_scheme


def matches(entry: str, module: str) -> bool:
    """One entry against one module name, as every list of targets is matched."""
    return Targets([entry], "pattern").matches(module)


def _plan(tmp_path: Path, tensors: dict | None = None, config: dict | None = None, **kw: object):
    ckpt = Checkpoint.open(write_checkpoint(tmp_path / "src", tensors or llama_tensors(), config))
    scheme = make_scheme(str(kw.pop("scheme", "w4a16")), int(kw.pop("group_size", 128)))
    plan = build_plan(ckpt, scheme, **kw)
    return plan, {d.name: d for d in plan.decisions}


def test_default_plan_quantizes_linears_and_keeps_the_rest(tmp_path: Path) -> None:
    plan, d = _plan(tmp_path)
    assert d["model.layers.0.self_attn.q_proj.weight"].action == QUANTIZE
    assert d["model.layers.1.mlp.down_proj.weight"].action == QUANTIZE
    assert d["model.embed_tokens.weight"].reason == "embedding"
    assert d["lm_head.weight"].action == KEEP and "lm_head" in d["lm_head.weight"].reason
    assert d["model.norm.weight"].reason == "1-D tensor"
    assert plan.ignore == ["lm_head"]
    specs = {s.name: s for s in d["model.layers.0.mlp.up_proj.weight"].outputs}
    assert specs["model.layers.0.mlp.up_proj.weight_packed"].shape == (512, 32)
    assert specs["model.layers.0.mlp.up_proj.weight_scale"].dtype == "BF16"
    assert specs["model.layers.0.mlp.up_proj.weight_shape"].shape == (2,)
    assert plan.bytes_out < plan.bytes_in


def test_group_size_that_does_not_divide_keeps_and_ignores(tmp_path: Path) -> None:
    config = dict(LLAMA_CONFIG, intermediate_size=576)  # like SmolLM2: 576 % 128 != 0
    plan, d = _plan(tmp_path, llama_tensors(config), config)
    down = d["model.layers.0.mlp.down_proj.weight"]
    assert down.action == KEEP and "576" in down.reason and "group size 128" in down.reason
    assert "model.layers.0.mlp.down_proj" in plan.ignore
    # gate/up have 256 inputs and are quantized: down_proj is not fused with them.
    assert d["model.layers.0.mlp.gate_proj.weight"].action == QUANTIZE


def test_fused_shards_are_kept_together(tmp_path: Path) -> None:
    plan, d = _plan(tmp_path, ignore=["model.layers.0.self_attn.k_proj"])
    for p in ("q_proj", "k_proj", "v_proj"):
        dec = d[f"model.layers.0.self_attn.{p}.weight"]
        assert dec.action == KEEP
        assert f"model.layers.0.self_attn.{p}" in plan.ignore or p == "k_proj"
    assert "vLLM loads qkv_proj as one layer" in d["model.layers.0.self_attn.q_proj.weight"].reason
    assert d["model.layers.1.self_attn.q_proj.weight"].action == QUANTIZE
    assert d["model.layers.0.self_attn.o_proj.weight"].action == QUANTIZE


def test_ignore_matches_vllm_fused_names_and_regexes(tmp_path: Path) -> None:
    plan, d = _plan(tmp_path, ignore=["model.layers.1.mlp.gate_up_proj", "re:.*o_proj$"])
    assert d["model.layers.1.mlp.gate_proj.weight"].reason == "--ignore model.layers.1.mlp.gate_up_proj"
    assert d["model.layers.1.mlp.up_proj.weight"].action == KEEP
    assert d["model.layers.0.mlp.up_proj.weight"].action == QUANTIZE
    assert all(d[f"model.layers.{i}.self_attn.o_proj.weight"].action == KEEP for i in (0, 1))
    # re: is anchored at the start only, as in vLLM (re.match): "o_proj$" alone matches nothing.
    assert not matches("re:o_proj$", "model.layers.0.self_attn.o_proj")
    assert matches("re:.*o_proj$", "model.layers.0.self_attn.o_proj")
    assert plan.ignore[:2] == ["model.layers.1.mlp.gate_up_proj", "re:.*o_proj$"]


def test_dflash_preset_keeps_qkv_and_gate(tmp_path: Path) -> None:
    tensors = llama_tensors()
    tensors["model.layers.0.self_attn.g_proj.weight"] = np.zeros((4, 256), ml_dtypes.bfloat16)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        del tensors[k]  # a draft ships neither: not an error
    plan, d = _plan(tmp_path, tensors, preset="dflash-draft")
    assert d["model.layers.0.self_attn.v_proj.weight"].action == KEEP
    assert d["model.layers.0.self_attn.g_proj.weight"].action == KEEP
    assert "preset dflash-draft" in d["model.layers.0.self_attn.q_proj.weight"].reason
    assert d["model.layers.0.self_attn.o_proj.weight"].action == QUANTIZE
    assert plan.ignore == ["re:.*\\.(q|k|v|qkv)_proj$", "re:.*\\.g_proj$"]
    with pytest.raises(WeightsmithError, match="unknown preset"):
        _plan(tmp_path / "x", preset="nope")


def test_a_dflash_draft_quantized_without_its_preset_is_warned_with_the_releases_it_breaks(tmp_path: Path) -> None:
    """A draft whose config has `dflash_config`, q/k/v quantized: the plan warns, naming the releases that
    read `qkv_proj.weight` unguarded; with the preset, or for a model that is no DFlash draft, nothing."""
    from weightsmith.quantization.request import plan_warnings

    tensors = llama_tensors()
    draft = {**LLAMA_CONFIG, "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 0}}
    plan, _ = _plan(tmp_path / "draft", tensors, config=draft)
    (said,) = plan_warnings(plan)
    assert said.startswith("model.layers.0.self_attn.k_proj and 5 more q/k/v projection(s) of this DFlash draft")
    assert "vLLM 0.25.1 (qwen3_dflash.py:421, laguna_dflash.py:159)" in said and "--preset dflash-draft" in said
    assert plan_warnings(_plan(tmp_path / "preset", tensors, config=draft, preset="dflash-draft")[0]) == []
    assert plan_warnings(_plan(tmp_path / "model", tensors)[0]) == []


def test_moe_routers_experts_and_3d_tensors(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)

    tensors = {
        "model.layers.0.mlp.gate.weight": w(8, 256),
        "model.layers.0.mlp.experts.0.gate_proj.weight": w(128, 256),
        "model.layers.0.mlp.experts.0.up_proj.weight": w(128, 256),
        "model.layers.0.mlp.experts.0.down_proj.weight": w(256, 128),
        "model.layers.1.mlp.experts.gate_up_proj": w(4, 256, 256),
        "model.layers.1.mlp.experts.down_proj": w(4, 256, 128),
        "model.layers.1.mlp.shared_expert_gate.weight": w(1, 256),
    }
    plan, d = _plan(tmp_path, tensors)
    assert d["model.layers.0.mlp.gate.weight"].reason.startswith("MoE router")
    assert "model.layers.0.mlp.gate" in plan.ignore and "model.layers.1.mlp.shared_expert_gate" in plan.ignore
    assert d["model.layers.0.mlp.experts.0.up_proj.weight"].action == QUANTIZE
    fused = d["model.layers.1.mlp.experts.gate_up_proj"]
    assert fused.action == KEEP and fused.reason.startswith("3-D fused expert tensor")
    assert "model.layers.1.mlp.experts" in plan.ignore


def test_already_quantized_source_is_refused(tmp_path: Path) -> None:
    config = dict(LLAMA_CONFIG, quantization_config={"quant_method": "gptq", "bits": 4})
    with pytest.raises(WeightsmithError, match="already quantized"):
        _plan(tmp_path, config=config)


def test_bad_regex_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WeightsmithError, match="not a valid regular expression"):
        _plan(tmp_path, ignore=["re:(unclosed"])


def test_asymmetric_outputs_include_packed_zero_points(tmp_path: Path) -> None:
    _, d = _plan(tmp_path, scheme="w4a16-asym")
    specs = {s.name: s for s in d["model.layers.0.self_attn.k_proj.weight"].outputs}
    assert specs["model.layers.0.self_attn.k_proj.weight_zero_point"].shape == (16, 2)
    assert specs["model.layers.0.self_attn.k_proj.weight_zero_point"].dtype == "I32"


def test_decode_action_only_for_fp8(tmp_path: Path) -> None:
    _, d = _plan(tmp_path)
    assert not any(x.action == DECODE for x in d.values())
