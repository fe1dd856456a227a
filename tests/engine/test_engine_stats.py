"""The layer-streamed engine's statistics equal a whole-model transformers run, for every family."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.tiny_models import FAMILIES, linears, reference_stats, save_tiny
from weightsmith.calibration.measure import calibration_tokens, measure
from weightsmith.core.errors import CheckpointError
from weightsmith.io import texts

REL = 1e-6


def assert_same(found: dict, expected: dict) -> None:
    assert found.keys() == expected.keys()
    for name, value in expected.items():
        assert found[name] == pytest.approx(value, rel=REL), name


@pytest.fixture(scope="module")
def smollm2_tokens(smollm2: Path) -> list[list[int]]:
    sequences, label, sha, _ = calibration_tokens(smollm2, None, "code", 192, 64)
    assert [len(s) for s in sequences] == [64, 64, 64]
    assert label.startswith("builtin:code") and len(sha) == 64
    return sequences


def test_smollm2_stats_equal_the_whole_model(smollm2: Path, smollm2_tokens: list[list[int]]) -> None:
    kv, inputs = measure(smollm2, smollm2_tokens)
    ref_kv, ref_inputs = reference_stats(smollm2, smollm2_tokens)
    assert len(kv) == 30 and len(inputs) == 30 * 7
    assert_same(kv, ref_kv)
    assert_same(inputs, ref_inputs)
    # fused partners read the same input, and share one value
    assert inputs["model.layers.4.self_attn.q_proj"] == inputs["model.layers.4.self_attn.v_proj"]
    assert inputs["model.layers.4.mlp.gate_proj"] == inputs["model.layers.4.mlp.up_proj"]


def test_smollm2_kv_maxima_are_what_a_dynamic_cache_stores(smollm2: Path, smollm2_tokens: list[list[int]]) -> None:
    """Independent of our cache class: the K/V transformers' own DynamicCache holds after a prefill."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    stored: dict[int, tuple[float, float]] = {}
    with torch.no_grad():
        for ids in smollm2_tokens:
            cache = transformers.DynamicCache(config=model.config)
            model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
            for i, layer in enumerate(cache.layers):
                k, v = float(layer.keys.abs().max()), float(layer.values.abs().max())
                old = stored.get(i, (0.0, 0.0))
                stored[i] = (max(old[0], k), max(old[1], v))
    kv, _ = measure(smollm2, smollm2_tokens)
    assert_same(kv, {f"model.layers.{i}.self_attn": pair for i, pair in stored.items()})


@pytest.fixture(scope="module")
def tokens() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(256) for _ in range(24)] for _ in range(3)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_equals_the_whole_model(family: str, tmp_path: Path, tokens: list[list[int]]) -> None:
    """No per-model table: Qwen2, Qwen3 (QK norms), Mistral and Gemma 3 (sliding windows shorter than
    the sequences, one mask per layer type, tied and scaled embeddings), Qwen2-MoE (experts merged by
    transformers' own conversion when a layer is loaded)."""
    folder = save_tiny(tmp_path / family, family)
    kv, inputs = measure(folder, tokens)
    ref_kv, ref_inputs = reference_stats(folder, tokens)
    assert len(kv) == 3 and inputs
    if family == "qwen2_moe":  # every expert routed to at least once has its three inputs
        assert "model.layers.2.mlp.experts.3.down_proj" in inputs
    assert_same(kv, ref_kv)
    assert_same(inputs, ref_inputs)


def test_quantized_checkpoint_runs_dequantized(tiny_llama: Path, tmp_path: Path) -> None:
    """A W4A16 checkpoint runs as served: its statistics are those of the model transformers
    loads through compressed-tensors, and differ from the original's. compressed-tensors loaded in
    float32 keeps `q * scale` in float32; our decoder rounds it to the scale dtype (BF16 here), as
    compressed-tensors does in a BF16 model, so the reference's weights are rounded the same way."""
    import torch

    from fidelity.eval_checkpoints import quantize
    from models import quantized_modules
    from weightsmith.calibration import recorders
    from weightsmith.engine.loading import opened
    from weightsmith.fidelity.logits import load_model

    quant = quantize(tiny_llama, tmp_path / "w4", group=32)
    sequences = [[5, 17, 300, 4000, 12, 9, 77, 1000] * 4]
    kv, inputs = measure(quant, sequences)
    model = load_model(quant)
    with torch.no_grad():
        for module in quantized_modules(quant):
            weight = model.get_submodule(module).weight
            weight.copy_(weight.to(torch.bfloat16).float())
    ref_inputs: dict[str, float] = {}
    cache = recorders.kv_cache(model.config)
    with torch.no_grad(), recorders.input_maxima(linears(model.model, "model"), ref_inputs):
        model(torch.tensor(sequences), past_key_values=cache, use_cache=True)
    assert_same(kv, {f"model.layers.{i}.self_attn": cache.maxima[i] for i in range(2)})
    assert_same(inputs, recorders.share_fused(ref_inputs))
    with opened(quant) as loader:
        assert loader.source.activations == "quantized"
    original_kv, _ = measure(tiny_llama, sequences)
    assert original_kv != kv


