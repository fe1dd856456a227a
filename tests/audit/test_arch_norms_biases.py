"""The one statement of what config.json implies (`formats.architecture`) against real checkpoints.

`verify` and `quantize` both read it, so a rule that is wrong there is wrong twice: here the biases
and norms it expects are held to the checkpoints transformers itself writes for each family and
bias setting, and its reading of `model_type` beside `architectures` to real configs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from weightsmith.audit.verify import verify
from weightsmith.formats.architecture import Architecture, contradiction

SMALL = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, tie_word_embeddings=False)  # fmt: skip


@pytest.mark.parametrize(
    "model_type,extra,unbuilt",
    [
        ("llama", {}, set()),
        ("llama", {"attention_bias": True}, set()),
        ("llama", {"mlp_bias": True}, set()),
        ("mistral", {}, set()),
        ("qwen2", {}, set()),
        ("qwen3", {}, set()),
        # transformers gives Qwen3's o_proj a bias under attention_bias; vLLM's Qwen3Attention builds none
        ("qwen3", {"attention_bias": True}, {"model.layers.0.self_attn.o_proj.bias"}),
    ],
)
def test_what_transformers_writes_is_what_verify_expects(
    tmp_path: Path, model_type: str, extra: dict, unbuilt: set[str]
) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type, **SMALL, **extra)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    report = verify(tmp_path)
    errors = [(f.check, f.tensor) for f in report.findings if f.severity == "error"]
    assert errors == [("arch.unexpected-bias", name) for name in sorted(unbuilt)], errors
    arch_scope = next(c.scope for c in report.checks if c.id == "architecture")
    assert "norms and biases too" in arch_scope


@pytest.mark.parametrize(
    "model_type,arch,contradicts",
    [
        ("llama", "LlamaForCausalLM", False),
        ("qwen2", "Qwen2ForCausalLM", False),
        ("llama", "GemmaForCausalLM", True),  # another model's causal LM
        ("gemma", "LlamaForCausalLM", True),  # a known class beside another model's type
        ("mistral", "LlamaForCausalLM", True),
        ("llama", "LlamaForCausalLMEagle3", False),  # an EAGLE3 draft of a Llama
        ("qwen3", "DFlashDraftModel", False),  # a DFlash draft of a Qwen3
        ("gemma3_text", "Gemma3ForCausalLM", False),  # neither side known: no opinion
        (None, "LlamaForCausalLM", False),
    ],
)
def test_a_contradiction_is_two_models_not_a_draft_of_one(model_type: str | None, arch: str, contradicts: bool) -> None:
    config = {"architectures": [arch]} | ({"model_type": model_type} if model_type else {})
    assert (contradiction(config) is not None) == contradicts


def test_a_bias_says_which_key_would_give_it() -> None:
    llama = Architecture.of(dict(SMALL, architectures=["LlamaForCausalLM"], attention_bias=True, qkv_bias=False))
    qwen2 = Architecture.of(dict(SMALL, architectures=["Qwen2ForCausalLM"]))
    assert llama is not None and qwen2 is not None
    assert "config.json does not set qkv_bias" in (llama.unbuilt_bias("model.layers.0.self_attn.q_proj.bias") or "")
    assert llama.unbuilt_bias("model.layers.0.self_attn.o_proj.bias") is None
    assert "config.json does not set mlp_bias" in (llama.unbuilt_bias("model.layers.3.mlp.up_proj.bias") or "")
    assert "Qwen2ForCausalLM never builds one" in (qwen2.unbuilt_bias("model.layers.0.self_attn.o_proj.bias") or "")
    assert qwen2.unbuilt_bias("model.layers.0.self_attn.v_proj.bias") is None
    assert qwen2.unbuilt_bias("model.layers.0.mlp.experts.0.bias") is None  # not a projection the family has
    want = qwen2.expected("model.layers.7.self_attn.k_proj.bias")
    assert want is not None and want.shape == (32,) and want.why == "num_key_value_heads 1 x head_dim 32"
