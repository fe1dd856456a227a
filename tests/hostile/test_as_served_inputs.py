"""Hostile inputs to the as-served path: a quantized checkpoint's bad manifest, another model's quantization."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from calibration.synthetic import write_stats
from hostile.harness import Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.calibration import stats_file
from weightsmith.io import provenance
from weightsmith.io.checkpoint import Checkpoint

TINY = dict(LLAMA_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=64, num_hidden_layers=2)  # fmt: skip


def test_calibrate_of_a_quantized_checkpoint_with_a_bad_manifest_names_the_field(
    sandbox: Sandbox, capsys, monkeypatch
) -> None:
    pytest.importorskip("transformers")
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    quant = quantize(QuantizeRequest(src, sandbox.root / "a16", scheme="nvfp4a16", workers=1)).output
    manifest = json.loads((quant / "weightsmith.json").read_text())
    manifest["source"]["fingerprint"] = 7
    (quant / "weightsmith.json").write_text(json.dumps(manifest))
    out = sandbox.root / "served.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", quant, "--out", out)
    assert result.code == 2
    line = result.error_line
    assert str(quant / "weightsmith.json") in line and "source.fingerprint is an integer" in line
    assert not out.exists()
    sandbox.assert_untouched()


def test_statistics_of_another_models_quantization_are_refused(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    other = write_checkpoint(sandbox.root / "other", llama_tensors(TINY, seed=3), TINY)
    _, stats = write_stats(src, sandbox.root / "orig.safetensors")
    other_fp = provenance.fingerprint(Checkpoint.open(other))
    served = sandbox.root / "served.safetensors"
    prov = replace(stats.provenance, model_fingerprint="sha256:" + "2" * 64, activations="quantized",
                   source_fingerprint=other_fp)  # fmt: skip
    stats_file.write(served, stats_file.CalibrationStats(prov, stats.kv, stats.inputs))
    out = sandbox.root / "w4a4"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, "--scheme", "nvfp4", "--calibration", served)
    assert result.code == 2
    line = result.error_line
    assert str(served) in line and "another model" in line
    assert not out.exists()
    sandbox.assert_untouched()
