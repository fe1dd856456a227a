"""Tiny target/draft pairs that vLLM serves through its own speculative methods, random weights.

Each draft is laid out as its vLLM model file loads it (names on disk without `model.`, which
`load_weights` prepends; the target's embeddings and LM head shared where the method shares them):

- `qwen3_dflash`: a Qwen3 target and a `DFlashDraftModel` (vLLM `qwen3_dflash.py`): `fc` over the
  hidden states of target layers `dflash_config.target_layer_ids`, `hidden_norm`, Qwen3 layers with
  q/k norms, `norm`; `block_size` and `mask_token_id` as DFlash drafts carry them.
- `laguna_dflash`: a Laguna target with every layer dense (vLLM CPU's router asserts softmax, and
  Laguna routes by sigmoid) and a `DFlashLagunaForCausalLM` (`laguna_dflash.py`): Laguna layers with
  the per-head `g_proj` gate, one `aux_hidden_norms.i` per target layer read, `draft_vocab_size`.
  Its `load_weights` looks every name up as it is (no q/k/v stacking), so the draft stores attention
  as one fused `qkv_proj`, as Laguna DFlash drafts do.
- `llama_eagle3`: a Llama target and an `Eagle3LlamaForCausalLM` (`llama_eagle3.py`): one `midlayer`
  over the token's embedding and `fc` of three target layers, its own `lm_head` over the whole
  vocabulary (no `d2t` map), the target's embeddings shared.

Random drafts accept nothing; what they show is that the method serves a quantized draft and that
the output is the target's own (speculative decoding is lossless at temperature 0).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.tiny_models import COMMON, SERVABLE, save_tiny, sharpen

SHAPES = {**COMMON, **SERVABLE, "intermediate_size": 256, "num_hidden_layers": 4}
DRAFT_LAYERS = 2
#: Target layers a DFlash draft reads (low and middle of four); EAGLE3 reads three.
DFLASH_LAYERS = [0, 2]
EAGLE3_LAYERS = [0, 1, 3]


@dataclass(frozen=True)
class Pair:
    family: str
    target: Path
    draft: Path
    #: vLLM's speculative method for the draft (`--speculative-config`'s "method")
    method: str
    #: weightsmith's preset for the draft (`quantize --preset`)
    preset: str


def target(folder: Path, model_type: str, tokenizer: Path, **config: object) -> Path:
    """A `model_type` target with random weights (transformers' own), BF16, its final norm sharpened: in
    BF16 the one-token pass and the draft's batched verification must not meet a near-tie."""
    save_tiny(folder, model_type, tokenizer=tokenizer, shapes={**SHAPES, **config})
    return sharpen(folder, bf16=True)


def _write(folder: Path, config: dict, shapes: dict[str, tuple[int, ...]], seed: int) -> Path:
    """A BF16 draft: norms near one, matrices N(0, 0.05)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            tensors[name] = 1.0 + 0.05 * torch.randn(shape, generator=gen)
        else:
            tensors[name] = 0.05 * torch.randn(shape, generator=gen)
    bf16 = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    save_file(bf16, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}, indent=2))
    return folder


def _layer(prefix: str, gate: bool) -> dict[str, tuple[int, ...]]:
    h, i, hd = SHAPES["hidden_size"], SHAPES["intermediate_size"], SHAPES["head_dim"]
    nq, nkv = SHAPES["num_attention_heads"], SHAPES["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {
        f"{prefix}.input_layernorm.weight": (h,),
        f"{prefix}.post_attention_layernorm.weight": (h,),
        f"{prefix}.self_attn.q_proj.weight": (nq * hd, h),
        f"{prefix}.self_attn.k_proj.weight": (nkv * hd, h),
        f"{prefix}.self_attn.v_proj.weight": (nkv * hd, h),
        f"{prefix}.self_attn.o_proj.weight": (h, nq * hd),
        f"{prefix}.mlp.gate_proj.weight": (i, h),
        f"{prefix}.mlp.up_proj.weight": (i, h),
        f"{prefix}.mlp.down_proj.weight": (h, i),
    }
    if gate:  # Laguna's per-head attention gate
        shapes[f"{prefix}.self_attn.g_proj.weight"] = (nq, h)
    return shapes


def _base_config(tgt: Path, layers: int = DRAFT_LAYERS) -> dict:
    """The target's own config for a draft of `layers` layers: its shapes, vocabulary and rotary settings,
    each per-layer list cut to the draft's first layers."""
    config = json.loads((tgt / "config.json").read_text())
    config.pop("architectures", None)
    config.pop("quantization_config", None)
    count = config["num_hidden_layers"]
    per_layer = {k: v[:layers] for k, v in config.items() if isinstance(v, list) and len(v) == count}
    return {**config, **per_layer, "num_hidden_layers": layers, "tie_word_embeddings": False}


def qwen3_dflash(folder: Path, tgt: Path, seed: int = 1) -> Path:
    h = SHAPES["hidden_size"]
    config = {
        **_base_config(tgt),
        "architectures": ["DFlashDraftModel"],
        "block_size": 4,
        "dflash_config": {"target_layer_ids": DFLASH_LAYERS, "mask_token_id": 0},
    }
    shapes = {"fc.weight": (h, h * len(DFLASH_LAYERS)), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for n in range(DRAFT_LAYERS):
        shapes |= _layer(f"layers.{n}", gate=False)
        shapes |= {f"layers.{n}.self_attn.q_norm.weight": (SHAPES["head_dim"],)}
        shapes |= {f"layers.{n}.self_attn.k_norm.weight": (SHAPES["head_dim"],)}
    return _write(folder, config, shapes, seed)


def laguna_dflash(folder: Path, tgt: Path, seed: int = 1) -> Path:
    h = SHAPES["hidden_size"]
    base = _base_config(tgt)
    config = {
        **base,
        "architectures": ["DFlashLagunaForCausalLM"],
        "layer_types": ["full_attention"] * DRAFT_LAYERS,
        "mlp_layer_types": ["dense"] * DRAFT_LAYERS,
        "draft_vocab_size": base["vocab_size"],
        "block_size": 4,
        "dflash_config": {"target_layer_ids": DFLASH_LAYERS, "mask_token_id": 0},
    }
    shapes = {"fc.weight": (h, h * len(DFLASH_LAYERS)), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    shapes |= {f"aux_hidden_norms.{n}.weight": (h,) for n in range(len(DFLASH_LAYERS))}
    for n in range(DRAFT_LAYERS):
        layer = _layer(f"layers.{n}", gate=True)
        attn = f"layers.{n}.self_attn"
        rows = sum(layer.pop(f"{attn}.{p}_proj.weight")[0] for p in "qkv")
        shapes |= layer | {f"{attn}.qkv_proj.weight": (rows, h)}
        shapes |= {f"layers.{n}.self_attn.q_norm.weight": (SHAPES["head_dim"],)}
        shapes |= {f"layers.{n}.self_attn.k_norm.weight": (SHAPES["head_dim"],)}
    return _write(folder, config, shapes, seed)


def llama_eagle3(folder: Path, tgt: Path, seed: int = 1) -> Path:
    h = SHAPES["hidden_size"]
    base = _base_config(tgt, layers=1)
    config = {
        **base,
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": base["vocab_size"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": EAGLE3_LAYERS},
    }
    shapes = {
        "fc.weight": (h, h * len(EAGLE3_LAYERS)),
        "norm.weight": (h,),
        "lm_head.weight": (base["vocab_size"], h),
        **_layer("midlayer", gate=False),
        "midlayer.hidden_norm.weight": (h,),
    }
    # the midlayer's attention reads [embedding, hidden] concatenated: q/k/v take 2H inputs
    for proj in ("q_proj", "k_proj", "v_proj"):
        rows = shapes[f"midlayer.self_attn.{proj}.weight"][0]
        shapes[f"midlayer.self_attn.{proj}.weight"] = (rows, 2 * h)
    return _write(folder, config, shapes, seed)


#: family -> (target model_type and config over SHAPES, draft builder, method, preset)
PAIRS: dict[str, tuple[str, dict, Callable[[Path, Path], Path], str, str]] = {
    "qwen3": ("qwen3", {}, qwen3_dflash, "dflash", "dflash-draft"),
    "laguna": (
        "laguna",
        {"mlp_layer_types": ["dense"] * SHAPES["num_hidden_layers"], "num_experts": 8, "num_experts_per_tok": 2,
         "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
         "layer_types": ["full_attention"] * SHAPES["num_hidden_layers"]},
        laguna_dflash, "dflash", "dflash-draft",
    ),
    "llama": ("llama", {}, llama_eagle3, "eagle3", "eagle3-draft"),
}  # fmt: skip


def pair(folder: Path, family: str, tokenizer: Path) -> Pair:
    """The `family` target and its BF16 draft under `folder`."""
    model_type, config, build, method, preset = PAIRS[family]
    tgt = target(folder / f"{family}-target", model_type, tokenizer, **config)
    return Pair(family, tgt, build(folder / f"{family}-draft", tgt), method, preset)
