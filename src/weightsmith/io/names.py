"""Tensor and module names on disk: the contract with vLLM and compressed-tensors, in one place.

Everything that decides a tensor's role from its name lives here: the parameter suffixes each
format writes, the fused groups vLLM loads as one layer, the names under which vLLM finds a
KV-cache scale (`maybe_remap_kv_scale_name` in `model_loader/weight_utils.py`, and
compressed-tensors' `get_cache_scale`), module spellings a runtime skips silently for an
architecture (vLLM `laguna.py`, `qwen2_moe.py`, `deepseek_v2.py`: `if name not in params_dict:
continue`), and the categories used to account bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# --- parameter names (the last dotted component of a tensor name) ---
WEIGHT = "weight"
BIAS = "bias"
WEIGHT_PACKED = "weight_packed"  # compressed-tensors pack-quantized / nvfp4-pack-quantized
WEIGHT_SCALE = "weight_scale"  # compressed-tensors (all formats), ModelOpt, HF fp8 per-tensor
WEIGHT_SHAPE = "weight_shape"
WEIGHT_ZERO_POINT = "weight_zero_point"
WEIGHT_GLOBAL_SCALE = "weight_global_scale"  # compressed-tensors NVFP4 (a divisor)
INPUT_GLOBAL_SCALE = "input_global_scale"
WEIGHT_SCALE_INV = "weight_scale_inv"  # HF / DeepSeek fp8 block scales (a multiplier despite the name)
WEIGHT_SCALE_2 = "weight_scale_2"  # ModelOpt NVFP4 global scale
INPUT_SCALE = "input_scale"
OUTPUT_SCALE = "output_scale"
K_SCALE, V_SCALE, Q_SCALE, KV_SCALE = "k_scale", "v_scale", "q_scale", "kv_scale"

#: Parameters that carry quantization metadata rather than weights.
QUANT_PARAMS = frozenset(
    {
        WEIGHT_SCALE,
        WEIGHT_SHAPE,
        WEIGHT_ZERO_POINT,
        WEIGHT_GLOBAL_SCALE,
        INPUT_GLOBAL_SCALE,
        WEIGHT_SCALE_INV,
        WEIGHT_SCALE_2,
        INPUT_SCALE,
        OUTPUT_SCALE,
    }
)
KV_SCALES = frozenset({K_SCALE, V_SCALE, Q_SCALE, KV_SCALE})
#: Parameters that hold a weight or activation scale: every value finite and positive, or the
#: dequantized weights flip sign or vanish (`verify --scan-values`; KV-cache scales are the kv check's).
WEIGHT_SCALES = frozenset(
    {WEIGHT_SCALE, WEIGHT_GLOBAL_SCALE, INPUT_GLOBAL_SCALE, WEIGHT_SCALE_INV, WEIGHT_SCALE_2, INPUT_SCALE}
)
#: Parameters whose presence marks a module as stored quantized.
QUANTIZED_MARKERS = frozenset(
    {
        WEIGHT_PACKED,
        WEIGHT_SCALE,
        WEIGHT_SHAPE,
        WEIGHT_ZERO_POINT,
        WEIGHT_GLOBAL_SCALE,
        WEIGHT_SCALE_INV,
        WEIGHT_SCALE_2,
    }
)

# --- fused groups: vLLM loads these shards into one layer, so they must share a scheme ---
#: fused layer name -> its shards, as in vLLM's `packed_modules_mapping` (Llama and most others), in the
#: order vLLM stacks their rows (its `output_partition_sizes`), which its FP8 block check depends on.
FUSED_LAYERS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
#: Mixtral-style expert projections w1 (gate) and w3 (up) load into one `w13` weight.
FUSED_EXPERT_PAIRS: tuple[tuple[str, ...], ...] = (("w1", "w3"),)


def split(name: str) -> tuple[str, str]:
    """`model.layers.0.mlp.up_proj.weight` -> (`model.layers.0.mlp.up_proj`, `weight`)."""
    module, _, param = name.rpartition(".")
    return module, param


def leaf(module: str) -> str:
    """The last component of a module path."""
    return module.rpartition(".")[2]


#: Each shard's last component -> (its fused layer's, all its shards'), the first group naming it winning.
_FUSED_BY_SHARD: dict[str, tuple[str, tuple[str, ...]]] = {}
for _fused, _parts in (*FUSED_LAYERS.items(), *(("w13", p) for p in FUSED_EXPERT_PAIRS)):
    for _part in _parts:
        _FUSED_BY_SHARD.setdefault(_part, (_fused, _parts))


def fused_partners(module: str) -> tuple[str, tuple[str, ...]] | None:
    """For a shard of a fused layer, the fused layer's name and all its shards' module names."""
    parent, _, last = module.rpartition(".")
    found = _FUSED_BY_SHARD.get(last)
    if found is None:
        return None
    fused, parts = found
    prefix = f"{parent}." if parent else ""
    return prefix + fused, tuple(prefix + p for p in parts)


def linear_layer(module: str) -> tuple[str, tuple[str, ...]]:
    """The layer vLLM builds a Linear into and every shard's module name, in vLLM's row order.

    A shard of a fused layer gives the fused layer (`qkv_proj`: q, k, v); any other Linear is a
    layer of its own.
    """
    return fused_partners(module) or (module, (module,))


# --- KV-cache scales ---
#: Last component of the modules that make an attention layer's K (or fused QKV) projection.
ATTENTION_KEY_PROJECTIONS = frozenset({"k_proj", "qkv_proj", "query_key_value", "wqkv"})


def kv_scale_names(attention: str, kind: str) -> tuple[str, ...]:
    """Every tensor name vLLM accepts as the `kind` ("k" or "v") scale of one attention module.

    Order: the plain form, the ModelOpt form on the projection, the older compressed-tensors
    `output_scale` form, and the deprecated single `kv_scale` (vLLM copies it into both).
    """
    return (
        f"{attention}.{kind}_scale",
        f"{attention}.{kind}_proj.{kind}_scale",
        f"{attention}.{kind}_proj.{OUTPUT_SCALE}",
        f"{attention}.{KV_SCALE}",
    )


def kv_scale_name(attention: str, kind: str) -> str:
    """The name we write a `kind` ("k" or "v") KV-cache scale under: `<attention>.k_scale`.

    It is the one llm-compressor 0.14 writes (compressed-tensors `KVCacheScaleType`, a parameter of
    the attention module) and the first of `kv_scale_names`, which vLLM loads for compressed-tensors
    checkpoints.
    """
    return kv_scale_names(attention, kind)[0]


def is_kv_scale_name(name: str) -> bool:
    """True for a tensor that is a KV-cache scale under any accepted spelling."""
    module, param = split(name)
    if param in (K_SCALE, V_SCALE, KV_SCALE):
        return True
    return param == OUTPUT_SCALE and leaf(module) in ("k_proj", "v_proj")


# --- module names each runtime loads ---
@dataclass(frozen=True)
class NameRule:
    """A module spelling a runtime does not load for these architectures, and the one it does."""

    model_types: frozenset[str]
    runtime: str
    found: re.Pattern[str]
    expected: str
    consequence: str

    def rename(self, tensor: str) -> str:
        return self.found.sub(self.expected, tensor, count=1)


_SKIPPED = "it skips names it does not know, so those weights are never loaded and nothing warns"

RUNTIME_NAME_RULES: tuple[NameRule, ...] = (
    NameRule(
        frozenset({"laguna", "qwen2_moe", "qwen3_moe"}),
        "vLLM",
        re.compile(r"\.mlp\.(shared_experts|shared_mlp)\."),
        ".mlp.shared_expert.",
        f"vLLM loads the shared expert as mlp.shared_expert (singular); {_SKIPPED}",
    ),
    NameRule(
        frozenset({"deepseek_v2", "deepseek_v3"}),
        "vLLM",
        re.compile(r"\.mlp\.(shared_expert|shared_mlp)\."),
        ".mlp.shared_experts.",
        f"vLLM loads the shared experts as mlp.shared_experts (plural); {_SKIPPED}",
    ),
)


def model_type(config: dict[str, Any] | None) -> str | None:
    """The architecture key `RUNTIME_NAME_RULES` match: `model_type`, or one derived from `architectures`."""
    if not config:
        return None
    declared = config.get("model_type")
    if isinstance(declared, str):
        return declared
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        stem = re.sub(r"(ForCausalLM|ForConditionalGeneration|Model)$", "", arch[0])
        return re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()
    return None


# --- roles ---
_EMBEDDING = re.compile(
    r"(^|\.)(embed_tokens|wte|wpe|word_embeddings|position_embeddings|embeddings|tok_embeddings|embed)$"
)
_LM_HEAD = re.compile(r"(^|\.)(lm_head|output|embed_out)$")
_NORM = re.compile(r"(norm|ln_\d*|ln|layernorm)[^.]*$", re.IGNORECASE)
_ROUTER = re.compile(
    r"(^|\.)(mlp|block_sparse_moe|moe|feed_forward)\.(gate|router)$|(^|\.)(router|shared_expert_gate)$"
)
_EXPERT = re.compile(r"\.experts\.(\d+\.)?")
_SHARED_EXPERT = re.compile(r"\.(shared_expert|shared_experts|shared_mlp)(\.|$)")
_ATTN_GATE = re.compile(r"\.(self_attn|attn|attention)\.g_proj$")
_ATTENTION = re.compile(r"\.(self_attn|attn|attention|self_attention)\.")
_MLP = re.compile(r"\.(mlp|feed_forward|ffn)\.")


def expert_layer(module: str) -> str | None:
    """The MoE layer a routed expert's projection belongs to (`...mlp.experts`), or None.

    vLLM builds all experts of that layer, every projection, as one FusedMoE layer.
    """
    if _SHARED_EXPERT.search(module):
        return None
    match = _EXPERT.search(module + ".")
    return module[: match.start()] + ".experts" if match else None


#: The decoder layer a module sits in: `layers.N` in most checkpoints, `midlayer` in an EAGLE3 draft,
#: which vLLM loads as `model.layers.{target's layer count}` (`llama_eagle3.py`, `load_weights`).
_LAYER_PREFIX = re.compile(r"^(?:.*\.)?(?:layers\.\d+|midlayer)\.")


def within_layer(module: str) -> str:
    """A module's name inside its decoder layer (`self_attn.q_proj`), or the whole name outside any layer."""
    return _LAYER_PREFIX.sub("", module, count=1)


