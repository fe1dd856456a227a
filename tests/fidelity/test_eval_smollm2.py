"""`eval` on a real trained model: SmolLM2-135M as W4A16 group 64, on CPU through transformers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from eval_checkpoints import quantize

from weightsmith.fidelity.logits import OK, compare
from weightsmith.fidelity.weights import weight_error

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from models import fake_quant, quantized_modules, smollm2_fp32, stdlib_text

GROUP = 64


@pytest.fixture(scope="module")
def smollm2_w4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    orig, root = smollm2_fp32(), tmp_path_factory.mktemp("smollm2")
    yield orig, quantize(orig, root / "w4a16-g64", group=GROUP)
    shutil.rmtree(root, ignore_errors=True)  # a test run's disk stays bounded by a few checkpoints


def test_w4a16_g64_costs_what_the_end_to_end_test_measures(smollm2_w4: tuple[Path, Path]) -> None:
    orig, quant = smollm2_w4
    weights = weight_error(orig, quant)
    assert len(weights.layers) == 30 * 7 and weights.kept == ["model.embed_tokens"]
    assert 0.005 < weights.overall.rel_mse < 0.02  # int4 g64 RTN: SQNR near 19 dB

    report = compare(orig, quant, stdlib_text(), 512)
    assert report.status == OK and report.tokens == 512
    assert report.kl > 0
    assert 0.5 < report.top1_agreement < 1
    assert report.ppl_quant > report.ppl_orig
    # tests/quantize/test_smollm2_e2e.py, g64, same 512 tokens: fp32 ppl 6.867; ours and compressed-tensors'
    # own fake quantization both 12.025, top-1 0.6875, KL 0.5061 (float32 there, float64 here).
    assert report.ppl_orig == pytest.approx(6.867, abs=0.01)
    assert report.ppl_quant == pytest.approx(12.025, abs=0.01)
    assert report.top1_agreement == pytest.approx(0.6875, abs=0.005)
    assert report.kl == pytest.approx(0.5061, abs=0.001)


def _fake_quantized_copy(orig: Path, quantized: set[str], out: Path) -> Path:
    """ORIG with each quantized Linear replaced by compressed-tensors' own RTN round trip, saved."""
    fake_quant(orig, quantized, GROUP).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(orig / name, out / name)
    return out


def test_fake_quantized_original_predicts_as_quant(smollm2_w4: tuple[Path, Path], tmp_path: Path) -> None:
    """With ORIG replaced by a fake-quantized copy, QUANT as loaded through compressed-tensors agrees."""
    orig, quant = smollm2_w4
    quantized = quantized_modules(quant)
    fake = _fake_quantized_copy(orig, quantized, tmp_path / "fake")
    report = compare(fake, quant, stdlib_text(), 128)
    assert report.status == OK and report.tokens == 128
    assert report.kl < 1e-6
    assert report.top1_agreement == 1.0
    assert report.ppl_quant == pytest.approx(report.ppl_orig, rel=1e-5)
    assert report.ppl_orig > 8  # the fake copy really is quantized (fp32 SmolLM2: about 6.9)
