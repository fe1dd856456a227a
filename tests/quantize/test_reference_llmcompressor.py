"""Byte identity with llm-compressor's `model_free_ptq` on CPU, the reference W4A16 writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.io.checkpoint import Checkpoint

llmcompressor = pytest.importorskip("llmcompressor")

IGNORE = ["lm_head", "model.embed_tokens"]


def _reference(src: Path, out: Path, scheme: str) -> None:
    from llmcompressor import model_free_ptq

    model_free_ptq(str(src), str(out), scheme=scheme, ignore=IGNORE, device="cpu")


@pytest.mark.parametrize("scheme,ref_scheme", [("w4a16", "W4A16"), ("w4a16-asym", "W4A16_ASYM")])
@pytest.mark.parametrize("shards", [1, 3])
def test_byte_identical_to_model_free_ptq(tmp_path: Path, scheme: str, ref_scheme: str, shards: int) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=shards)
    _reference(src, tmp_path / "ref", ref_scheme)
    quantize(
        QuantizeRequest(
            src,
            tmp_path / "ours",
            scheme=scheme,
            group_size=128,
            ignore=IGNORE,
            workers=2,
            scale_search="none",
            pre_pass=None,
        )
    )

    ref, ours = Checkpoint.open(tmp_path / "ref"), Checkpoint.open(tmp_path / "ours")
    assert set(ours.tensors) == set(ref.tensors)
    for shard in ref.headers:
        ref_bytes = (tmp_path / "ref" / shard).read_bytes()
        our_bytes = (tmp_path / "ours" / shard).read_bytes()
        # Whole shard files are identical: header, tensor order and every tensor byte.
        assert our_bytes == ref_bytes, shard

    ref_qc = json.loads((tmp_path / "ref" / "config.json").read_text())["quantization_config"]
    our_qc = json.loads((tmp_path / "ours" / "config.json").read_text())["quantization_config"]
    assert our_qc["config_groups"][ref_scheme]["weights"] == ref_qc["config_groups"][ref_scheme]["weights"]
    assert our_qc["format"] == ref_qc["format"] == "pack-quantized"
    if shards > 1:
        ref_index = json.loads((tmp_path / "ref" / "model.safetensors.index.json").read_text())
        our_index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
        assert our_index["weight_map"] == ref_index["weight_map"]
        assert our_index["metadata"]["total_size"] == ours.tensor_bytes


@pytest.mark.parametrize("scheme", ["w4a16", "w4a16-asym"])
def test_config_block_validates_with_compressed_tensors(tmp_path: Path, scheme: str) -> None:
    """compressed-tensors' own pydantic models accept the block (they forbid unknown argument keys)."""
    from compressed_tensors.quantization import QuantizationConfig

    src = write_checkpoint(tmp_path / "src", llama_tensors())
    quantize(QuantizeRequest(src, tmp_path / "out", scheme=scheme, group_size=64, workers=1, pre_pass=None))
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    parsed = QuantizationConfig.model_validate(qc)
    (group,) = parsed.config_groups.values()
    assert parsed.format == "pack-quantized" and parsed.quantization_status == "compressed"
    assert group.weights.group_size == 64 and group.weights.symmetric == (scheme == "w4a16")
    assert parsed.ignore == ["lm_head"]
    qc["config_groups"][next(iter(qc["config_groups"]))]["weights"]["bogus"] = 1
    with pytest.raises(ValueError):
        QuantizationConfig.model_validate(qc)