_SUFFIX_ENTRY = "re:(.*\\.)?"


def suffix_entry(module: str) -> str:
    r"""A `re:` ignore entry matching `module` under any prefix: `midlayer.mlp.down_proj` on disk and
    `model.layers.32.mlp.down_proj` as vLLM builds it both match `re:(.*\.)?mlp\.down_proj$`."""
    return f"{_SUFFIX_ENTRY}{re.escape(within_layer(module))}$"


def is_suffix_entry(entry: str) -> bool:
    """True for an entry of `suffix_entry`'s form."""
    return entry.startswith(_SUFFIX_ENTRY) and entry.endswith("$")


def is_embedding(module: str) -> bool:
    return bool(_EMBEDDING.search(module))


def is_lm_head(module: str) -> bool:
    return bool(_LM_HEAD.search(module))


def is_norm(module: str) -> bool:
    return bool(_NORM.search(leaf(module)))


def is_router(module: str) -> bool:
    return bool(_ROUTER.search(module))


def is_routed_expert(module: str) -> bool:
    """A routed expert's projection: vLLM builds these into one FusedMoE per layer, not into Linears."""
    return not _SHARED_EXPERT.search(module) and bool(_EXPERT.search(module + "."))


ROUTED_EXPERTS, KV_SCALES_CATEGORY, QUANT_PARAMS_CATEGORY = "routed experts", "kv scales", "quantization params"
SHARED_EXPERT = "shared expert"
CATEGORIES = (
    ROUTED_EXPERTS,
    SHARED_EXPERT,
    "attention",
    "attention gate",
    "dense mlp",
    "router",
    "embeddings",
    "lm_head",
    "norms",
    KV_SCALES_CATEGORY,
    QUANT_PARAMS_CATEGORY,
    "other",
)


def category(name: str) -> str:
    """The byte-accounting category of a tensor, from its name alone."""
    module, param = split(name)
    if param in KV_SCALES or is_kv_scale_name(name):
        return KV_SCALES_CATEGORY
    if param in QUANT_PARAMS:
        return QUANT_PARAMS_CATEGORY
    if is_norm(module):
        return "norms"
    if is_embedding(module):
        return "embeddings"
    if is_lm_head(module):
        return "lm_head"
    if is_router(module) or "e_score_correction_bias" in param:
        return "router"
    if _SHARED_EXPERT.search(module):
        return SHARED_EXPERT
    if is_routed_expert(module):
        return ROUTED_EXPERTS
    if _ATTN_GATE.search(module):
        return "attention gate"
    if _ATTENTION.search(module + "."):
        return "attention"
    if _MLP.search(module + "."):
        return "dense mlp"
    return "other"