def test_missing_layer_tensor_is_named(tiny_llama: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "holed"
    folder.mkdir()
    (folder / "config.json").write_bytes((tiny_llama / "config.json").read_bytes())
    tensors = load_file(str(tiny_llama / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        measure(folder, [[1, 2, 3]])
    assert err.value.tensor == "model.layers.1.mlp.down_proj.weight"
    assert "missing" in str(err.value)


def test_unknown_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "warp_drive", "architectures": ["WarpDriveForCausalLM"]}')
    from synth import llama_tensors, write_checkpoint

    write_checkpoint(tmp_path, llama_tensors(), {"model_type": "warp_drive", "architectures": ["WarpDriveForCausalLM"]})
    with pytest.raises(CheckpointError) as err:
        measure(tmp_path, [[1, 2, 3]])
    assert err.value.code == "engine.architecture"
    assert "warp_drive" in str(err.value) and "\n" not in str(err.value)


def test_calibration_tokens_from_a_file(smollm2: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 50)
    sequences, label, sha, _ = calibration_tokens(smollm2, str(text), None, 100, 40)
    assert [len(s) for s in sequences] == [40, 40, 20]
    assert label == str(text)
    import hashlib

    assert sha == hashlib.sha256(text.read_bytes()).hexdigest()
    assert texts.MIN_TOKENS > 100


@pytest.mark.parametrize("style", ["hf-fp8", "ct-fp8"])
def test_fp8_original_runs_decoded(style: str, tmp_path: Path) -> None:
    """An FP8 original runs as `quantize` decodes it: the same statistics as a BF16 checkpoint
    holding the decoded weights, and its activations are the original's."""
    from fidelity.eval_checkpoints import write_fp8
    from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
    from weightsmith.engine.loading import opened

    config = LLAMA_CONFIG  # every weight a whole number of 128x128 blocks, as write_fp8 needs
    tensors = llama_tensors(config, seed=2)
    decoded = write_fp8(tmp_path / style, tensors, config, style)
    dense = write_checkpoint(tmp_path / "decoded", tensors | decoded, config)
    sequences = [[3, 141, 59, 26, 53, 58, 97, 93, 238, 46, 264, 33]]
    kv, inputs = measure(tmp_path / style, sequences)
    ref_kv, ref_inputs = measure(dense, sequences)
    assert kv == ref_kv and inputs == ref_inputs
    with opened(tmp_path / style) as loader:
        assert loader.source.activations == "original"


def test_quantized_moe_experts_are_dequantized_then_merged(tmp_path: Path, tokens: list[list[int]]) -> None:
    """A W4A16 Qwen2-MoE: each expert's weight is dequantized, then transformers' conversion merges
    the experts, exactly as for a dense checkpoint holding the dequantized weights."""
    import json

    from safetensors.numpy import save_file

    from fidelity.eval_checkpoints import quantize
    from weightsmith.engine.source import TensorSource
    from weightsmith.io.checkpoint import Checkpoint

    src = save_tiny(tmp_path / "moe", "qwen2_moe")
    quant = quantize(src, tmp_path / "w4", group=32)
    dense = tmp_path / "dequantized"
    dense.mkdir()
    with TensorSource(Checkpoint.open(quant)) as source:
        save_file({name: source.tensor(name).numpy() for name in source.names}, str(dense / "model.safetensors"))
    config = json.loads((quant / "config.json").read_text())
    del config["quantization_config"]
    (dense / "config.json").write_text(json.dumps(config))
    kv, inputs = measure(quant, tokens)
    assert "model.layers.1.mlp.experts.2.down_proj" in inputs
    assert (kv, inputs) == measure(dense, tokens)
    assert inputs != measure(src, tokens)[1]
