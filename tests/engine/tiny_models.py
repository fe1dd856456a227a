"""Tiny causal LMs of several families, built from a config with random weights and saved as
safetensors, and the reference the engine must equal: the whole model run by transformers with
the same recorders."""

from __future__ import annotations

from pathlib import Path

#: Small shapes shared by every family (overridden per family below).
COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
FAMILIES: dict[str, dict] = {
    "qwen2": {},
    "qwen3": {},
    "mistral": {"sliding_window": 8},
    "gemma3_text": {
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "tie_word_embeddings": True,
    },
    # 4 experts: few enough that every one is routed to by the stats tests' few tokens
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    },
}
#: MoE families as the served model is built: layer 0 dense (Laguna's default), then 8 experts with
#: top-2 routing and a shared expert (where the family has one); Mixtral's experts are all its MLPs.
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
MOE_FAMILIES: dict[str, dict] = {
    "qwen2_moe": {**MOE, "shared_expert_intermediate_size": 64, "mlp_only_layers": [0]},
    "qwen3_moe": {**MOE, "mlp_only_layers": [0]},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "laguna": {**MOE, "shared_expert_intermediate_size": 64},
    # multi-head latent attention (no grouped KV heads: as many as query heads), sigmoid scores over 2
    # groups of 4 experts, one shared expert as wide as an expert, layer 0 dense
    "deepseek_v3": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "topk_method": "noaux_tc",
        "n_group": 2,
        "topk_group": 1,
        "num_key_value_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 16,
    },
}


#: vLLM CPU serves attention at these head sizes (not 16); 1024 positions for its --max-model-len.
SERVABLE = dict(hidden_size=128, head_dim=32, max_position_embeddings=1024)
#: The final norm's weights times this (`sharpen`): random weights give next-token distributions nearly
#: flat (top tokens 0.05 nats apart), where any served token would pass and BF16 batching can settle a
#: near-tie either way; sharpened, a wrong weight parts at once.
SHARPEN = 10.0


def sharpen(folder: Path, bf16: bool = False) -> Path:
    """The saved model's final norm times SHARPEN, in place (every tensor cast to BF16 if `bf16`)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * SHARPEN
    if bf16:
        tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


#: The served model's layout (docs/moe.md) as a recipe: W4A4 (NVFP4) experts, static FP8 attention and
#: shared expert (activation scales from `calibrate --all-experts`), with `--kv-cache fp8` beside it.
SEED3 = """\
[[rule]]
targets = ["category:routed experts"]
scheme = "nvfp4"

[[rule]]
targets = ["category:attention", "category:shared expert"]
scheme = "fp8"
"""


def moe_shapes(family: str, **sizes: int) -> dict:
    """`MOE_FAMILIES[family]` with `sizes` over it: `moe_intermediate_size` is the experts' size (Mixtral's
    `intermediate_size`), and a `shared_expert_intermediate_size` is dropped for a family without one."""
    shapes = {**MOE_FAMILIES[family], **sizes}
    if "shared_expert_intermediate_size" not in MOE_FAMILIES[family]:
        shapes.pop("shared_expert_intermediate_size", None)
    if family == "mixtral" and "moe_intermediate_size" in shapes:
        shapes["intermediate_size"] = shapes.pop("moe_intermediate_size")
    return shapes


def save_tiny(
    folder: Path, model_type: str, seed: int = 0, tokenizer: Path | None = None, shapes: dict | None = None
) -> Path:
    """A `model_type` causal LM with random weights, saved by transformers into `folder`: `shapes` (its
    `FAMILIES` entry unless given) over `COMMON`, with the tokenizer files of the checkpoint `tokenizer`,
    and its vocabulary size, when given."""
    import json
    import shutil

    import torch
    import transformers

    shapes = {**COMMON, **(FAMILIES[model_type] if shapes is None else shapes)}
    if tokenizer is not None:
        shapes["vocab_size"] = json.loads((tokenizer / "config.json").read_text())["vocab_size"]
    config = transformers.AutoConfig.for_model(model_type, **shapes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():  # larger than the init so activations differ layer to layer
            param.normal_(0, 0.2)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json") if tokenizer is not None else ():
        shutil.copy(tokenizer / name, folder / name)
    return folder


def reference_stats(
    folder: Path, sequences: list[list[int]]
) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """What `measure` must give, from the whole model loaded by transformers and run in one piece."""
    import torch
    import transformers

    from weightsmith.calibration import recorders

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    inputs: dict[str, float] = {}
    cache = recorders.kv_cache(model.config)
    hooks = [
        module.register_forward_pre_hook(_experts_reference(name, inputs))
        for name, module in model.named_modules()
        if isinstance(getattr(module, "gate_up_proj", None), torch.nn.Parameter)
    ]
    with torch.no_grad(), recorders.input_maxima(linears(model), inputs):
        for ids in sequences:
            model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    for hook in hooks:
        hook.remove()
    names = [n for n, m in model.named_modules() if isinstance(getattr(m, "layer_idx", None), int)]
    kv = {}
    for name in names:
        index = model.get_submodule(name).layer_idx
        if index in cache.maxima and name.count(".") == 3:  # model.layers.N.<attention>
            kv.setdefault(name, cache.maxima[index])
    inputs = {k.lstrip("."): v for k, v in inputs.items() if k.lstrip(".") != "lm_head"}
    return kv, recorders.share_fused(inputs)


def linears(module, prefix: str = "") -> dict:
    """Every Linear under `module`, named as `prefix.path`."""
    import torch

    return {
        f"{prefix}.{name}" if prefix else name: sub
        for name, sub in module.named_modules()
        if isinstance(sub, torch.nn.Linear)
    }


def _experts_reference(path: str, into: dict[str, float]):
    """A pre-hook computing each expert's inputs from the routing, as Qwen2-MoE's experts compute them:
    gate/up read the tokens routed to the expert, down reads act(gate) * up of those tokens."""

    def hook(module, args) -> None:
        hidden, top_k_index = args[0], args[1]
        gate_up, down = module.gate_up_proj, module.down_proj
        for e in range(gate_up.shape[0]):
            x = hidden[(top_k_index == e).any(-1)]
            if not len(x):
                continue
            gate, up = (x @ gate_up[e].T).chunk(2, dim=-1)
            h = module.act_fn(gate) * up
            for name, value in (("gate_proj", x), ("up_proj", x), ("down_proj", h)):
                key = f"{path}.{e}.{name}"
                into[key] = max(into.get(key, 0.0), float(value.abs().max()))
        assert down.shape[0] == gate_up.shape[0]

    return hook
