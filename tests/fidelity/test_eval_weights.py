"""Weight error: per layer it is exactly what int4 dequantization gives; sums and ratios add up."""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from eval_checkpoints import load_tensors, quantize, write_fp8

from synth import LLAMA_CONFIG, llama_tensors
from weightsmith.fidelity.weights import relative_mse, sqnr_db, squared_error, weight_error
from weightsmith.formats.source import TensorReader
from weightsmith.io import names
from weightsmith.schemes import int4 as int4_scheme

KEPT = "model.layers.1.mlp.down_proj"


def _direct_rel_mse(w: np.ndarray, packed: dict[str, np.ndarray], module: str, group: int) -> float:
    """||W - dequant||^2 / ||W||^2 from int4_scheme.dequantize, computed here in one float64 pass."""
    zp = packed.get(f"{module}.{names.WEIGHT_ZERO_POINT}")
    shape = tuple(int(v) for v in packed[f"{module}.{names.WEIGHT_SHAPE}"])
    weight = int4_scheme.Int4Weight(
        packed[f"{module}.{names.WEIGHT_PACKED}"], packed[f"{module}.{names.WEIGHT_SCALE}"], zp, shape
    )
    w64 = w.astype(np.float64)
    q64 = int4_scheme.dequantize(weight, group).astype(np.float64)
    return float(np.sum(np.square(w64 - q64))) / float(np.sum(np.square(w64)))


