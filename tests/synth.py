"""Small synthetic checkpoints for tests, written with the safetensors library itself."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 320,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def llama_tensors(
    config: dict = LLAMA_CONFIG, dtype: object = ml_dtypes.bfloat16, seed: int = 0
) -> dict[str, np.ndarray]:
    """A Llama-shaped state dict with realistic-looking weights (row scales, rare outliers)."""
    rng = np.random.default_rng(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    nq, nkv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def w(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape).astype(np.float32) * 0.02
        if len(shape) == 2:
            x *= np.exp(0.3 * rng.standard_normal((shape[0], 1))).astype(np.float32)
            x[rng.random(shape) < 2e-3] *= 8
        return x.astype(dtype)

    t = {
        "model.embed_tokens.weight": w((v, h)),
        "model.norm.weight": (1 + w((h,))).astype(dtype),
        "lm_head.weight": w((v, h)),
    }
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        t |= {
            f"{p}.input_layernorm.weight": (1 + w((h,))).astype(dtype),
            f"{p}.post_attention_layernorm.weight": (1 + w((h,))).astype(dtype),
            f"{p}.self_attn.q_proj.weight": w((nq * hd, h)),
            f"{p}.self_attn.k_proj.weight": w((nkv * hd, h)),
            f"{p}.self_attn.v_proj.weight": w((nkv * hd, h)),
            f"{p}.self_attn.o_proj.weight": w((h, nq * hd)),
            f"{p}.mlp.gate_proj.weight": w((i, h)),
            f"{p}.mlp.up_proj.weight": w((i, h)),
            f"{p}.mlp.down_proj.weight": w((h, i)),
        }
    return t


def write_checkpoint(folder: Path, tensors: dict[str, np.ndarray], config: dict | None = None, shards: int = 1) -> Path:
    """Write tensors as one `model.safetensors` or `shards` files plus an index, and config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config if config is not None else LLAMA_CONFIG, indent=2))
    names = list(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    weight_map, total = {}, 0
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::shards]}
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map |= {n: fname for n in part}
        total += sum(a.nbytes for a in part.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return folder


def split_expert_scheme(folder: Path) -> Path:
    """Give the routed experts' down_proj a config group of its own, equal to theirs but for its observer:
    a checkpoint as another tool may write it, whose experts' projections resolve to two schemes (no
    tensor changes; vLLM compares the scheme dicts before it loads any)."""
    config = json.loads((folder / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    ((name, group),) = groups.items()
    down = json.loads(json.dumps(group))
    down["targets"] = [r"re:.*mlp\.experts\.\d+\.down_proj$"]
    down["weights"]["observer"] = "mse"
    groups[f"{name}_down"] = down
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
