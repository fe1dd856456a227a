"""The as-served path on the command line: calibrate a weight-only twin, quantize SRC with its statistics,
and eval applies the stored activation scales (streamed and in memory alike)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import run
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.calibration import stats_file
from weightsmith.io.manifest import load_manifest


def _eval(capsys, monkeypatch, orig: Path, quant: Path, *extra: str) -> dict:
    code, out, err = run(capsys, monkeypatch, "eval", orig, quant, "--json", "--tokens", 100, *extra)
    assert code == 0, err
    return json.loads(out)["logits"]


def test_w4a4_from_statistics_measured_as_served(tiny_llama: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    a16 = quantize(QuantizeRequest(tiny_llama, tmp_path / "a16", scheme="nvfp4a16", workers=2)).output
    served = tmp_path / "served.safetensors"
    args = ("calibrate", a16, "--out", served, "--tokens", 128, "--seq-len", 64)
    code, _, err = run(capsys, monkeypatch, *args)
    assert code == 0, err
    p = stats_file.read(served).provenance
    assert (
        p.activations == "quantized"
        and p.source_fingerprint == load_manifest(a16 / "weightsmith.json").source.fingerprint
    )

    code, out, err = run(capsys, monkeypatch, "quantize", tiny_llama, tmp_path / "w4a4", "--scheme", "nvfp4",
                         "--calibration", served)  # fmt: skip
    assert code == 0, err
    assert "quantized activations" in out
    cal = load_manifest(tmp_path / "w4a4" / "weightsmith.json").calibration
    assert cal is not None and cal.activations == "quantized" and cal.source_fingerprint == p.source_fingerprint

    weight_only = _eval(capsys, monkeypatch, tiny_llama, a16, "--stream")
    stream = _eval(capsys, monkeypatch, tiny_llama, tmp_path / "w4a4", "--stream")
    memory = _eval(capsys, monkeypatch, tiny_llama, tmp_path / "w4a4")
    # same weights as the weight-only twin: the difference is the inputs quantized with the stored scales
    assert stream["kl"] != weight_only["kl"]
    for key in ("kl", "top1_agreement", "ppl_orig", "ppl_quant"):
        assert stream[key] == pytest.approx(memory[key], rel=1e-4, abs=1e-4), key


def test_static_fp8_inputs_are_quantized_in_the_streamed_eval_too(tiny_llama: Path, tmp_path: Path) -> None:
    """The engine runs a static FP8 checkpoint as an FP8 original (weights decoded); its inputs are still
    quantized with the stored input_scale, exactly as the hooks compute them."""
    import torch

    from calibration.synthetic import write_stats
    from weightsmith.fidelity.streamed import _final_hidden

    stats, _ = write_stats(tiny_llama, tmp_path / "stats.safetensors")
    fp8 = quantize(QuantizeRequest(tiny_llama, tmp_path / "fp8", scheme="fp8", calibration=stats, workers=2)).output
    ids = torch.arange(100, 164).reshape(1, -1)
    served = _final_hidden(fp8, ids, False, None, served=True)
    weights_only = _final_hidden(fp8, ids, False, None)
    assert not torch.equal(served, weights_only)
    assert torch.equal(
        _final_hidden(tiny_llama, ids, False, None, served=True), _final_hidden(tiny_llama, ids, False, None)
    )
