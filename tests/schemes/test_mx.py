"""MX kernels against compressed-tensors' own quantize and decompress, and the schemes' rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from clirun import one_error_line, run
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.compressors import decompress
from weightsmith.formats.compressors.fp4_pack_quantized import Mxfp4PackQuantized
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import mx
from weightsmith.schemes import make_scheme

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")

DTYPES = {"bf16": (ml_dtypes.bfloat16, "bfloat16"), "f16": (np.float16, "float16"), "f32": (np.float32, "float32")}
PRESETS = {4: "MXFP4A16", 8: "MXFP8A16"}


def _awkward(dtype: type) -> np.ndarray:
    """Rows that reach every branch: zeros, -0.0, ties, 1.75 * 2**k, subnormals, the ends of the range."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((24, 128)) * 0.02).astype(np.float32)
    top = float(ml_dtypes.finfo(dtype).max)
    w[0] = 0
    w[1] = -0.0
    w[2] = rng.integers(-24, 25, 128) * 0.0625
    w[3, :32], w[3, 32:64] = 1.75 * 2.0**-3, 1.7421875 * 2.0**-3
    w[4] *= 1e-37
    w[5] *= 1e-6
    w[6] *= 1e-7
    w[7, ::2] = -1e-9
    w[8] = rng.uniform(-top, top, 128) * 0.99  # fp16: past 1.75 * 2**15; bf16/f32: an infinite scale
    w[9] = rng.uniform(-3e4, 3e4, 128)
    w[10] = rng.standard_normal(128) * 1e-38
    w[11] = rng.standard_normal(128) * 2.0**-20
    return w.astype(dtype)


def _torch(w: np.ndarray, name: str):
    t = torch.from_numpy(w.view(np.uint16) if w.dtype.itemsize == 2 else w)
    return t.view(getattr(torch, DTYPES[name][1])) if w.dtype.itemsize == 2 else t


