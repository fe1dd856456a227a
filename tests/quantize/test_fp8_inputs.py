"""FP8 inputs of every style decode exactly, and quantize exactly as llm-compressor does after its own dequantizers."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from fp8_reference import IGNORE, ct_fp8_scheme, load, same_tensors
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import fp8

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")


def _ours(src: Path, out: Path) -> Checkpoint:
    quantize(
        QuantizeRequest(
            src, out, scheme="w4a16", group_size=128, ignore=IGNORE, workers=2, scale_search="none", pre_pass=None
        )
    )
    return Checkpoint.open(out)


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
def test_compressed_tensors_fp8_matches_llmcompressor(tmp_path: Path, strategy: str) -> None:
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer
    from llmcompressor import model_free_ptq

    bf16 = write_checkpoint(tmp_path / "bf16", llama_tensors(), shards=2)
    fp8_dir = tmp_path / "fp8"
    model_free_ptq(str(bf16), str(fp8_dir), scheme=ct_fp8_scheme(strategy), ignore=IGNORE, device="cpu")
    scales = {k: v for k, v in load(fp8_dir).items() if k.endswith("weight_scale")}
    expected_shape = {"tensor": (1,), "channel": None, "block": None}[strategy]
    if expected_shape:
        assert all(tuple(v.shape) == expected_shape for v in scales.values())

    ref = tmp_path / "ref"
    model_free_ptq(
        str(fp8_dir),
        str(ref),
        scheme="W4A16",
        ignore=IGNORE,
        device="cpu",
        converter=CompressedTensorsDequantizer(str(fp8_dir), ignore=["re:.*norm$"]),
    )
    ours = _ours(fp8_dir, tmp_path / "ours")
    same_tensors(ref, tmp_path / "ours")
    assert all(ref.info.dtype.code != "F8_E4M3" for ref in ours.tensors.values())


def _hf_fp8_checkpoint(folder: Path, scale_fmt: str) -> dict[str, np.ndarray]:
    """A DeepSeek-style fp8 checkpoint built by the documented formula, with partial edge blocks.

    gate/up have 448 rows (3.5 row blocks). down_proj (448 columns) stays BF16, listed in
    `modules_to_not_convert`: compressed-tensors' own block dequantizer fails on ragged columns, so
    that case is checked against the formula alone (test_decode_matches_transformers_formula).
    Power-of-two scales are written as E8M0 (`ue8m0`) or as the same values in float32.
    """
    config = dict(LLAMA_CONFIG, intermediate_size=448)
    tensors = llama_tensors(config)
    out: dict[str, np.ndarray] = {}
    for name, w in tensors.items():
        if name.endswith("_proj.weight") and "down_proj" not in name:
            _, scale = fp8.quantize_blocks(w)
            scale = np.exp2(np.ceil(np.log2(scale))).astype(np.float32)  # powers of two, as ue8m0 needs
            mult = fp8.expand_scale(scale, (0, w.shape[0]), w.shape[1], (128, 128))
            out[name] = (w.astype(np.float32) / mult).astype(ml_dtypes.float8_e4m3fn)
            out[name + "_scale_inv"] = scale.astype(ml_dtypes.float8_e8m0fnu) if scale_fmt == "ue8m0" else scale
        else:
            out[name] = w
    qc = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "re:.*down_proj"],
    }
    if scale_fmt == "ue8m0":
        qc["scale_fmt"] = "ue8m0"
    folder.mkdir(parents=True)
    save_file(out, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(dict(config, quantization_config=qc)))
    return out


@pytest.mark.parametrize("scale_fmt", ["float", "ue8m0"])
def test_hf_fp8_block_matches_llmcompressor(tmp_path: Path, scale_fmt: str) -> None:
    from compressed_tensors.entrypoints.convert.converters import FP8BlockDequantizer
    from llmcompressor import model_free_ptq

    src = tmp_path / "fp8"
    tensors = _hf_fp8_checkpoint(src, scale_fmt)
    # llm-compressor cannot read E8M0 scales; it gets the same scales as float32 instead.
    ref_src = src if scale_fmt == "float" else tmp_path / "fp8-f32-scales"
    if ref_src != src:
        _hf_fp8_checkpoint(ref_src, "float")
    ref = tmp_path / "ref"
    converter = FP8BlockDequantizer(targets=["re:.*(q|k|v|o|gate|up)_proj$"])
    # llm-compressor refuses down_proj (448 inputs); we keep it on our own and say why.
    ref_ignore = [*IGNORE, "re:.*down_proj$"]
    model_free_ptq(str(ref_src), str(ref), scheme="W4A16", ignore=ref_ignore, device="cpu", converter=converter)
    ours = _ours(src, tmp_path / "ours")
    same_tensors(ref, tmp_path / "ours")
    # down_proj (448 inputs) cannot take group 128: kept in BF16 and listed in ignore.
    down = "model.layers.0.mlp.down_proj"
    assert ours.tensors[f"{down}.weight"].info.dtype.code == "BF16"
    assert down in ours.config["quantization_config"]["ignore"]
    # gate_proj (448 rows, ragged last row block) was FP8 and is now quantized.
    gate = "model.layers.0.mlp.gate_proj"
    assert f"{gate}.weight_scale_inv" in tensors and f"{gate}.weight_packed" in ours.tensors


def test_decode_matches_transformers_formula() -> None:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((300, 200)) * 0.05).astype(np.float32)
    q, scale = fp8.quantize_blocks(w)
    ours = fp8.dequantize_rows(q, scale, 0)
    tq = torch.from_numpy(q.view(np.uint8)).view(torch.float8_e4m3fn)
    ts = torch.from_numpy(scale).repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    expected = (tq.to(torch.float32) * ts).to(torch.bfloat16)
    assert ours.view(np.uint16).tobytes() == expected.view(torch.int16).numpy().tobytes()
    # Row blocks taken mid-tensor use the right block scales.
    part = fp8.dequantize_rows(q[130:260], scale, 130)
    assert part.view(np.uint16).tobytes() == ours[130:260].view(np.uint16).tobytes()
    # E8M0 scales decode to the same powers of two.
    pow2 = np.exp2(np.ceil(np.log2(scale))).astype(np.float32)
    e8 = fp8.dequantize_rows(q, pow2.astype(ml_dtypes.float8_e8m0fnu), 0)
    assert e8.view(np.uint16).tobytes() == fp8.dequantize_rows(q, pow2, 0).view(np.uint16).tobytes()
