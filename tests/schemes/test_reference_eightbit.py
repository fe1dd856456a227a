"""Byte identity with llm-compressor's `model_free_ptq` on CPU for the 8-bit presets and W4AFP8."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.io.checkpoint import Checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")

IGNORE = ["lm_head", "model.embed_tokens"]
SCHEMES = [
    ("fp8-dynamic", "FP8_DYNAMIC", "float-quantized"),
    ("fp8-block", "FP8_BLOCK", "float-quantized"),
    ("w8a16", "W8A16", "pack-quantized"),
    ("w8a8", "W8A8", "int-quantized"),
    ("int8", "INT8", "int-quantized"),
    ("w4afp8", "W4AFP8", "int-quantized"),
]
#: 200 rows: FP8_BLOCK's last row block is partial (its ragged columns are checked apart, below).
RAGGED_ROWS = dict(LLAMA_CONFIG, intermediate_size=200)
#: FP8_BLOCK takes partial row blocks only in a Linear vLLM builds alone (o_proj, down_proj: 200 rows
#: here): `quantize` keeps gate/up of RAGGED_ROWS, since vLLM refuses a fused shard of 200 rows.
RAGGED_HIDDEN = dict(LLAMA_CONFIG, hidden_size=200)


def _ours(src: Path, out: Path, scheme: str, ignore: list[str] = IGNORE) -> Checkpoint:
    quantize(QuantizeRequest(src, out, scheme=scheme, ignore=ignore, workers=2, pre_pass=None))
    return Checkpoint.open(out)


def _reference(src: Path, out: Path, scheme: str, ignore: list[str] = IGNORE, converter: object = None) -> None:
    from llmcompressor import model_free_ptq

    model_free_ptq(str(src), str(out), scheme=scheme, ignore=ignore, device="cpu", converter=converter)


def _same_files(ref: Path, ours: Path) -> None:
    """Whole shard files identical (header, tensor order, every byte), and the same index."""
    for shard in Checkpoint.open(ref).headers:
        assert (ours / shard).read_bytes() == (ref / shard).read_bytes(), shard
    if len(Checkpoint.open(ref).headers) > 1:  # (llm-compressor writes an index for one shard too)
        ref_index = json.loads((ref / "model.safetensors.index.json").read_text())
        our_index = json.loads((ours / "model.safetensors.index.json").read_text())
        assert our_index["weight_map"] == ref_index["weight_map"]


def _same_config(ref: Path, ours: Path, group: str, fmt: str) -> None:
    from compressed_tensors.quantization import QuantizationConfig

    ref_qc = json.loads((ref / "config.json").read_text())["quantization_config"]
    our_qc = json.loads((ours / "config.json").read_text())["quantization_config"]
    for block in ("weights", "input_activations", "output_activations", "format", "targets"):
        assert our_qc["config_groups"][group][block] == ref_qc["config_groups"][group][block], block
    assert our_qc["format"] == ref_qc["format"] == fmt
    assert our_qc["ignore"] == ref_qc["ignore"]
    QuantizationConfig.model_validate(our_qc)


@pytest.mark.parametrize("scheme,group,fmt", SCHEMES)
@pytest.mark.parametrize("shards", [1, 3])
def test_byte_identical_to_model_free_ptq(tmp_path: Path, scheme: str, group: str, fmt: str, shards: int) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=shards)
    _reference(src, tmp_path / "ref", group)
    _ours(src, tmp_path / "ours", scheme)
    _same_files(tmp_path / "ref", tmp_path / "ours")
    _same_config(tmp_path / "ref", tmp_path / "ours", group, fmt)


@pytest.mark.parametrize("scheme,group", [("fp8-dynamic", "FP8_DYNAMIC"), ("w8a8", "W8A8"), ("fp8-block", "FP8_BLOCK")])
def test_ragged_shapes_match(tmp_path: Path, scheme: str, group: str) -> None:
    """Sides that are no multiple of 128: per-channel schemes take any; FP8_BLOCK's edge blocks are partial."""
    config = RAGGED_HIDDEN if scheme == "fp8-block" else RAGGED_ROWS
    src = write_checkpoint(tmp_path / "src", llama_tensors(config), config=config, shards=2)
    # llm-compressor 0.14 crashes saving FP8_BLOCK weights with ragged columns (a non-contiguous
    # slice): the 200-input Linears are compared with compressed-tensors' own functions below.
    ignore = [*IGNORE, "re:.*(q|k|v|gate|up)_proj$"] if scheme == "fp8-block" else IGNORE
    _reference(src, tmp_path / "ref", group, ignore)
    ours = _ours(src, tmp_path / "ours", scheme, ignore)
    _same_files(tmp_path / "ref", tmp_path / "ours")
    if scheme == "fp8-block":
        assert ours.tensors["model.layers.0.self_attn.o_proj.weight_scale"].info.shape == (2, 2)
        assert ours.tensors["model.layers.0.mlp.down_proj.weight_scale"].info.shape == (2, 4)
    else:
        assert ours.tensors["model.layers.0.mlp.gate_proj.weight_scale"].info.shape == (200, 1)


def _load(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def test_fp8_block_ragged_columns_match_compressed_tensors(tmp_path: Path) -> None:
    """The case llm-compressor cannot save: its own lifecycle and compressor, made contiguous."""
    from compressed_tensors.compressors import FloatQuantizationCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.entrypoints.model_free.lifecycle import calibrate_weight, initialize_quantized_linear

    src = write_checkpoint(tmp_path / "src", llama_tensors(RAGGED_ROWS), config=RAGGED_ROWS)
    _ours(src, tmp_path / "ours", "fp8-block")
    source, ours = _load(src), _load(tmp_path / "ours")
    scheme = preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    for name in ("model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"):
        weight = source[f"{name}.weight"]
        module = initialize_quantized_linear(weight, scheme, "cpu")
        calibrate_weight(module)
        state = {"weight": module.weight.data, "weight_scale": module.weight_scale.data}
        expected = FloatQuantizationCompressor.compress(state, scheme)
        for param in ("weight", "weight_scale"):
            got = ours[f"{name}.{param}"]
            want = expected[param].contiguous()
            assert got.dtype == want.dtype and got.shape == want.shape, param
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), param


@pytest.mark.parametrize("scheme,group,fmt", SCHEMES)
def test_fp8_inputs_match_model_free_ptq(tmp_path: Path, scheme: str, group: str, fmt: str) -> None:
    """From an FP8 block checkpoint: the same bytes as llm-compressor after its own FP8 dequantizer."""
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer
    from compressed_tensors.quantization import preset_name_to_scheme

    bf16 = write_checkpoint(tmp_path / "bf16", llama_tensors(), shards=2)
    fp8_dir = tmp_path / "fp8"
    _reference(bf16, fp8_dir, preset_name_to_scheme("FP8_BLOCK", ["Linear"]))
    converter = CompressedTensorsDequantizer(str(fp8_dir), ignore=["re:.*norm$"])
    _reference(fp8_dir, tmp_path / "ref", group, converter=converter)
    ours = _ours(fp8_dir, tmp_path / "ours", scheme)
    ref = _load(tmp_path / "ref")
    mine = _load(tmp_path / "ours")
    assert set(mine) == set(ref)
    for k in ref:
        assert mine[k].dtype == ref[k].dtype and mine[k].shape == ref[k].shape, k
        assert torch.equal(mine[k].view(torch.uint8), ref[k].view(torch.uint8)), k
    assert ours.config["quantization_config"]["format"] == fmt
