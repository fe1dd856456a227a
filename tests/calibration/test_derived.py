"""Calibrated schemes and KV-cache scales on synthetic checkpoints: the formulas, fusing, config, manifest, card."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from calibration.synthetic import write_stats
from synth import llama_tensors, write_checkpoint
from weightsmith import schemes
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.audit.verify import verify
from weightsmith.calibration import derived
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats import compressors
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import nvfp4
from weightsmith.quant.int4 import mode_of
from weightsmith.safetensors.reader import ShardReader

QKV = ("q_proj", "k_proj", "v_proj")


def _read(folder: Path) -> dict[str, np.ndarray]:
    ckpt = Checkpoint.open(folder)
    out = {}
    for shard, header in ckpt.headers.items():
        with ShardReader(ckpt.path(shard), header) as reader:
            out |= {name: reader.read(name) for name in header.tensors}
    return out


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)


def test_nvfp4_weights_are_nvfp4a16s_and_input_global_scales_follow_the_formula(tmp_path: Path, src: Path) -> None:
    # q/k/v are given different maxima: vLLM runs them on one input, so all three take the largest
    stats, recorded = write_stats(
        src,
        tmp_path / "stats.safetensors",
        inputs={f"model.layers.0.self_attn.{p}": v for p, v in zip(QKV, (3, 9, 5), strict=True)},
    )
    a16 = _read(quantize(QuantizeRequest(src, tmp_path / "a16", scheme="nvfp4a16", workers=2)).output)
    w4a4 = _read(quantize(QuantizeRequest(src, tmp_path / "w4a4", scheme="nvfp4", calibration=stats, workers=2)).output)
    assert {n: v.tobytes() for n, v in a16.items()} == {
        n: v.tobytes() for n, v in w4a4.items() if not n.endswith(".input_global_scale")
    }
    globals_ = {n.removesuffix(".input_global_scale"): v for n, v in w4a4.items() if n.endswith(".input_global_scale")}
    assert len(globals_) == 14
    for module, value in globals_.items():
        partners = names.fused_partners(module)  # q/k/v and gate/up share one input, so one scale
        fused = partners[1] if partners else (module,)
        amax = np.float32(max(recorded.inputs[m] for m in fused)).astype(ml_dtypes.bfloat16)
        expected = nvfp4.global_scale(np.float32(amax), mode_of(np.dtype(ml_dtypes.bfloat16)))
        assert value.dtype == np.float32 and value.shape == (1,) and value[0] == expected, module
    assert len({globals_[f"model.layers.0.self_attn.{p}"][0] for p in QKV}) == 1


def test_static_fp8_weights_scales_and_input_scales(tmp_path: Path, src: Path) -> None:
    stats, recorded = write_stats(src, tmp_path / "stats.safetensors")
    out = quantize(QuantizeRequest(src, tmp_path / "fp8", scheme="fp8", calibration=stats, workers=2)).output
    written, source = _read(out), llama_tensors()
    bf16 = ml_dtypes.bfloat16
    for module in {n.removesuffix(".weight_scale") for n in written if n.endswith(".weight_scale")}:
        x = source[f"{module}.weight"].astype(np.float32)
        scale = written[f"{module}.weight_scale"]
        assert scale.dtype == bf16 and scale.shape == (1,)
        assert scale[0] == np.float32(np.abs(x).max() / np.float32(448)).astype(bf16)
        # torch's x / scale for bf16: the float32 quotient rounded to bf16, clamped, cast to E4M3
        s = np.float32(scale[0])
        q = np.clip((x / s).astype(bf16).astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn)
        assert written[f"{module}.weight"].tobytes() == q.tobytes(), module
        partners = names.fused_partners(module)
        amax = max(recorded.inputs[m] for m in (partners[1] if partners else (module,)))
        assert written[f"{module}.input_scale"][0] == np.float32(np.float32(amax).astype(bf16) / 448).astype(bf16)
        decoded = compressors.decompress("float-quantized", schemes.make_scheme("fp8").weight_args(), {
            "weight": written[f"{module}.weight"], "weight_scale": scale
        })  # fmt: skip
        assert np.array_equal(decoded.astype(np.float32), (q.astype(np.float32) * s).astype(bf16).astype(np.float32))


def test_kv_cache_scales_declared_verified_and_recorded(tmp_path: Path, src: Path) -> None:
    stats, recorded = write_stats(src, tmp_path / "stats.safetensors")
    result = quantize(
        QuantizeRequest(src, tmp_path / "out", scheme="w4a16", calibration=stats, kv_cache="fp8", workers=2)
    )
    written = _read(result.output)
    for attention, (k, v) in recorded.kv.items():
        for kind, amax in (("k", k), ("v", v)):
            value = written[f"{attention}.{kind}_scale"]
            assert value.dtype == np.float32 and value.shape == (1,)
            assert value[0] == np.float32(np.float32(amax) / np.float32(448))
    config = json.loads((result.output / "config.json").read_text())["quantization_config"]
    assert config["kv_cache_scheme"] == derived.kv_cache_scheme("fp8")
    assert config["kv_cache_scheme"]["observer"] == "static_minmax"
    report = verify(result.output)
    assert report.clean, report.findings
    # the k scales live in the shard of their layer's k_proj
    index = json.loads((result.output / "model.safetensors.index.json").read_text())["weight_map"]
    for attention in recorded.kv:
        assert index[f"{attention}.k_scale"] == index[f"{attention}.k_proj.weight_packed"]
    assert result.manifest.calibration == recorded.provenance


def test_a_recipe_rule_with_a_calibrated_scheme_needs_the_statistics(tmp_path: Path, src: Path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        '[[rule]]\ntargets = ["category:dense mlp"]\nscheme = "nvfp4"\n\n'
        '[[rule]]\ntargets = ["Linear"]\nscheme = "fp8-dynamic"\n'
    )
    with pytest.raises(WeightsmithError, match="scheme nvfp4 needs calibration statistics"):
        quantize(QuantizeRequest(src, tmp_path / "no", recipe=recipe))
    stats, _ = write_stats(src, tmp_path / "stats.safetensors")
    written = _read(
        quantize(QuantizeRequest(src, tmp_path / "out", recipe=recipe, calibration=stats, workers=2)).output
    )
    scaled = {n.rsplit(".", 2)[1] for n in written if n.endswith(".input_global_scale")}
    assert scaled == {"gate_proj", "up_proj", "down_proj"}


def test_card_says_the_scales_were_measured(tmp_path: Path, src: Path) -> None:
    from weightsmith.card.cite import Citations
    from weightsmith.card.made import _calibration_lines

    stats, recorded = write_stats(src, tmp_path / "stats.safetensors")
    result = quantize(
        QuantizeRequest(src, tmp_path / "out", scheme="nvfp4", calibration=stats, kv_cache="fp8", workers=2)
    )
    config = json.loads((result.output / "config.json").read_text())
    (line,) = _calibration_lines(result.manifest, config, Citations())
    assert "the static activation scales of nvfp4 and the KV-cache scales" in line
    assert f"{recorded.provenance.tokens:,}<!-- weightsmith.json: calibration.tokens -->" in line
    assert "not transplanted" in line and "original model" in line
    # without --kv-cache the card claims only the activation scales
    plain = quantize(QuantizeRequest(src, tmp_path / "plain", scheme="nvfp4", calibration=stats, workers=2))
    config = json.loads((plain.output / "config.json").read_text())
    (line,) = _calibration_lines(plain.manifest, config, Citations())
    assert "activation scales of nvfp4 measured" in line and "KV-cache" not in line
