"""8-bit schemes and W4AFP8: encode and decode against compressed-tensors' own functions, options, shapes."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith import schemes
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats import compressors
from weightsmith.io.checkpoint import Checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")

PRESETS = {"fp8-dynamic": "FP8_DYNAMIC", "fp8-block": "FP8_BLOCK", "w8a16": "W8A16", "w8a8": "W8A8", "w4afp8": "W4AFP8"}


def _awkward(rows: int = 200, cols: int = 256, dtype: object = ml_dtypes.bfloat16) -> np.ndarray:
    """Zero rows and blocks, subnormals, exact ties of x / scale, huge and tiny magnitudes side by side."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
    w[0] = 0.0  # an all-zero channel: the scale becomes eps
    w[1] = np.float32(2.0**-130) * rng.integers(-4, 5, cols)  # subnormals (float32; bf16 keeps them)
    w[2, :] = np.arange(cols) / 2 - 64  # halves: ties for int rounding
    w[3, 0], w[3, 1:] = 3e4, 1e-3  # one outlier sets the scale; the rest underflow
    w[130:, 128:] = 0.0  # a zero 128x128-ish block
    return w.astype(dtype)


def _torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(a)


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return t.numpy()


def _reference(w: np.ndarray, preset: str) -> tuple[dict, object, object]:
    """compressed-tensors' compressed tensors for `w` (via llm-compressor's lifecycle), with its compressor."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.entrypoints.model_free.lifecycle import calibrate_weight, initialize_quantized_linear

    scheme = preset_name_to_scheme(preset, ["Linear"])
    module = initialize_quantized_linear(_torch(w), scheme, "cpu")
    calibrate_weight(module)
    compressor = BaseCompressor.get_value_from_registry(schemes.make_scheme(preset.lower().replace("_", "-")).FORMAT)
    state = {"weight": module.weight.data, "weight_scale": module.weight_scale.data}
    return compressor.compress(state, scheme), compressor, scheme


def _encode(scheme: schemes.Scheme, w: np.ndarray) -> dict[str, np.ndarray]:
    """Encode `w` in row blocks as the pipeline does, assembled into whole parameters."""
    rows = w.shape[0]
    specs = {s.name.rsplit(".", 1)[1]: s for s in scheme.outputs("m", w.shape, "BF16")}
    out = {
        p: bytearray(int(np.prod(s.shape)) * {"I32": 4, "I64": 8, "BF16": 2}.get(s.dtype, 1)) for p, s in specs.items()
    }
    step = max(8, scheme.ROW_MULTIPLE)
    for r0 in range(0, rows, step):
        writes, bad = scheme.encode(w[r0 : r0 + step], r0, w.shape)
        assert bad == -1
        for param, data, offset in writes:
            raw = np.ascontiguousarray(data).tobytes()
            out[param][offset : offset + len(raw)] = raw
    dtypes = {
        "I8": np.int8,
        "I32": np.int32,
        "I64": np.int64,
        "BF16": ml_dtypes.bfloat16,
        "F8_E4M3": ml_dtypes.float8_e4m3fn,
    }
    return {p: np.frombuffer(bytes(b), dtypes[specs[p].dtype]).reshape(specs[p].shape) for p, b in out.items()}


@pytest.mark.parametrize("name", list(PRESETS))
def test_encode_and_decode_match_compressed_tensors(name: str) -> None:
    pytest.importorskip("llmcompressor")
    w = _awkward()
    scheme = schemes.make_scheme(name)
    expected, compressor, ct_scheme = _reference(w, PRESETS[name])
    ours = _encode(scheme, w)
    assert set(ours) == set(expected)
    for param, arr in ours.items():
        want = _numpy(expected[param].contiguous())
        assert arr.dtype == want.dtype and arr.shape == want.shape, param
        assert arr.tobytes() == want.tobytes(), param
    dense = compressor.decompress({k: _torch(v) for k, v in ours.items()}, ct_scheme)["weight"]
    decoded = compressors.decompress(scheme.FORMAT, scheme.weight_args(), ours)
    assert decoded.dtype == ml_dtypes.bfloat16 and decoded.shape == w.shape
    assert decoded.tobytes() == _numpy(dense).tobytes()


@pytest.mark.parametrize("name", list(PRESETS))
def test_nan_is_refused_with_its_place(name: str) -> None:
    w = _awkward()
    w[137, 201] = np.nan
    scheme = schemes.make_scheme(name)
    r0 = 128
    _, bad = scheme.encode(w[r0:], r0, w.shape)
    assert divmod(bad, w.shape[1]) == (137 - r0, 201)


@pytest.mark.parametrize(
    "name,group,search,words",
    [
        ("fp8-dynamic", 64, None, "takes no --group-size"),
        ("fp8-block", None, "mse", "takes no --scale-search"),
        ("w8a8", 128, None, "takes no --group-size"),
        ("w8a16", 6, None, "positive multiple of 4"),
        ("w4afp8", 12, None, "positive multiple of 8"),
    ],
)
def test_options_refused_in_one_line(name: str, group: int | None, search: str | None, words: str) -> None:
    with pytest.raises(WeightsmithError, match=words):
        schemes.make_scheme(name, group, search)


@pytest.mark.parametrize("name", ["fp8", "nvfp4"])
def test_calibrated_presets_need_a_statistics_file(tmp_path: Path, name: str) -> None:
    """The calibrated presets are schemes now; planning one without statistics points at `weightsmith calibrate`."""
    from weightsmith.quantization.plan import build_plan

    scheme = schemes.make_scheme(name)
    assert scheme.NEEDS_CALIBRATION
    src = write_checkpoint(tmp_path / "src", llama_tensors())
    with pytest.raises(WeightsmithError, match=r"needs calibration statistics.*weightsmith calibrate") as err:
        build_plan(Checkpoint.open(src), scheme)
    assert "\n" not in str(err.value)


def test_w8a16_group_size_and_kept_weights(tmp_path: Path) -> None:
    """--group-size 64 is honoured; a weight whose inputs are no multiple of it is kept and ignored."""
    config = dict(LLAMA_CONFIG, intermediate_size=200)
    src = write_checkpoint(tmp_path / "src", llama_tensors(config), config=config)
    quantize(
        QuantizeRequest(
            src, tmp_path / "out", scheme="w8a16", group_size=64, ignore=["lm_head"], workers=1, pre_pass=None
        )
    )
    out = Checkpoint.open(tmp_path / "out")
    down = "model.layers.0.mlp.down_proj"
    assert out.tensors[f"{down}.weight"].info.dtype.code == "BF16"
    assert down in out.config["quantization_config"]["ignore"]
    assert out.tensors["model.layers.0.mlp.gate_proj.weight_scale"].info.shape == (200, 4)
    group = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["config_groups"]["W8A16"]
    assert group["weights"]["group_size"] == 64 and group["input_activations"] is None


@pytest.mark.parametrize("name", list(PRESETS))
def test_output_verifies_clean(tmp_path: Path, name: str) -> None:
    from weightsmith.audit.verify import verify

    src = write_checkpoint(tmp_path / "src", llama_tensors())
    quantize(QuantizeRequest(src, tmp_path / "out", scheme=name, ignore=["lm_head"], workers=1, pre_pass=None))
    report = verify(tmp_path / "out")
    assert not [f for f in report.findings if f.severity in ("error", "warning")], report.findings
