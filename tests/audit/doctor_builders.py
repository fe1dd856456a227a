"""Small quantized MoE checkpoints for the doctor's tests, and ways to break them.

`tiny_moe` returns an in-memory model (tensors, config, shard assignment) shaped like Laguna:
BF16 attention with a per-head gate and FP8 KV-cache scales, a dense first layer, routed experts
and one shared expert, NVFP4 (compressed-tensors `nvfp4-pack-quantized`) or int4
(`pack-quantized`) MLPs. `write` puts it on disk with our own shard writer, so tests can change the
model before writing or the files after.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from weightsmith.safetensors.dtypes import from_numpy
from weightsmith.safetensors.writer import ShardWriter, TensorSpec

INDEX = "model.safetensors.index.json"

NVFP4_WEIGHTS = {
    "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
    "dynamic": False, "scale_dtype": "torch.float8_e4m3fn",
}  # fmt: skip
INT4_WEIGHTS = {
    "num_bits": 4,
    "type": "int",
    "strategy": "group",
    "group_size": 16,
    "symmetric": True,
    "dynamic": False,
}
FP8_KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


@dataclass
class Model:
    """A checkpoint before it is written: tensors by name, config, and which shard holds what."""

    tensors: dict[str, np.ndarray]
    config: dict
    shard_of: Callable[[str], str]
    metadata: dict[str, str] = field(default_factory=lambda: {"format": "pt"})
    #: Other JSON files of the folder (e.g. ModelOpt's hf_quant_config.json).
    files: dict[str, dict] = field(default_factory=dict)

    def copy(self) -> Model:
        return Model(
            dict(self.tensors),
            copy.deepcopy(self.config),
            self.shard_of,
            dict(self.metadata),
            copy.deepcopy(self.files),
        )

    @property
    def qc(self) -> dict:
        return self.config["quantization_config"]


def by_layer(name: str) -> str:
    """One shard per decoder layer, one for everything outside the layers."""
    if name.startswith("model.layers."):
        return f"model-layer{int(name.split('.')[2]):02d}.safetensors"
    return "model-outer.safetensors"


def single(name: str) -> str:
    return "model.safetensors"


def halves(name: str) -> str:
    """A different layout: two shards split by name order rather than by layer."""
    return (
        "model-00001-of-00002.safetensors"
        if name < "model.layers.1.mlp.experts.2"
        else "model-00002-of-00002.safetensors"
    )


def tiny_moe(
    fmt: str = "nvfp4",
    layers: int = 3,
    experts: int = 4,
    hidden: int = 64,
    moe_intermediate: int = 32,
    dense_intermediate: int = 96,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    vocab: int = 128,
    kv_scales: bool = True,
    seed: int = 0,
    shard_of: Callable[[str], str] = by_layer,
) -> Model:
    rng = np.random.default_rng(seed)

    def dense(shape: tuple[int, ...]) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16)

    def quantized(module: str, out: int, inp: int, global_scale: float) -> dict[str, np.ndarray]:
        if fmt == "nvfp4":
            return {
                f"{module}.weight_packed": rng.integers(0, 256, (out, inp // 2), dtype=np.uint8),
                f"{module}.weight_scale": rng.uniform(0.5, 4.0, (out, inp // 16)).astype(ml_dtypes.float8_e4m3fn),
                f"{module}.weight_global_scale": np.array([global_scale], dtype=np.float32),
            }
        return {
            f"{module}.weight_packed": rng.integers(-(2**31), 2**31 - 1, (out, inp // 8), dtype=np.int32),
            f"{module}.weight_scale": rng.uniform(0.001, 0.01, (out, inp // 16)).astype(ml_dtypes.bfloat16),
            f"{module}.weight_shape": np.array([out, inp], dtype=np.int64),
        }

    def mlp(prefix: str, intermediate: int) -> dict[str, np.ndarray]:
        gs = float(rng.uniform(100, 1000))  # gate and up share one global scale, as vLLM requires
        return {
            **quantized(f"{prefix}.gate_proj", intermediate, hidden, gs),
            **quantized(f"{prefix}.up_proj", intermediate, hidden, gs),
            **quantized(f"{prefix}.down_proj", hidden, intermediate, float(rng.uniform(100, 1000))),
        }

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": dense((vocab, hidden))}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = np.ones(hidden, ml_dtypes.bfloat16)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(hidden, ml_dtypes.bfloat16)
        t[f"{p}.self_attn.q_proj.weight"] = dense((heads * head_dim, hidden))
        t[f"{p}.self_attn.k_proj.weight"] = dense((kv_heads * head_dim, hidden))
        t[f"{p}.self_attn.v_proj.weight"] = dense((kv_heads * head_dim, hidden))
        t[f"{p}.self_attn.o_proj.weight"] = dense((hidden, heads * head_dim))
        t[f"{p}.self_attn.g_proj.weight"] = dense((heads, hidden))
        t[f"{p}.self_attn.q_norm.weight"] = np.ones(head_dim, ml_dtypes.bfloat16)
        t[f"{p}.self_attn.k_norm.weight"] = np.ones(head_dim, ml_dtypes.bfloat16)
        if kv_scales:
            t[f"{p}.self_attn.k_scale"] = np.array(rng.uniform(0.01, 0.1), dtype=np.float32)
            t[f"{p}.self_attn.v_scale"] = np.array(rng.uniform(0.01, 0.1), dtype=np.float32)
        if i == 0:
            t.update(mlp(f"{p}.mlp", dense_intermediate))
            continue
        t[f"{p}.mlp.gate.weight"] = dense((experts, hidden))
        t[f"{p}.mlp.experts.e_score_correction_bias"] = rng.standard_normal(experts).astype(np.float32)
        t.update(mlp(f"{p}.mlp.shared_expert", moe_intermediate))
        for e in range(experts):
            t.update(mlp(f"{p}.mlp.experts.{e}", moe_intermediate))
    t["model.norm.weight"] = np.ones(hidden, ml_dtypes.bfloat16)
    t["lm_head.weight"] = dense((vocab, hidden))

    group_format = "nvfp4-pack-quantized" if fmt == "nvfp4" else "pack-quantized"
    config = {
        "architectures": ["LagunaForCausalLM"],
        "model_type": "laguna",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_experts": experts,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": group_format,
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": dict(NVFP4_WEIGHTS if fmt == "nvfp4" else INT4_WEIGHTS),
                    "input_activations": None,
                    "output_activations": None,
                    "format": group_format,
                }
            },
            "ignore": ["lm_head", "re:.*self_attn\\..*", "re:.*mlp\\.gate$"],
            "kv_cache_scheme": dict(FP8_KV) if kv_scales else None,
        },
    }
    return Model(t, config, shard_of)


def write(model: Model, root: Path, index: bool = True) -> Path:
    """Write the model as a checkpoint folder; the index is left out when `index` is False."""
    root.mkdir(parents=True, exist_ok=True)
    shards: dict[str, list[str]] = {}
    for name in model.tensors:
        shards.setdefault(model.shard_of(name), []).append(name)
    weight_map, total = {}, 0
    for shard, tensor_names in shards.items():
        write_shard(root / shard, {n: model.tensors[n] for n in tensor_names}, model.metadata)
        for n in tensor_names:
            weight_map[n] = shard
            total += model.tensors[n].nbytes
    if index:
        doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (root / INDEX).write_text(json.dumps(doc, indent=2))
    (root / "config.json").write_text(json.dumps(model.config, indent=2))
    for file, doc in model.files.items():
        (root / file).write_text(json.dumps(doc, indent=2))
    return root


def tiny_fp8(style: str = "ct", layers: int = 2, hidden: int = 64, intermediate: int = 192) -> Model:
    """A small Llama-shaped FP8 checkpoint: compressed-tensors `float-quantized` per-channel, or HF block fp8."""
    rng = np.random.default_rng(0)
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": np.ones((32, hidden), ml_dtypes.bfloat16)}

    def fp8(module: str, out: int, inp: int) -> None:
        t[f"{module}.weight"] = rng.uniform(-1, 1, (out, inp)).astype(ml_dtypes.float8_e4m3fn)
        if style == "ct":
            t[f"{module}.weight_scale"] = np.full((out, 1), 0.01, ml_dtypes.bfloat16)
        else:
            t[f"{module}.weight_scale_inv"] = np.full((-(-out // 128), -(-inp // 128)), 0.01, np.float32)

    for i in range(layers):
        p = f"model.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            fp8(f"{p}.self_attn.{proj}", hidden, hidden)
        fp8(f"{p}.mlp.gate_proj", intermediate, hidden)
        fp8(f"{p}.mlp.up_proj", intermediate, hidden)
        fp8(f"{p}.mlp.down_proj", hidden, intermediate)
        t[f"{p}.input_layernorm.weight"] = np.ones(hidden, ml_dtypes.bfloat16)
    t["lm_head.weight"] = np.ones((32, hidden), ml_dtypes.bfloat16)
    if style == "ct":
        weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
        qc = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
            "ignore": ["lm_head"],
            "kv_cache_scheme": None,
        }
    else:
        qc = {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["lm_head"],
        }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": layers,
        "quantization_config": qc,
    }
    return Model(t, config, by_layer)


def tiny_modelopt(
    layers: int = 2, hidden: int = 64, intermediate: int = 128, kv_scales: bool = True, seed: int = 0
) -> Model:
    """A small Llama-shaped ModelOpt NVFP4 export: MLPs quantized, attention excluded, FP8 KV cache."""
    rng = np.random.default_rng(seed)

    def nvfp4(module: str, out: int, inp: int) -> dict[str, np.ndarray]:
        return {
            f"{module}.weight": rng.integers(0, 256, (out, inp // 2), dtype=np.uint8),
            f"{module}.weight_scale": rng.uniform(0.5, 4.0, (out, inp // 16)).astype(ml_dtypes.float8_e4m3fn),
            f"{module}.weight_scale_2": np.array(0.001, dtype=np.float32),
            f"{module}.input_scale": np.array(0.01, dtype=np.float32),
        }

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": np.ones((32, hidden), ml_dtypes.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[f"{p}.self_attn.{proj}.weight"] = np.full((hidden, hidden), 0.01, ml_dtypes.bfloat16)
        if kv_scales:
            t[f"{p}.self_attn.k_proj.k_scale"] = np.array(0.05, dtype=np.float32)
            t[f"{p}.self_attn.v_proj.v_scale"] = np.array(0.04, dtype=np.float32)
        t.update(nvfp4(f"{p}.mlp.gate_proj", intermediate, hidden))
        t.update(nvfp4(f"{p}.mlp.up_proj", intermediate, hidden))
        t.update(nvfp4(f"{p}.mlp.down_proj", hidden, intermediate))
        t[f"{p}.input_layernorm.weight"] = np.ones(hidden, ml_dtypes.bfloat16)
    t["lm_head.weight"] = np.ones((32, hidden), ml_dtypes.bfloat16)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
    }
    hf_quant = {
        "producer": {"name": "modelopt", "version": "0.41.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": "FP8" if kv_scales else None,
            "group_size": 16,
            "exclude_modules": ["lm_head", "model.layers.*.self_attn*"],
        },
    }
    return Model(t, config, by_layer, files={"hf_quant_config.json": hf_quant})


def write_shard(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    specs = [TensorSpec(n, from_numpy(a.dtype).code, a.shape) for n, a in tensors.items()]
    with ShardWriter(path.parent, path.name, specs, metadata) as writer:
        for n, a in tensors.items():
            writer.write(n, a)
    return path


def raw_shard(path: Path, header: bytes | str, data: bytes = b"") -> Path:
    """A file with exactly this header text (length prefix added) and data: for malformed headers."""
    text = header.encode() if isinstance(header, str) else header
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def read_index(root: Path) -> dict:
    return json.loads((root / INDEX).read_text())


def write_index(root: Path, doc: dict) -> None:
    (root / INDEX).write_text(json.dumps(doc, indent=2))


def cli(args: list[str]) -> int:
    """Run `weightsmith ARGS` in this process; its exit status."""
    from weightsmith.cli import main

    old = sys.argv
    sys.argv = ["weightsmith", *args]
    try:
        main()
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = old


def lfs_pointer(size: int = 4_976_698_592) -> bytes:
    return (
        b"version https://git-lfs.github.com/spec/v1\n"
        b"oid sha256:" + b"a3" * 32 + b"\n"
        b"size " + str(size).encode() + b"\n"
    )
