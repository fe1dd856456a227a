"""Eval's input fake-quantization equals compressed-tensors' own `forward_quantize` (what vLLM computes)."""

from __future__ import annotations

import pytest

from weightsmith.api import QuantizeRequest
from weightsmith.fidelity.activations import fake_quantizer
from weightsmith.quant import nvfp4
from weightsmith.quant.int4 import mode_of
from weightsmith.schemes import make_scheme

torch = pytest.importorskip("torch")
ct = pytest.importorskip("compressed_tensors.quantization")
forward_quantize = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward").forward_quantize


def _inputs() -> list:
    """Activations of several magnitudes, with an all-zero group, E2M1 ties and outliers."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 5, 64, generator=gen) * 3
    a[0, 0, :16] = 0
    a[0, 1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2)  # ties at a scale of 1
    b = torch.randn(7, 128, generator=gen) * torch.logspace(-3, 2, 128)
    b[3, 5] = 900.0  # beyond the calibrated maximum: clamped
    return [a, b]


def _ct(args: dict, x, **params):
    layer = torch.nn.Linear(x.shape[-1], 4)
    layer.quantization_status = ct.QuantizationStatus.FROZEN
    for name, value in params.items():
        setattr(layer, name, torch.nn.Parameter(torch.tensor([value], dtype=torch.float32), requires_grad=False))
    return forward_quantize(layer, x, "input", ct.QuantizationArgs(**args))


@pytest.mark.parametrize("amax", [40.0, 6.0, 1e-3])
def test_nvfp4_inputs_match_compressed_tensors(amax: float) -> None:
    args = make_scheme("nvfp4").input_args()
    g = float(nvfp4.global_scale(torch.tensor(amax).numpy(), mode_of(torch.zeros(1).numpy().dtype)))
    ours = fake_quantizer(args, g)
    for x in _inputs():
        assert torch.equal(ours(x), _ct(args, x, input_global_scale=g))
        assert not torch.equal(ours(x), x)


@pytest.mark.parametrize("amax", [40.0, 900.0, 0.5])
def test_static_fp8_inputs_match_compressed_tensors(amax: float) -> None:
    args = make_scheme("fp8").input_args()
    scale = amax / 448
    ours = fake_quantizer(args, scale)
    for x in _inputs():
        assert torch.equal(ours(x), _ct(args, x, input_scale=scale))
        assert not torch.equal(ours(x), x)


def test_the_fp4_grid_and_its_ties() -> None:
    from weightsmith.fidelity.activations import round_fp4

    x = torch.tensor([0.2, 0.25, 0.26, 0.75, 1.0, 1.25, 1.3, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1, -0.75, -5.1])
    want = [0, 0, 0.5, 1, 1, 1, 1.5, 2, 2, 3, 4, 4, 6, -1, -6]
    assert round_fp4(x).tolist() == want


def test_input_quantizers_come_from_the_checkpoints_config_and_scales(tmp_path) -> None:
    from calibration.synthetic import write_stats
    from synth import llama_tensors, write_checkpoint
    from weightsmith.api import quantize
    from weightsmith.fidelity.activations import input_quantizers
    from weightsmith.formats.declaration import quantized_modules
    from weightsmith.io.checkpoint import Checkpoint

    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    stats, _ = write_stats(src, tmp_path / "stats.safetensors")
    w4a4 = Checkpoint.open(
        quantize(QuantizeRequest(src, tmp_path / "w4a4", scheme="nvfp4", calibration=stats, workers=2)).output
    )
    a16 = Checkpoint.open(quantize(QuantizeRequest(src, tmp_path / "a16", scheme="nvfp4a16", workers=2)).output)
    found = input_quantizers(w4a4)
    assert set(found) == {qm.module for qm in quantized_modules(w4a4)}
    x = torch.randn(3, 64)
    assert all(not torch.equal(q(x), x) for q in found.values())
    assert input_quantizers(a16) == {} and input_quantizers(Checkpoint.open(src)) == {}
