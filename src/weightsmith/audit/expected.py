"""What runtimes expect to find on disk, beyond what the quantizer writes: the doctor's rule book.

Three tables, each with its source:
- the tensors a ModelOpt export carries per quantized Linear (vLLM `modelopt.py`,
  `ModelOptNvFp4LinearMethod` / `ModelOptFp8LinearMethod` `create_weights`) and those of a
  compressed-tensors `float-quantized` FP8 module (`compressors/naive_quantized`);
- the names under which vLLM finds a KV-cache scale (`maybe_remap_kv_scale_name` in
  `model_loader/weight_utils.py`, and compressed-tensors' `get_cache_scale`);
- module names a runtime loads for an architecture, where a different spelling is skipped silently
  (vLLM `laguna.py`, `qwen2_moe.py`, `deepseek_v2.py`: `if name not in params_dict: continue`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from weightsmith import names

# --- ModelOpt (hf_quant_config.json `quant_algo`) ---
MODELOPT_NVFP4, MODELOPT_FP8 = "NVFP4", "FP8"
#: quant_algo -> parameter -> safetensors dtype of each quantized Linear.
MODELOPT_PARAMS: dict[str, dict[str, str | None]] = {
    MODELOPT_NVFP4: {
        names.WEIGHT: "U8",  # two FP4 E2M1 codes per byte along the input dim
        names.WEIGHT_SCALE: "F8_E4M3",  # one per 16 inputs
        names.WEIGHT_SCALE_2: "F32",
        names.INPUT_SCALE: "F32",
    },
    MODELOPT_FP8: {names.WEIGHT: "F8_E4M3", names.WEIGHT_SCALE: "F32", names.INPUT_SCALE: "F32"},
}
MODELOPT_NVFP4_GROUP = 16
#: vLLM refuses an NVFP4 hf_quant_config.json that lacks any of these keys (value may be null).
MODELOPT_NVFP4_REQUIRED_KEYS = ("group_size", "kv_cache_quant_algo", "exclude_modules")

# --- compressed-tensors float-quantized (FP8) and naive-quantized (int8) weights ---
#: The scale keeps the original weight's float dtype (None: any dense float).
EIGHT_BIT_PARAMS: dict[str, dict[str, str | None]] = {
    "float": {names.WEIGHT: "F8_E4M3", names.WEIGHT_SCALE: None},
    "int": {names.WEIGHT: "I8", names.WEIGHT_SCALE: None},
}

#: Parameters whose presence marks a module as stored quantized.
QUANTIZED_MARKERS = frozenset(
    {
        names.WEIGHT_PACKED,
        names.WEIGHT_SCALE,
        names.WEIGHT_SHAPE,
        names.WEIGHT_ZERO_POINT,
        names.WEIGHT_GLOBAL_SCALE,
        names.WEIGHT_SCALE_INV,
        names.WEIGHT_SCALE_2,
    }
)

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
        f"{attention}.{kind}_proj.{names.OUTPUT_SCALE}",
        f"{attention}.{names.KV_SCALE}",
    )


def is_kv_scale_name(name: str) -> bool:
    """True for a tensor that is a KV-cache scale under any accepted spelling."""
    module, param = names.split(name)
    if param in (names.K_SCALE, names.V_SCALE, names.KV_SCALE):
        return True
    return param == names.OUTPUT_SCALE and names.leaf(module) in ("k_proj", "v_proj")


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


def model_type(config: dict | None) -> str | None:
    """The architecture key used by the rules: `model_type`, or one derived from `architectures`."""
    if not config:
        return None
    if isinstance(config.get("model_type"), str):
        return config["model_type"]
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        stem = re.sub(r"(ForCausalLM|ForConditionalGeneration|Model)$", "", arch[0])
        return re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()
    return None
