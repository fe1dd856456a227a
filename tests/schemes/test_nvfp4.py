"""NVFP4A16: byte identity with llm-compressor, the decompressor round trip, and the code search."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.compressors.fp4_pack_quantized import E2M1, Nvfp4PackQuantized
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import nvfp4
from weightsmith.schemes import make_scheme

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")

IGNORE = ["lm_head", "model.embed_tokens"]


def _quantize(src: Path, out: Path, search: str | None = None) -> Checkpoint:
    quantize(QuantizeRequest(src, out, scheme="nvfp4a16", ignore=IGNORE, workers=2, scale_search=search, pre_pass=None))
    return Checkpoint.open(out)


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def test_byte_identical_to_model_free_ptq(tmp_path: Path) -> None:
    from compressed_tensors.quantization import QuantizationConfig
    from llmcompressor import model_free_ptq

    src = write_checkpoint(tmp_path / "src", llama_tensors())
    model_free_ptq(str(src), str(tmp_path / "ref"), scheme="NVFP4A16", ignore=IGNORE, device="cpu")
    ours = _quantize(src, tmp_path / "ours")
    assert (tmp_path / "ours" / "model.safetensors").read_bytes() == (
        tmp_path / "ref" / "model.safetensors"
    ).read_bytes()
    ref_qc = json.loads((tmp_path / "ref" / "config.json").read_text())["quantization_config"]
    assert ours.config["quantization_config"]["config_groups"]["NVFP4A16"] == ref_qc["config_groups"]["NVFP4A16"]
    assert QuantizationConfig.model_validate(ours.config["quantization_config"]).format == "nvfp4-pack-quantized"


def test_fused_set_split_across_shards_matches_model_free_ptq(tmp_path: Path) -> None:
    """q_proj in one shard, k/v in the next: the shared global scale needs all three first.

    llm-compressor itself refuses this layout ("Matched a k_proj twice before completing set"), so
    the reference is its output for the same tensors in one file.
    """
    from llmcompressor import model_free_ptq
    from safetensors.numpy import save_file

    tensors = llama_tensors()
    names = list(tensors)
    cut = names.index("model.layers.0.self_attn.k_proj.weight")
    one_file = write_checkpoint(tmp_path / "one", tensors)
    src = write_checkpoint(tmp_path / "src", tensors)
    (src / "model.safetensors").unlink()
    parts = {"model-00001-of-00002.safetensors": names[:cut], "model-00002-of-00002.safetensors": names[cut:]}
    for fname, part in parts.items():
        save_file({n: tensors[n] for n in part}, str(src / fname))
    weight_map = {n: f for f, part in parts.items() for n in part}
    total = sum(a.nbytes for a in tensors.values())
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    model_free_ptq(str(one_file), str(tmp_path / "ref"), scheme="NVFP4A16", ignore=IGNORE, device="cpu")
    _quantize(src, tmp_path / "ours")
    ref, ours = _tensors(tmp_path / "ref"), _tensors(tmp_path / "ours")
    assert set(ref) == set(ours)
    for k in ref:
        assert torch.equal(ref[k].view(torch.uint8), ours[k].view(torch.uint8)), k


def _decompress(q: nvfp4.Nvfp4Weight) -> np.ndarray:
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    scheme: QuantizationScheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    state = {
        "weight_packed": torch.from_numpy(q.packed),
        "weight_scale": torch.from_numpy(q.scale.view(np.uint8)).view(torch.float8_e4m3fn),
        "weight_global_scale": torch.from_numpy(q.global_scale),
    }
    return NVFP4PackedCompressor.decompress(state, scheme)["weight"].float().numpy()


@pytest.mark.parametrize("search", [False, True])
def test_dequantize_matches_compressed_tensors_decompressor(search: bool) -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 256)) * 0.02).astype(ml_dtypes.bfloat16)
    w[0, :16] = 0  # a zero block: scale becomes fp8 eps (0.125)
    q = nvfp4.quantize(w, search=search)
    ours = _dequantize(q)
    assert ours.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(ours.astype(np.float32), _decompress(q))
    if not search:
        assert q.scale.view(np.uint8)[0, 0] == 0x20  # 0.125


def test_packing_matches_the_documented_example() -> None:
    q = nvfp4.Nvfp4Weight(
        np.array([[0xF1, 0x42]], np.uint8), np.ones((1, 1), ml_dtypes.float8_e4m3fn), np.ones(1, np.float32)
    )
    assert Nvfp4PackQuantized.unpack(q.packed).tolist() == [[0.5, -6.0, 1.0, 2.0]]


def _dequantize(q: nvfp4.Nvfp4Weight) -> np.ndarray:
    return nvfp4.dequantize(Nvfp4PackQuantized.unpack(q.packed), q.scale, q.global_scale)


def _rel(w: np.ndarray, q: nvfp4.Nvfp4Weight) -> float:
    a = w.astype(np.float64)
    return float(((_dequantize(q).astype(np.float64) - a) ** 2).sum() / (a**2).sum())


def test_code_search_lowers_error_with_the_same_format(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((256, 512)).astype(np.float32) * 0.02
    w[rng.random(w.shape) < 2e-3] *= 8
    w = w.astype(ml_dtypes.bfloat16)
    plain, searched = nvfp4.quantize(w), nvfp4.quantize(w, search=True)
    assert np.array_equal(plain.global_scale, searched.global_scale)
    assert _rel(w, searched) < 0.9 * _rel(w, plain)  # at least 10 % lower weight error
    src = write_checkpoint(tmp_path / "src", llama_tensors())
    ckpt = _quantize(src, tmp_path / "out", "mse")
    assert ckpt.tensors["model.layers.0.mlp.up_proj.weight_packed"].info.dtype.code == "U8"


def test_fused_partners_share_one_global_scale(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=3)
    _quantize(src, tmp_path / "out")
    t = _tensors(tmp_path / "out")
    p = "model.layers.1"
    qkv = {float(t[f"{p}.self_attn.{m}.weight_global_scale"][0]) for m in ("q_proj", "k_proj", "v_proj")}
    gate_up = {float(t[f"{p}.mlp.{m}.weight_global_scale"][0]) for m in ("gate_proj", "up_proj")}
    assert len(qkv) == 1 and len(gate_up) == 1


def test_scheme_rules() -> None:
    with pytest.raises(WeightsmithError, match="fixed group size"):
        make_scheme("nvfp4a16", 128)
    with pytest.raises(WeightsmithError, match="memoryless_mse is for w4a16, w4a16-asym, w4afp8; nvfp4a16 takes mse"):
        make_scheme("nvfp4a16", None, "memoryless_mse")
    assert make_scheme("nvfp4a16").unsupported((8, 24)) is not None
    assert make_scheme("w4a16").group_size == 128


def test_branch_free_rounding_matches_compressed_tensors_cast_to_fp4() -> None:
    torch = pytest.importorskip("torch")
    fp4_utils = pytest.importorskip("compressed_tensors.quantization.utils.fp4_utils")
    from numba import njit

    index, value = njit(lambda t: nvfp4.fp4_index(t)), njit(lambda i: nvfp4.e2m1_value(i))
    assert [value(i) for i in range(8)] == list(E2M1)
    # every threshold, just either side of it, and a fine grid over [-6, 6]
    edges = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    ts = np.concatenate(
        [np.linspace(-6, 6, 4801, dtype=np.float32), edges, np.nextafter(edges, 0), np.nextafter(edges, 9)]
    )
    ts = np.concatenate([ts, -ts])
    reference = fp4_utils.cast_to_fp4(torch.from_numpy(ts.copy())).abs().numpy()
    ours = np.array([value(index(t)) for t in ts], np.float32)
    assert np.array_equal(ours, reference)


def test_negative_zero_packs_as_compressed_tensors() -> None:
    """A -0.0 weight packs as +0 (`cast_to_fp4` multiplies by sign(-0.0) = 0); a tiny negative as -0."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.entrypoints.model_free.converter import compress_module
    from llmcompressor.entrypoints.model_free.lifecycle import calibrate_weight, initialize_quantized_linear

    w = (np.random.default_rng(2).standard_normal((4, 32)) * 0.02).astype(np.float32)
    w[0, :16], w[1, 3], w[2, 5] = -0.0, -0.0, -1e-9
    w = w.astype(ml_dtypes.bfloat16)
    weight = torch.from_numpy(w.view(np.uint16)).view(torch.bfloat16)
    module = initialize_quantized_linear(weight, preset_name_to_scheme("NVFP4A16", ["Linear"]), "cpu")
    calibrate_weight(module)
    compress_module(module)
    packed = nvfp4.quantize(w).packed
    assert np.array_equal(module.state_dict()["weight_packed"].numpy(), packed)
    assert packed[0, 0] == 0 and packed[2, 2] >> 4 == 8


def test_search_rounding_matches_the_branch_free_index_on_every_float32_up_to_six() -> None:
    """`e2m1_magnitude` (the scale search's rounding) against `e2m1_value(fp4_index(t))`, which the
    test above ties to compressed-tensors: every float32 in [-6, 6], ties and neighbours included."""
    from numba import njit

    @njit(nogil=True)
    def mismatches(top: int) -> int:
        bad = 0
        for b in range(top + 1):
            t = np.uint32(b).view(np.float32)
            for v in (t, -t):
                bad += nvfp4.e2m1_magnitude(v) != nvfp4.e2m1_value(nvfp4.fp4_index(v))
        return bad

    assert mismatches(int(np.float32(6.0).view(np.uint32))) == 0
