"""Tensor names on disk: byte-accounting categories and KV-cache scale spellings."""

from __future__ import annotations

import pytest

from weightsmith.io import names

A = "model.layers.3.self_attn"


@pytest.mark.parametrize(
    ("name", "category"),
    [
        # the KV-cache scales under every spelling vLLM accepts, the older compressed-tensors one included
        (f"{A}.k_scale", "kv scales"),
        (f"{A}.v_scale", "kv scales"),
        (f"{A}.k_proj.k_scale", "kv scales"),
        (f"{A}.v_proj.v_scale", "kv scales"),
        (f"{A}.k_proj.output_scale", "kv scales"),
        (f"{A}.v_proj.output_scale", "kv scales"),
        (f"{A}.kv_scale", "kv scales"),
        (f"{A}.q_scale", "kv scales"),
        # an output_scale elsewhere is an ordinary quantization parameter
        (f"{A}.q_proj.output_scale", "quantization params"),
        (f"{A}.o_proj.output_scale", "quantization params"),
        (f"{A}.k_proj.weight_scale", "quantization params"),
        (f"{A}.k_proj.input_scale", "quantization params"),
        ("model.layers.0.mlp.experts.7.down_proj.weight_scale", "quantization params"),
        # weights by role
        ("model.layers.0.mlp.experts.7.down_proj.weight", "routed experts"),
        ("model.layers.0.mlp.experts.7.gate_proj.weight_packed", "routed experts"),
        ("model.layers.0.block_sparse_moe.experts.0.w1.weight", "routed experts"),
        ("model.layers.0.mlp.experts.gate_up_proj", "routed experts"),
        ("model.layers.0.mlp.shared_expert.up_proj.weight", "shared expert"),
        ("model.layers.0.mlp.shared_experts.down_proj.weight", "shared expert"),
        ("model.layers.0.mlp.shared_mlp.gate_proj.weight", "shared expert"),
        ("model.layers.0.self_attn.g_proj.weight", "attention gate"),
        (f"{A}.q_proj.weight", "attention"),
        (f"{A}.o_proj.bias", "attention"),
        ("model.layers.0.mlp.gate.weight", "router"),
        ("model.layers.0.block_sparse_moe.gate.weight", "router"),
        ("model.layers.0.mlp.router.weight", "router"),
        ("model.layers.0.mlp.shared_expert_gate.weight", "router"),
        ("model.layers.0.mlp.gate.e_score_correction_bias", "router"),
        ("model.layers.0.mlp.down_proj.weight", "dense mlp"),
        ("model.layers.0.input_layernorm.weight", "norms"),
        ("model.layers.0.post_attention_layernorm.weight", "norms"),
        (f"{A}.q_norm.weight", "norms"),
        ("model.norm.weight", "norms"),
        ("transformer.h.0.ln_1.weight", "norms"),
        ("model.embed_tokens.weight", "embeddings"),
        ("transformer.wte.weight", "embeddings"),
        ("lm_head.weight", "lm_head"),
        ("output.weight", "lm_head"),
        ("rotary_emb.inv_freq", "other"),
    ],
)
def test_category(name: str, category: str) -> None:
    assert names.category(name) == category
    assert category in names.CATEGORIES


def test_every_kv_scale_spelling_is_recognised() -> None:
    for kind in ("k", "v"):
        spellings = names.kv_scale_names(A, kind)
        assert spellings[0] == f"{A}.{kind}_scale"
        for spelling in spellings:
            assert names.is_kv_scale_name(spelling), spelling
            assert names.category(spelling) == "kv scales", spelling


@pytest.mark.parametrize(
    "name",
    [f"{A}.q_proj.output_scale", f"{A}.k_proj.weight_scale", f"{A}.k_proj.input_scale", f"{A}.k_proj.weight"],
)
def test_not_kv_scales(name: str) -> None:
    assert not names.is_kv_scale_name(name)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"model_type": "qwen3_moe", "architectures": ["Whatever"]}, "qwen3_moe"),
        ({"architectures": ["Qwen2MoeForCausalLM"]}, "qwen2_moe"),
        ({"architectures": ["LagunaModel"]}, "laguna"),
        ({}, None),
        (None, None),
    ],
)
def test_model_type(config: dict | None, expected: str | None) -> None:
    assert names.model_type(config) == expected


def test_runtime_name_rules_rename_to_the_loaded_spelling() -> None:
    rules = {t: r for r in names.RUNTIME_NAME_RULES for t in r.model_types}
    plural = "model.layers.1.mlp.shared_experts.up_proj.weight"
    singular = "model.layers.1.mlp.shared_expert.up_proj.weight"
    assert rules["qwen2_moe"].found.search(plural)
    assert rules["qwen2_moe"].rename(plural) == singular
    assert not rules["qwen2_moe"].found.search(singular)
    assert rules["deepseek_v3"].rename(singular) == plural
    assert not rules["deepseek_v3"].found.search(plural)
