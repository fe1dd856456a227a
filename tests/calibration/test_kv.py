"""`calibrate-kv` on SmolLM2-135M: KV-cache scales measured and added to a quantized checkpoint.

From the original (`--from`): each scale is exactly the engine's maximum for the same tokens / 448.
On the quantized checkpoint itself: its own activations (layers dequantized), recorded as such.
Either way the result verifies clean with a k and a v scale per attention layer, declares the
cache in config.json, records the provenance in the manifest and the new shard, and a second run
replaces the scales only with --force.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from models import smollm2_fp32
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.audit.verify import verify
from weightsmith.calibration.kv import SHARD, calibrate_kv
from weightsmith.core.errors import CheckpointError
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.safetensors.header import read_header
from weightsmith.safetensors.reader import ShardReader

pytest.importorskip("transformers")

TOKENS, SEQ_LEN = 256, 128


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("q")
    yield quantize(QuantizeRequest(smollm2_fp32(), root / "w4a16", scheme="w4a16", workers=2)).output
    shutil.rmtree(root, ignore_errors=True)  # 0.4 GB: a test run's disk stays bounded by a few such


def _copy(quantized: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(quantized, tmp_path / "quant"))


def _scales(folder: Path) -> dict[str, float]:
    with ShardReader(folder / SHARD) as reader:
        return {name: float(reader.read(name)[0]) for name in read_header(folder / SHARD).tensors}


def test_from_the_original(quantized: Path, tmp_path: Path) -> None:
    from weightsmith.calibration.measure import calibration_tokens, measure

    quant = _copy(quantized, tmp_path)
    out, entry = calibrate_kv(quant, smollm2_fp32(), builtin="code", tokens=TOKENS, seq_len=SEQ_LEN)
    assert out == quant and entry["activations"] == "original" and entry["tokens"] == TOKENS
    sequences = calibration_tokens(smollm2_fp32(), None, "code", TOKENS, SEQ_LEN).sequences
    kv, _ = measure(smollm2_fp32(), sequences)
    scales = _scales(quant)
    assert len(scales) == 60
    for attention, (k, v) in kv.items():
        assert scales[f"{attention}.k_scale"] == np.float32(np.float32(k) / np.float32(448))
        assert scales[f"{attention}.v_scale"] == np.float32(np.float32(v) / np.float32(448))
    report = verify(quant)
    assert report.clean, report.findings
    config = json.loads((quant / "config.json").read_text())["quantization_config"]
    assert config["kv_cache_scheme"]["num_bits"] == 8 and config["kv_cache_scheme"]["dynamic"] is False
    # the w4a16 run had no calibration record: this one becomes it, and the card says so
    recorded = json.loads((quant / "weightsmith.json").read_text())["calibration"]
    assert recorded == {k: entry[k] for k in recorded} and recorded["activations"] == "original"
    assert json.loads(read_header(quant / SHARD).metadata["calibration"]) == entry

    # a second run refuses without --force, and with it replaces the set (no second copy)
    with pytest.raises(CheckpointError, match="already has KV-cache scales"):
        calibrate_kv(quant, smollm2_fp32(), builtin="code", tokens=TOKENS, seq_len=SEQ_LEN)
    calibrate_kv(quant, smollm2_fp32(), builtin="prose", tokens=TOKENS, seq_len=SEQ_LEN, force=True)
    assert set(_scales(quant)) == set(scales) and _scales(quant) != scales
    assert sum(names.is_kv_scale_name(n) for n in Checkpoint.open(quant).tensors) == 60
    assert verify(quant).clean
    # the first record stays; the KV scales' own record says they now come from the prose
    manifest = json.loads((quant / "weightsmith.json").read_text())
    assert manifest["calibration"] == recorded and manifest["kv_calibration"]["text"].startswith("builtin:prose")


def test_on_the_quantized_checkpoint_itself(quantized: Path, tmp_path: Path) -> None:
    quant = _copy(quantized, tmp_path)
    _, entry = calibrate_kv(quant, builtin="code", tokens=TOKENS, seq_len=SEQ_LEN)
    assert entry["activations"] == "quantized" and entry["measured_on"] == str(quant)
    ours = _scales(quant)
    reference = _copy(quantized, tmp_path / "ref")
    calibrate_kv(reference, smollm2_fp32(), builtin="code", tokens=TOKENS, seq_len=SEQ_LEN)
    original = _scales(reference)
    # int4 weights move the activations a little: close to the original's scales, not equal to them
    ratios = np.array([ours[n] / original[n] for n in original])
    assert np.all(np.abs(ratios - 1) < 0.5) and np.any(ratios != 1)
    assert verify(quant).clean
