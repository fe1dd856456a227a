"""MX schemes: byte identity with llm-compressor's `model_free_ptq` on CPU, from BF16 and FP8 sources."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.io.checkpoint import Checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")

IGNORE = ["lm_head", "model.embed_tokens"]
#: Our name -> compressed-tensors' preset and format.
SCHEMES = {
    "mxfp4a16": ("MXFP4A16", "mxfp4-pack-quantized"),
    "mxfp4": ("MXFP4", "mxfp4-pack-quantized"),
    "mxfp8a16": ("MXFP8A16", "mxfp8-quantized"),
    "mxfp8": ("MXFP8", "mxfp8-quantized"),
}


def awkward_tensors() -> dict[str, np.ndarray]:
    """The synthetic Llama with groups that reach every branch of the scale and the rounding.

    All zeros, -0.0, ties between FP4 and FP8 codes, amax either side of 1.75 * 2**k (where the
    power of two rounds up), BF16 subnormals, and magnitudes whose scale is infinite.
    """
    t = llama_tensors()
    name = "model.layers.0.self_attn.q_proj.weight"
    w = t[name].astype(np.float32)
    rng = np.random.default_rng(7)
    w[0] = 0
    w[1] = -0.0
    w[2] = rng.integers(-24, 25, w.shape[1]) * 0.0625  # FP4 and FP8 ties
    w[3, :32] = 1.75 * 2.0**-3
    w[3, 32:64] = np.float32(1.7421875 * 2.0**-3)
    w[4] *= 1e-37  # subnormal and near-subnormal groups
    w[5] = rng.uniform(-3.3e38, 3.3e38, w.shape[1])  # amax >= 1.75 * 2**127: an infinite scale
    w[6, ::2] = -1e-9  # tiny negatives next to a large value: -0 codes
    w[7] = rng.standard_normal(w.shape[1]) * 1e30
    w[5, 0] = 3.3e38
    t[name] = w.astype(ml_dtypes.bfloat16)
    return t


def _ours(src: Path, out: Path, scheme: str) -> Checkpoint:
    quantize(QuantizeRequest(src, out, scheme=scheme, ignore=IGNORE, workers=2, pre_pass=None))
    return Checkpoint.open(out)


def _load(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("shards", [1, 3])
def test_byte_identical_to_model_free_ptq(tmp_path: Path, scheme: str, shards: int) -> None:
    from compressed_tensors.quantization import QuantizationConfig
    from llmcompressor import model_free_ptq

    preset, fmt = SCHEMES[scheme]
    src = write_checkpoint(tmp_path / "src", awkward_tensors(), shards=shards)
    model_free_ptq(str(src), str(tmp_path / "ref"), scheme=preset, ignore=IGNORE, device="cpu")
    ours = _ours(src, tmp_path / "ours", scheme)

    ref = Checkpoint.open(tmp_path / "ref")
    assert set(ours.tensors) == set(ref.tensors)
    for shard in ref.headers:
        # Whole shard files are identical: header, tensor order and every tensor byte.
        assert (tmp_path / "ours" / shard).read_bytes() == (tmp_path / "ref" / shard).read_bytes(), shard

    ref_qc = json.loads((tmp_path / "ref" / "config.json").read_text())["quantization_config"]
    our_qc = ours.config["quantization_config"]
    ref_group, our_group = ref_qc["config_groups"][preset], our_qc["config_groups"][preset]
    for key in ("weights", "input_activations", "format", "targets"):
        assert our_group[key] == ref_group[key], key
    assert our_qc["format"] == ref_qc["format"] == fmt
    parsed = QuantizationConfig.model_validate(our_qc)
    assert parsed.format == fmt and (parsed.config_groups[preset].input_activations is None) == scheme.endswith("a16")
    if shards > 1:
        ref_index = json.loads((tmp_path / "ref" / "model.safetensors.index.json").read_text())
        our_index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
        assert our_index["weight_map"] == ref_index["weight_map"]


@pytest.mark.parametrize("scheme", ["mxfp4a16", "mxfp8a16"])
def test_fp8_source_matches_model_free_ptq_after_its_dequantizer(tmp_path: Path, scheme: str) -> None:
    """An FP8 block checkpoint: llm-compressor dequantizes it with its own converter first, as we decode it."""
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import model_free_ptq

    bf16 = write_checkpoint(tmp_path / "bf16", llama_tensors(), shards=2)
    fp8_dir = tmp_path / "fp8"
    args = QuantizationArgs(num_bits=8, type="float", strategy="block", symmetric=True, block_structure=[128, 128])
    fp8_scheme = QuantizationScheme(targets=["Linear"], weights=args)
    model_free_ptq(str(bf16), str(fp8_dir), scheme=fp8_scheme, ignore=IGNORE, device="cpu")

    ref = tmp_path / "ref"
    converter = CompressedTensorsDequantizer(str(fp8_dir), ignore=["re:.*norm$"])
    model_free_ptq(str(fp8_dir), str(ref), scheme=SCHEMES[scheme][0], ignore=IGNORE, device="cpu", converter=converter)
    ours = _ours(fp8_dir, tmp_path / "ours", scheme)
    ta, tb = _load(ref), _load(tmp_path / "ours")
    assert set(ta) == set(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert torch.equal(ta[k].view(torch.uint8), tb[k].view(torch.uint8)), k
    assert ours.config["quantization_config"]["format"] == SCHEMES[scheme][1]
