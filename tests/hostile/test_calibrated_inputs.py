"""What `quantize --calibration/--kv-cache` and `calibrate-kv` accept: statistics files and targets.

Each case builds a synthetic Llama and a statistics file (tests/calibration/synthetic.py) under the
sandbox. A bad input gets one `error:` line naming the file and the entry, exit 2, no output, and
nothing else touched (a `calibrate-kv` target is left exactly as it was).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from calibration.synthetic import write_stats
from hostile.harness import Result, Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize


def _src(sandbox: Sandbox, name: str = "src", **tensors: np.ndarray) -> Path:
    return write_checkpoint(sandbox.root / name, {**llama_tensors(), **tensors})


def _quantize(capsys, monkeypatch, sandbox: Sandbox, src: Path, *extra: object) -> Result:
    sandbox.freeze()
    return run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--workers", "1", *extra)


def _refused(result: Result, sandbox: Sandbox, *words: str, allowed: str = "out") -> str:
    line = result.error_line
    assert result.code == 2, result
    for word in words:
        assert word in line, line
    assert not (sandbox.root / "out").exists()
    sandbox.assert_untouched(allowed)
    return line


def test_calibrated_scheme_without_statistics_points_at_calibrate(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    result = _quantize(capsys, monkeypatch, sandbox, src, "--scheme", "nvfp4")
    _refused(result, sandbox, "scheme nvfp4 needs calibration statistics", "weightsmith calibrate")


def test_statistics_file_missing(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    missing = sandbox.root / "stats.safetensors"
    result = _quantize(capsys, monkeypatch, sandbox, src, "--scheme", "fp8", "--calibration", missing)
    _refused(result, sandbox, str(missing), "does not exist", "weightsmith calibrate")


def test_statistics_of_another_model_refused(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    other = write_checkpoint(sandbox.root / "other", llama_tensors(seed=1))
    stats, _ = write_stats(other, sandbox.root / "stats.safetensors")
    result = _quantize(capsys, monkeypatch, sandbox, src, "--scheme", "nvfp4", "--calibration", stats)
    _refused(result, sandbox, str(stats), "measured on another model")


def test_a_module_without_an_input_maximum_is_named(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    stats, _ = write_stats(src, sandbox.root / "stats.safetensors", drop=("model.layers.1.mlp.down_proj",))
    result = _quantize(capsys, monkeypatch, sandbox, src, "--scheme", "fp8", "--calibration", stats)
    _refused(result, sandbox, str(stats), "model.layers.1.mlp.down_proj.input_absmax", "no input maximum")


def test_an_attention_layer_without_kv_maxima_is_named(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    stats, _ = write_stats(src, sandbox.root / "stats.safetensors", drop=("model.layers.1.self_attn",))
    result = _quantize(capsys, monkeypatch, sandbox, src, "--kv-cache", "fp8", "--calibration", stats)
    _refused(result, sandbox, str(stats), "model.layers.1.self_attn.key_absmax", "no KV maximum")


def test_kv_cache_without_statistics(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    result = _quantize(capsys, monkeypatch, sandbox, src, "--kv-cache", "fp8")
    _refused(result, sandbox, "--kv-cache fp8 needs calibration statistics")


def test_unknown_kv_cache_format(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    stats, _ = write_stats(src, sandbox.root / "stats.safetensors")
    result = _quantize(capsys, monkeypatch, sandbox, src, "--kv-cache", "int8", "--calibration", stats)
    _refused(result, sandbox, "unknown --kv-cache 'int8'")


def test_a_checkpoint_is_not_a_statistics_file(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    shard = src / "model.safetensors"
    result = _quantize(capsys, monkeypatch, sandbox, src, "--scheme", "nvfp4", "--calibration", shard)
    _refused(result, sandbox, str(shard), "is not a calibration file")


def test_statistics_a_data_free_run_would_not_use(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox)
    stats, _ = write_stats(src, sandbox.root / "stats.safetensors")
    result = _quantize(capsys, monkeypatch, sandbox, src, "--scheme", "w4a16", "--calibration", stats)
    _refused(result, sandbox, str(stats), "this run has neither")


def test_source_with_kv_scales_refuses_a_second_set(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = _src(sandbox, **{"model.layers.0.self_attn.k_scale": np.array([0.5], np.float32)})
    stats, _ = write_stats(src, sandbox.root / "stats.safetensors")
    result = _quantize(capsys, monkeypatch, sandbox, src, "--kv-cache", "fp8", "--calibration", stats)
    _refused(result, sandbox, "model.safetensors", "model.layers.0.self_attn.k_scale", "already has")


# --- calibrate-kv ---


def _quantized(sandbox: Sandbox, kv: bool) -> Path:
    src = _src(sandbox)
    stats, _ = write_stats(src, sandbox.root / "stats.safetensors")
    extra = {"calibration": stats, "kv_cache": "fp8"} if kv else {}
    return quantize(QuantizeRequest(src, sandbox.root / "quant", scheme="w4a16", workers=1, **extra)).output


def _calibrate_kv(capsys, monkeypatch, sandbox: Sandbox, *args: object) -> Result:
    sandbox.freeze()
    return run_inprocess(capsys, monkeypatch, "calibrate-kv", *args)


def test_calibrate_kv_refuses_existing_scales_without_force(capsys, monkeypatch, sandbox: Sandbox) -> None:
    quant = _quantized(sandbox, kv=True)
    result = _calibrate_kv(capsys, monkeypatch, sandbox, quant, "--tokens", "8", "--seq-len", "4")
    _refused(result, sandbox, "quant/model.safetensors", "model.layers.0.self_attn.k_scale", "--force", allowed="")


def test_calibrate_kv_refuses_a_checkpoint_without_a_quantization_method(capsys, monkeypatch, sandbox) -> None:
    src = _src(sandbox)
    result = _calibrate_kv(capsys, monkeypatch, sandbox, src, "--tokens", "8", "--seq-len", "4")
    _refused(result, sandbox, str(src), "declares no quantization method", allowed="")


def test_calibrate_kv_refuses_a_source_of_another_architecture(capsys, monkeypatch, sandbox: Sandbox) -> None:
    quant = _quantized(sandbox, kv=False)
    config = dict(LLAMA_CONFIG, num_hidden_layers=1)
    tensors = {k: v for k, v in llama_tensors(config).items() if ".layers.1." not in k}
    other = write_checkpoint(sandbox.root / "other", tensors, config=config)
    result = _calibrate_kv(capsys, monkeypatch, sandbox, quant, "--from", other, "--tokens", "8")
    _refused(result, sandbox, str(other / "config.json"), "num_hidden_layers", allowed="")


def test_calibrate_kv_needs_a_tokenizer(capsys, monkeypatch, sandbox: Sandbox) -> None:
    quant = _quantized(sandbox, kv=False)
    result = _calibrate_kv(capsys, monkeypatch, sandbox, quant, "--tokens", "8", "--seq-len", "4")
    _refused(result, sandbox, str(quant), "tokenizer", allowed="")
    assert json.loads((quant / "config.json").read_text())["quantization_config"]["kv_cache_scheme"] is None


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16])
def test_fp8_static_from_bf16_passes_verify(capsys, monkeypatch, sandbox: Sandbox, dtype: object) -> None:
    """The valid case beside the refusals: static FP8 with KV scales, verify clean."""
    src = write_checkpoint(sandbox.root / "src", llama_tensors(dtype=dtype))
    stats, _ = write_stats(src, sandbox.root / "stats.safetensors")
    result = _quantize(
        capsys, monkeypatch, sandbox, src, "--scheme", "fp8", "--calibration", stats, "--kv-cache", "fp8"
    )
    assert result.code == 0, result.err
    sandbox.assert_untouched("out")
    verified = run_inprocess(capsys, monkeypatch, "verify", sandbox.root / "out")
    assert verified.code == 0, verified.out
