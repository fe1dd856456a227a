"""Helpers for the eval tests: a tiny causal LM config, quantizing, and reading checkpoints back."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

from synth import LLAMA_CONFIG
from weightsmith import api
from weightsmith.formats import compressed_tensors as ct
from weightsmith.quant import fp8

#: A Llama small enough to run in well under a second, with SmolLM2's real tokenizer and vocabulary.
TINY_LM_CONFIG = dict(
    LLAMA_CONFIG,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    vocab_size=49152,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of every `*.safetensors` file in FOLDER, by name, as numpy arrays."""
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def write_fp8(folder: Path, tensors: dict[str, np.ndarray], config: dict, style: str) -> dict[str, np.ndarray]:
    """An FP8 checkpoint of every `*_proj` weight, in one of the two styles `quantize` decodes.

    "hf-fp8": HF/DeepSeek `quant_method: fp8`, 128x128 block scales in `weight_scale_inv`.
    "ct-fp8": compressed-tensors `float-quantized`, one scale per output channel in `weight_scale`.
    Returns each such weight as the quantizer decodes it (BF16), the reference eval measures against.
    """
    stored: dict[str, np.ndarray] = {}
    decoded: dict[str, np.ndarray] = {}
    for name, w in tensors.items():
        if not name.endswith("_proj.weight"):
            stored[name] = w
            continue
        if style == "hf-fp8":
            q, scale = fp8.quantize_blocks(w)
            stored[name], stored[name + "_scale_inv"] = q, scale
        else:
            amax = np.abs(w.astype(np.float32)).max(axis=1, keepdims=True)
            scale = np.where(amax == 0, 1.0, amax / 448.0).astype(np.float32)
            q = (w.astype(np.float32) / scale).astype(ml_dtypes.float8_e4m3fn)
            stored[name], stored[name.replace(".weight", ".weight_scale")] = q, scale
        decoded[name] = fp8.dequantize_rows(q, scale, 0)
    folder.mkdir(parents=True)
    save_file(stored, str(folder / "model.safetensors"))
    if style == "hf-fp8":
        qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    else:
        args = dict(ct.weight_args(8, True, None, type_="float"), strategy="channel", zp_dtype=None)
        qc = ct.quantization_config("FP8", ct.FLOAT_QUANTIZED, args, ["lm_head"])
    (folder / "config.json").write_text(json.dumps(dict(config, quantization_config=qc)))
    return decoded


def quantize(
    src: Path,
    out: Path,
    *,
    scheme: str = "w4a16",
    group: int | None = 64,
    ignore: tuple[str, ...] = (),
    scale_search: str | None = "none",
) -> Path:
    """Quantize with the project's own command path and return the output folder (plain
    round-to-nearest unless `scale_search` names a search: the eval tests measure against it)."""
    api.quantize(
        api.QuantizeRequest(
            src,
            out,
            scheme=scheme,
            group_size=group,
            ignore=list(ignore),
            workers=2,
            hash_sources=False,
            scale_search=scale_search,
            pre_pass=None,
        )
    )
    return out
