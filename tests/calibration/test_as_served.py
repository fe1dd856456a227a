"""Statistics measured on a quantization of SRC (the model as served) are SRC's too: provenance and quantize."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calibration.synthetic import write_stats
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.calibration import stats_file
from weightsmith.core.errors import CheckpointError
from weightsmith.io import provenance
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.io.manifest import load_manifest, source_fingerprint
from weightsmith.safetensors.writer import ShardWriter, TensorSpec


def _as_measured_on(quant: Path, stats: stats_file.CalibrationStats, out: Path) -> Path:
    """`stats` relabelled as `weightsmith calibrate QUANT` labels them (QUANT's fingerprint, its source's)."""
    ckpt = Checkpoint.open(quant)
    model = provenance.fingerprint(ckpt)
    prov = replace(
        stats.provenance,
        model_fingerprint=model,
        activations="quantized",
        source_fingerprint=source_fingerprint(ckpt, model, "quantized"),
    )
    stats_file.write(out, stats_file.CalibrationStats(prov, stats.kv, stats.inputs))
    return out


def test_a_stats_file_without_source_fingerprint_still_reads(tmp_path: Path) -> None:
    meta = {"format": stats_file.FORMAT, "model_fingerprint": "sha256:x", "tokens": "1", "sequences": "1",
            "seq_len": "1", "text": "t", "text_sha256": "h", "activations": "original"}  # fmt: skip
    with ShardWriter(tmp_path, "old.safetensors", [TensorSpec("a.input_absmax", "F32", ())], meta) as w:
        w.write("a.input_absmax", np.array(1.0, np.float32))
    assert stats_file.read(tmp_path / "old.safetensors").provenance.source_fingerprint is None


def test_quantize_takes_statistics_measured_on_a_quantization_of_src(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    a16 = quantize(QuantizeRequest(src, tmp_path / "a16", scheme="nvfp4a16", workers=2)).output
    src_fp = provenance.fingerprint(Checkpoint.open(src))
    assert load_manifest(a16 / "weightsmith.json").source.fingerprint == src_fp
    _, original = write_stats(src, tmp_path / "orig.safetensors")
    assert source_fingerprint(Checkpoint.open(src), src_fp, "original") == src_fp
    served = _as_measured_on(a16, original, tmp_path / "served.safetensors")
    assert stats_file.read(served).provenance.source_fingerprint == src_fp

    result = quantize(QuantizeRequest(src, tmp_path / "w4a4", scheme="nvfp4", calibration=served, workers=2))
    cal = load_manifest(result.output / "weightsmith.json").calibration
    assert cal is not None and cal.activations == "quantized"
    assert cal.model_fingerprint == provenance.fingerprint(Checkpoint.open(a16)) != cal.source_fingerprint == src_fp
    # same maxima, same scales: only the provenance differs from statistics taken on SRC itself
    same = quantize(
        QuantizeRequest(
            src, tmp_path / "w4a4-orig", scheme="nvfp4", calibration=tmp_path / "orig.safetensors", workers=2
        )
    )
    assert (result.output / "model-00001-of-00002.safetensors").read_bytes() == (
        same.output / "model-00001-of-00002.safetensors"
    ).read_bytes()


def test_statistics_of_a_quantization_of_another_model_are_refused(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    other = write_checkpoint(tmp_path / "other", llama_tensors(seed=1), shards=2)
    a16 = quantize(QuantizeRequest(other, tmp_path / "a16", scheme="nvfp4a16", workers=2)).output
    _, stats = write_stats(src, tmp_path / "orig.safetensors")
    served = _as_measured_on(a16, stats, tmp_path / "served.safetensors")
    with pytest.raises(CheckpointError, match="another model") as err:
        quantize(QuantizeRequest(src, tmp_path / "w4a4", scheme="nvfp4", calibration=served, workers=2))
    assert err.value.code == "calibration.model"
    assert not (tmp_path / "w4a4").exists()
    # a forged file that claims SRC as its source but says its activations were the original's
    forged = replace(
        stats.provenance, model_fingerprint="sha256:" + "1" * 64, source_fingerprint=stats.provenance.model_fingerprint
    )
    with pytest.raises(CheckpointError, match="another model"):
        stats_file.check_model("s", stats_file.CalibrationStats(forged), Checkpoint.open(src))


def test_a_static_fp8_checkpoint_runs_as_an_original_yet_is_labelled_a_quantization_of_src(tmp_path: Path) -> None:
    from weightsmith.io.manifest import measured_activations

    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    stats, _ = write_stats(src, tmp_path / "orig.safetensors")
    fp8 = Checkpoint.open(
        quantize(QuantizeRequest(src, tmp_path / "fp8", scheme="fp8", calibration=stats, workers=2)).output
    )
    model, src_fp = provenance.fingerprint(fp8), provenance.fingerprint(Checkpoint.open(src))
    # the engine decodes it as an FP8 original ("original"); its manifest names SRC
    assert source_fingerprint(fp8, model, "original") == src_fp
    assert measured_activations("original", model, src_fp) == "quantized"
    assert measured_activations("original", src_fp, src_fp) == "original"
