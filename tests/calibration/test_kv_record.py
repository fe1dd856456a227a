"""KV-cache scales added by `calibrate-kv` after a calibrated quantize run: the card cites their own record."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from calibration.synthetic import write_stats
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.calibration import derived
from weightsmith.card.cite import Citations
from weightsmith.card.made import _calibration_lines
from weightsmith.io.manifest import Manifest


def test_card_cites_the_kv_record_not_the_quantize_runs(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    stats, recorded = write_stats(src, tmp_path / "stats.safetensors")
    result = quantize(QuantizeRequest(src, tmp_path / "w4a4", scheme="nvfp4", calibration=stats, workers=2))
    config = json.loads((result.output / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = derived.kv_cache_scheme("fp8")  # as calibrate-kv adds it
    kv = dataclasses.replace(recorded.provenance, tokens=12345, text="builtin:prose", activations="quantized")
    manifest = dataclasses.replace(result.manifest, kv_calibration=kv)
    back = Manifest.from_json(json.loads(json.dumps(manifest.to_json())))
    assert back.kv_calibration == kv and back.calibration == recorded.provenance

    activation, kv_line = _calibration_lines(back, config, Citations())
    assert "activation scales of nvfp4 measured" in activation and "KV-cache" not in activation
    assert "calibration.tokens -->" in activation
    assert "the KV-cache scales" in kv_line and "12,345<!-- weightsmith.json: kv_calibration.tokens -->" in kv_line
    assert "builtin:prose" in kv_line and "quantized model's own activations" in kv_line

    # calibrate-kv on a checkpoint without a record wrote both records alike: one line, the KV scales
    plain = dataclasses.replace(
        result.manifest, recipe=quantize(QuantizeRequest(src, tmp_path / "a16", scheme="w4a16")).manifest.recipe
    )
    (line,) = _calibration_lines(dataclasses.replace(plain, calibration=kv, kv_calibration=kv), config, Citations())
    assert "the KV-cache scales" in line and "kv_calibration.tokens" in line

    # a W4A4 run from statistics measured on its weight-only twin says so
    twin = dataclasses.replace(back, calibration=dataclasses.replace(recorded.provenance, activations="quantized"))
    activation, _ = _calibration_lines(twin, config, Citations())
    assert "activations of a quantization of the source model" in activation

    # one rule for "which record is the quantize run's", read by the card's lines and its publish section
    assert back.quantize_calibration == recorded.provenance
    assert dataclasses.replace(plain, calibration=kv, kv_calibration=kv).quantize_calibration is None
    assert dataclasses.replace(plain, calibration=None, kv_calibration=None).quantize_calibration is None