def _llmcompressor(w: np.ndarray, dtype_name: str, bits: int) -> dict:
    """What model_free_ptq writes for one Linear weight (its own per-tensor steps)."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.entrypoints.model_free.converter import compress_module
    from llmcompressor.entrypoints.model_free.lifecycle import calibrate_weight, initialize_quantized_linear

    module = initialize_quantized_linear(_torch(w, dtype_name), preset_name_to_scheme(PRESETS[bits], ["Linear"]), "cpu")
    calibrate_weight(module)
    compress_module(module)
    return module.state_dict()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_kernel_matches_llmcompressor_on_awkward_values(dtype_name: str, bits: int) -> None:
    w = _awkward(DTYPES[dtype_name][0])
    ref = _llmcompressor(w, dtype_name, bits)
    codes, scale = mx.quantize(w, bits)
    ref_codes = ref["weight_packed"] if bits == 4 else ref["weight"]
    assert np.array_equal(ref["weight_scale"].numpy(), scale)
    assert np.array_equal(ref_codes.view(torch.uint8).numpy(), codes.view(np.uint8))


def _decompress(codes: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme(PRESETS[bits], ["Linear"])
    if bits == 4:
        state = {"weight_packed": torch.from_numpy(codes), "weight_scale": torch.from_numpy(scale)}
        return MXFP4PackedCompressor.decompress(state, scheme)["weight"].float().numpy()
    fp8 = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
    state = {"weight": fp8, "weight_scale": torch.from_numpy(scale)}
    return MXFP8QuantizationCompressor.decompress(state, scheme)["weight"].float().numpy()


def _values(codes: np.ndarray) -> np.ndarray:
    """FP4 bytes unpacked as the format unpacks them; FP8 codes as float32."""
    return Mxfp4PackQuantized.unpack(codes) if codes.dtype == np.uint8 else codes.astype(np.float32)


@pytest.mark.parametrize("bits", [4, 8])
def test_decode_matches_compressed_tensors_decompressor(bits: int) -> None:
    w = _awkward(ml_dtypes.bfloat16)
    codes, scale = mx.quantize(w, bits)
    ours = mx.dequantize(_values(codes), scale)
    assert ours.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(ours.astype(np.float32), _decompress(codes, scale, bits), equal_nan=True)
    # Through the registry, as `eval` asks: the config group's format picks the scheme.
    fmt, param = ("mxfp4-pack-quantized", "weight_packed") if bits == 4 else ("mxfp8-quantized", "weight")
    weights = make_scheme(PRESETS[bits].lower()).weight_args()
    dense = decompress(fmt, weights, {param: codes, "weight_scale": scale})
    assert dense.view(np.uint16).tobytes() == ours.view(np.uint16).tobytes()


def test_values_round_trip_where_exact() -> None:
    """Values on the grid come back exactly: E2M1 codes times a power of two, FP8 codes likewise."""
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6, 6] * 2, np.float32) * 2.0**-5
    w = np.tile(grid, (2, 1)).astype(ml_dtypes.bfloat16)
    for bits in (4, 8):
        codes, scale = mx.quantize(w, bits)
        back = mx.dequantize(_values(codes), scale)
        assert np.array_equal(back.astype(np.float32), w.astype(np.float32))


@pytest.mark.parametrize("bits", [4, 8])
def test_nan_and_inf_are_refused_with_their_position(bits: int) -> None:
    w = np.zeros((8, 64), np.float32)
    w[5, 37] = np.nan
    with pytest.raises(ValueError, match="row 5, column 37"):
        mx.quantize(w.astype(ml_dtypes.bfloat16), bits)
    w[5, 37], w[2, 3] = 0, -np.inf
    with pytest.raises(ValueError, match="row 2, column 3"):
        mx.quantize(w, bits)


def test_nan_in_a_checkpoint_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    tensors = llama_tensors()
    bad = tensors["model.layers.1.mlp.up_proj.weight"].astype(np.float32)
    bad[7, 33] = np.nan
    tensors["model.layers.1.mlp.up_proj.weight"] = bad.astype(ml_dtypes.bfloat16)
    src = write_checkpoint(tmp_path / "src", tensors)
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "out", "--scheme", "mxfp8")
    line = one_error_line(err)
    assert code != 0 and "model.layers.1.mlp.up_proj.weight" in line and "row 7, column 33" in line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.partial-*"))


@pytest.mark.parametrize("scheme", ["mxfp4a16", "mxfp8"])
def test_unsupported_width_is_kept_and_ignored_and_output_verifies(tmp_path, capsys, monkeypatch, scheme) -> None:
    """down_proj with 48 inputs (not a multiple of 32) stays BF16 with its reason; verify is clean."""
    config = dict(LLAMA_CONFIG, intermediate_size=48)
    src = write_checkpoint(tmp_path / "src", llama_tensors(config), config)
    code, out, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "out", "--scheme", scheme)
    assert code == 0, err
    ckpt = Checkpoint.open(tmp_path / "out")
    down = "model.layers.0.mlp.down_proj"
    assert ckpt.tensors[f"{down}.weight"].info.dtype.code == "BF16"
    assert down in ckpt.config["quantization_config"]["ignore"]
    assert f"model.layers.0.mlp.up_proj.{'weight_packed' if scheme == 'mxfp4a16' else 'weight'}" in ckpt.tensors
    code, out, err = run(capsys, monkeypatch, "verify", tmp_path / "out")
    assert code == 0, out + err


def test_scheme_rules() -> None:
    with pytest.raises(WeightsmithError, match="fixed group size of 32"):
        make_scheme("mxfp4", 16)
    with pytest.raises(WeightsmithError, match="no --scale-search"):
        make_scheme("mxfp8a16", None, "mse")
    assert make_scheme("mxfp4a16", 32).unsupported((8, 48)) is not None
    assert make_scheme("mxfp8").unsupported((8, 64)) is None
    assert make_scheme("mxfp4a16").input_args() is None
    assert make_scheme("mxfp8").input_args()["dynamic"] is True
    assert make_scheme("mxfp8").describe() == "MXFP8 g32"


def test_verify_flags_a_wrong_scale_dtype_and_shape(tmp_path, capsys, monkeypatch) -> None:
    from safetensors.torch import load_file, save_file

    src = write_checkpoint(tmp_path / "src", llama_tensors())
    assert run(capsys, monkeypatch, "quantize", src, tmp_path / "out", "--scheme", "mxfp4")[0] == 0
    shard = tmp_path / "out" / "model.safetensors"
    t = load_file(str(shard))
    t["model.layers.0.mlp.up_proj.weight_scale"] = torch.zeros((512, 16), dtype=torch.uint8)
    t["model.layers.0.mlp.gate_proj.weight_scale"] = t["model.layers.0.mlp.gate_proj.weight_scale"].float()
    save_file(t, str(shard), metadata={"format": "pt"})
    code, out, err = run(capsys, monkeypatch, "verify", tmp_path / "out")
    assert code != 0
    assert "'model.layers.0.mlp.gate_proj.weight_scale': is F32" in out + err
    assert "'model.layers.0.mlp.up_proj.weight_scale': has shape [512, 16]" in out + err
