"""A built-in checkpoint for `weightsmith demo`: a DFlash-like speculative draft, made on the spot.

Deterministic (fixed seed), shaped like a small block-diffusion draft: a few Llama-style layers
with a per-head attention gate (`g_proj`), an `fc` that projects the target's concatenated hidden
states, and no `embed_tokens`/`lm_head` (a DFlash draft shares the target's). Weights are BF16 with
per-row scale variation and rare outliers, so quantization error looks like it does on real models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightsmith.core.lazy import lazy_module
from weightsmith.safetensors.writer import ShardWriter, TensorSpec

if TYPE_CHECKING:
    import ml_dtypes
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")
    ml_dtypes = lazy_module("ml_dtypes")


DEMO_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 2048,
    "intermediate_size": 4096,
    "num_hidden_layers": 3,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "block_size": 16,
    "dflash_config": {"target_layer_ids": [1, 12, 23], "mask_token_id": 0},
}


def demo_tensors(config: dict[str, Any] = DEMO_CONFIG) -> list[TensorSpec]:
    """Names and shapes of the demo draft, in the order they are generated."""
    h, i = config["hidden_size"], config["intermediate_size"]
    nq, nkv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    aux = len(config["dflash_config"]["target_layer_ids"])
    specs = [TensorSpec("fc.weight", "BF16", (h, h * aux)), TensorSpec("hidden_norm.weight", "BF16", (h,))]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        specs += [
            TensorSpec(f"{p}.input_layernorm.weight", "BF16", (h,)),
            TensorSpec(f"{p}.post_attention_layernorm.weight", "BF16", (h,)),
            TensorSpec(f"{p}.self_attn.q_proj.weight", "BF16", (nq * hd, h)),
            TensorSpec(f"{p}.self_attn.k_proj.weight", "BF16", (nkv * hd, h)),
            TensorSpec(f"{p}.self_attn.v_proj.weight", "BF16", (nkv * hd, h)),
            TensorSpec(f"{p}.self_attn.o_proj.weight", "BF16", (h, nq * hd)),
            TensorSpec(f"{p}.self_attn.g_proj.weight", "BF16", (nq, h)),
            TensorSpec(f"{p}.self_attn.q_norm.weight", "BF16", (hd,)),
            TensorSpec(f"{p}.self_attn.k_norm.weight", "BF16", (hd,)),
            TensorSpec(f"{p}.mlp.gate_proj.weight", "BF16", (i, h)),
            TensorSpec(f"{p}.mlp.up_proj.weight", "BF16", (i, h)),
            TensorSpec(f"{p}.mlp.down_proj.weight", "BF16", (h, i)),
        ]
    specs.append(TensorSpec("norm.weight", "BF16", (h,)))
    return specs


def _values(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    if len(spec.shape) == 1:
        return (1.0 + 0.05 * rng.standard_normal(spec.shape, dtype=np.float32)).astype(ml_dtypes.bfloat16)
    rows = spec.shape[0]
    w = rng.standard_normal(spec.shape, dtype=np.float32)
    w *= np.float32(0.02) * np.exp(np.float32(0.3) * rng.standard_normal((rows, 1), dtype=np.float32))
    outliers = rng.random(spec.shape, dtype=np.float32) < 1e-3
    w[outliers] *= np.float32(8.0)
    return w.astype(ml_dtypes.bfloat16)


def write_demo_checkpoint(folder: Path, seed: int = 0, config: dict[str, Any] = DEMO_CONFIG) -> Path:
    """Write the demo draft (config.json + model.safetensors) into `folder` and return it; tests pass
    a smaller `config` of the same shape."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    specs = demo_tensors(config)
    with ShardWriter(folder, "model.safetensors", specs, {"format": "pt"}) as writer:
        for spec in specs:
            writer.write(spec.name, _values(spec, rng))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