@pytest.fixture(scope="module")
def with_kept(synthetic: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantize(synthetic, tmp_path_factory.mktemp("kept") / "q", ignore=(KEPT,))


def test_layer_error_equals_int4_dequantize(synthetic: Path, with_kept: Path) -> None:
    report = weight_error(synthetic, with_kept)
    src, out = load_tensors(synthetic), load_tensors(with_kept)
    quantized = {n.rsplit(".", 1)[0] for n in out if n.endswith("." + names.WEIGHT_PACKED)}
    assert [layer.module for layer in report.layers] == sorted(quantized, key=lambda m: (int(m.split(".")[2]), m)), (
        "every quantized module once, in layer order"
    )
    assert len(report.layers) == 13
    for layer in report.layers:
        expected = _direct_rel_mse(src[f"{layer.module}.weight"], out, layer.module, 64)
        assert layer.rel_mse == expected, layer.module
        assert layer.sqnr_db == -10 * math.log10(expected)
        assert layer.shape == list(src[f"{layer.module}.weight"].shape)
        assert layer.format == "pack-quantized" and layer.group == "W4A16"
        assert 1e-3 < layer.rel_mse < 0.1  # int4 g64 on Gaussian weights: about 1 %
    assert KEPT not in quantized
    assert KEPT in report.kept and "lm_head" in report.kept and "model.embed_tokens" in report.kept
    assert not set(report.kept) & quantized
    assert report.unsupported == []
    assert report.source_format == "dense"


def test_categories_and_overall_add_up(synthetic: Path, with_kept: Path) -> None:
    report = weight_error(synthetic, with_kept)
    by_name = {c.name: c for c in report.categories}
    assert set(by_name) == {"attention", "dense mlp"}
    for name, summary in by_name.items():
        members = [layer for layer in report.layers if layer.category == name]
        assert summary.layers == len(members)
        assert summary.numel == sum(layer.numel for layer in members)
        assert summary.sq_error == pytest.approx(sum(layer.sq_error for layer in members), rel=1e-12)
        assert summary.sq_norm == pytest.approx(sum(layer.sq_norm for layer in members), rel=1e-12)
        assert summary.rel_mse == pytest.approx(summary.sq_error / summary.sq_norm, rel=1e-12)
        assert summary.sqnr_db == pytest.approx(-10 * math.log10(summary.rel_mse), rel=1e-12)
    overall = report.overall
    assert overall.layers == len(report.layers) == sum(c.layers for c in report.categories)
    assert overall.numel == sum(c.numel for c in report.categories)
    assert overall.rel_mse == pytest.approx(
        sum(c.sq_error for c in report.categories) / sum(c.sq_norm for c in report.categories), rel=1e-12
    )
    # The overall ratio is a weighted mean, so it lies between the categories'.
    rels = [c.rel_mse for c in report.categories]
    assert min(rels) <= overall.rel_mse <= max(rels)


def test_asymmetric_has_lower_error_than_symmetric(synthetic: Path, synthetic_w4: Path, tmp_path: Path) -> None:
    asym = quantize(synthetic, tmp_path / "asym", scheme="w4a16-asym")
    sym_report, asym_report = weight_error(synthetic, synthetic_w4), weight_error(synthetic, asym)
    assert asym_report.overall.rel_mse < sym_report.overall.rel_mse
    assert {layer.group for layer in asym_report.layers} == {"W4A16_ASYM"}
    out = load_tensors(asym)
    src = load_tensors(synthetic)
    for layer in asym_report.layers:  # zero points are used: the exact match holds here too
        assert layer.rel_mse == _direct_rel_mse(src[f"{layer.module}.weight"], out, layer.module, 64)


@pytest.mark.parametrize("style", ["hf-fp8", "ct-fp8"])
def test_fp8_original_is_decoded_as_the_quantizer_decodes(tmp_path: Path, style: str) -> None:
    """FP8 originals: the reference is the BF16 the quantizer decoded and then quantized."""
    src = tmp_path / "fp8"
    decoded = write_fp8(src, llama_tensors(), LLAMA_CONFIG, style)
    out = quantize(src, tmp_path / "q", group=128)

    report = weight_error(src, out)
    assert report.source_format == style
    packed = load_tensors(out)
    assert len(report.layers) == 14
    for layer in report.layers:
        assert layer.rel_mse == _direct_rel_mse(decoded[f"{layer.module}.weight"], packed, layer.module, 128)


def test_chunked_sums_equal_one_pass() -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((300, 70)).astype(ml_dtypes.bfloat16)
    q = (w.astype(np.float32) + rng.standard_normal(w.shape).astype(np.float32) * 0.01).astype(ml_dtypes.bfloat16)
    whole = squared_error(w, q)
    for chunk in (1, 70, 1000, 69 * 70):
        err, norm = squared_error(w, q, chunk_elements=chunk)
        assert err == pytest.approx(whole[0], rel=1e-12) and norm == pytest.approx(whole[1], rel=1e-12)
    d = w.astype(np.float64) - q.astype(np.float64)
    assert whole[0] == pytest.approx(float((d * d).sum()), rel=1e-12) and whole[0] > 0


def test_ratios_of_edge_cases() -> None:
    assert relative_mse(0.0, 0.0) == 0.0 and sqnr_db(0.0) == math.inf
    assert relative_mse(1.0, 0.0) == math.inf and sqnr_db(math.inf) == -math.inf
    assert sqnr_db(relative_mse(1.0, 100.0)) == pytest.approx(20.0)


def test_reads_one_module_at_a_time(synthetic: Path, synthetic_w4: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shapes are checked first; then each tensor is read once, module by module, and a module's
    arrays are gone before the next module is read."""
    original_read = TensorReader.read
    shape_reads: list[str] = []
    reads: list[str] = []
    alive: dict[str, list[weakref.ref]] = {}

    def tracking_read(self: TensorReader, name: str) -> np.ndarray:
        module = names.split(name)[0]
        if name.endswith("." + names.WEIGHT_SHAPE) and not reads and name not in shape_reads:
            shape_reads.append(name)  # the up-front check: 16 bytes per module
            return original_read(self, name)
        for earlier, refs in alive.items():
            if earlier != module:
                assert all(r() is None for r in refs), f"{earlier} still in memory while reading {name}"
        array = original_read(self, name)
        reads.append(name)
        alive.setdefault(module, []).append(weakref.ref(array))
        return array

    monkeypatch.setattr(TensorReader, "read", tracking_read)
    report = weight_error(synthetic, synthetic_w4)
    assert len(shape_reads) == len(report.layers) == 14
    assert len(reads) == len(set(reads)) == 14 * 4  # weight_packed, weight_scale, weight_shape, weight
    modules = [names.split(n)[0] for n in reads]
    order = list(dict.fromkeys(modules))
    assert modules == sorted(modules, key=order.index), "reads of one module are not interleaved with another's"
    assert set(order) == {layer.module for layer in report.layers}


def test_unsupported_format_is_listed_not_raised(
    synthetic: Path, synthetic_w4: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_yet(fmt: str, weights: dict, params: dict) -> np.ndarray:
        raise NotImplementedError(f"dequantizing {fmt}")

    from weightsmith.formats import compressors

    monkeypatch.setattr(compressors, "decompress", not_yet)
    report = weight_error(synthetic, synthetic_w4)
    assert report.layers == [] and report.categories == []
    assert len(report.unsupported) == 14
    assert {u.format for u in report.unsupported} == {"pack-quantized"}
    assert report.unsupported[0].reason == "dequantizing pack-quantized"
    assert report.overall.layers == 0 and math.isnan(report.overall.rel_mse)
