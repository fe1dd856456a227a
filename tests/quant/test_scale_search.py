"""Scale searches: llm-compressor's memoryless_mse reproduced exactly; ours at least as good, and exact in format."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.compressors.pack_quantized import PackQuantized
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import int4_search
from weightsmith.schemes import int4 as int4_scheme
from weightsmith.schemes import make_scheme

torch = pytest.importorskip("torch")
pytest.importorskip("llmcompressor")

IGNORE = ["lm_head", "model.embed_tokens"]


def _weights(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
    w *= np.exp(0.3 * rng.standard_normal((rows, 1))).astype(np.float32)
    w[rng.random(w.shape) < 2e-3] *= 8
    w[0, :128] = 0.0
    return w.astype(ml_dtypes.bfloat16)


def _memoryless(w: np.ndarray) -> np.ndarray:
    masks = np.zeros((w.shape[0], w.shape[1] // 128), np.uint32)
    improved = np.zeros(20, np.bool_)
    assert int4_search.memoryless_steps(w.view(np.uint16), 1, 128, masks, improved) == -1
    return int4_search.memoryless_choice(masks, improved)


def _reference_scale(w: np.ndarray) -> np.ndarray:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams
    from llmcompressor.observers.mse_quant import _grid_search_mse

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=128)
    token_args = args.model_copy(update={"strategy": QuantizationStrategy.TOKEN})
    t = torch.from_numpy(w.view(np.int16)).view(torch.bfloat16)
    lo, hi = _grid_search_mse(t.unflatten(-1, (-1, 128)).unsqueeze(0), args, token_args, 0.2, 5, 100.0, 2.4, 0.3, 1.0)
    scale, _ = calculate_qparams(lo, hi, args)
    return scale.view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("rows,cols,seed", [(64, 512, 0), (256, 1024, 1), (1, 256, 2), (2, 128, 3)])
def test_memoryless_matches_llmcompressor_observer(rows: int, cols: int, seed: int) -> None:
    # Tiny tensors stop early (few groups, so soon no group improves): the tensor-wide patience rule matters.
    w = _weights(rows, cols, seed)
    ours = int4_scheme.quantize(w, 128, True, _memoryless(w))
    assert np.array_equal(ours.scale.view(np.uint16), _reference_scale(w))


def test_memoryless_early_stop_is_tensor_wide() -> None:
    masks = np.array([[0b1], [0b1000001]], np.uint32)  # group 1 improves again at step 6
    improved = np.zeros(20, np.bool_)
    improved[[0, 6]] = True
    # Steps 1..5 improve nothing: the observer stops at step 5 and never sees step 6.
    assert np.all(int4_search.memoryless_choice(masks, improved) == np.float32(1.0))
    improved[3] = True
    masks[1, 0] |= 0b1000
    choice = int4_search.memoryless_choice(masks, improved)
    assert choice[1, 0] == np.float32(1 - 6 / 100) and choice[0, 0] == np.float32(1.0)


def test_memoryless_checkpoint_is_byte_identical_to_model_free_ptq(tmp_path: Path) -> None:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import model_free_ptq

    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    args = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=128, observer="memoryless_mse"
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    model_free_ptq(str(src), str(tmp_path / "ref"), scheme=scheme, ignore=IGNORE, device="cpu")
    quantize(
        QuantizeRequest(
            src,
            tmp_path / "ours",
            scheme="w4a16",
            group_size=128,
            ignore=IGNORE,
            workers=2,
            scale_search="memoryless_mse",
            pre_pass=None,
        )
    )
    for shard in Checkpoint.open(tmp_path / "ref").headers:
        assert (tmp_path / "ours" / shard).read_bytes() == (tmp_path / "ref" / shard).read_bytes(), shard
    plain = tmp_path / "rtn"
    quantize(
        QuantizeRequest(
            src, plain, scheme="w4a16", group_size=128, ignore=IGNORE, workers=2, scale_search="none", pre_pass=None
        )
    )
    shard = "model-00001-of-00002.safetensors"
    assert (plain / shard).read_bytes() != (tmp_path / "ours" / shard).read_bytes()  # the search changed something


def _rel_mse(w: np.ndarray, q: int4_scheme.Int4Weight) -> float:
    a = w.astype(np.float64)
    return float(((int4_scheme.dequantize(q, 128).astype(np.float64) - a) ** 2).sum() / (a**2).sum())


@pytest.mark.parametrize("seed", range(3))
def test_our_search_beats_rtn_and_matches_memoryless_on_weight_error(seed: int) -> None:
    w = _weights(512, 1024, seed)
    shrink = np.empty((512, 8), np.float32)
    assert int4_search.search_mse(w.view(np.uint16), 1, 128, shrink) == -1
    assert np.all((shrink <= 1) & (shrink >= 0.6))
    rtn = _rel_mse(w, int4_scheme.quantize(w, 128))
    memoryless = _rel_mse(w, int4_scheme.quantize(w, 128, True, _memoryless(w)))
    ours = _rel_mse(w, int4_scheme.quantize(w, 128, True, shrink))
    assert ours < 0.88 * rtn  # at least 12 % lower weight error
    # Its |e|^2.5 objective trades a little weight MSE for next-token KL (docs/fidelity-smollm2.md).
    assert ours <= 1.01 * memoryless


def test_search_kernels_refuse_non_finite_values() -> None:
    w = _weights(16, 256, 0).astype(np.float32)
    w[5, 200] = np.nan
    w = w.astype(ml_dtypes.bfloat16)
    shrink = np.empty((16, 2), np.float32)
    assert int4_search.search_mse(w.view(np.uint16), 1, 128, shrink) == 5 * 256 + 200
    masks, improved = np.zeros((16, 2), np.uint32), np.zeros(20, np.bool_)
    assert int4_search.memoryless_steps(w.view(np.uint16), 1, 128, masks, improved) == 5 * 256 + 200


@pytest.mark.parametrize("search", ["mse", "wmse", "noclip"])
def test_a_non_finite_value_under_a_search_reaches_the_caller_as_its_index(search: str) -> None:
    w = _weights(16, 256, 0).astype(np.float32)
    w[5, 200] = np.nan
    writes, bad = make_scheme("w4a16", 128, search).encode(w.astype(ml_dtypes.bfloat16), 0, (16, 256))
    assert (writes, bad) == ([], 5 * 256 + 200)


@pytest.mark.parametrize("seed", range(2))
def test_asymmetric_search_beats_asymmetric_rtn_and_stays_exact_in_format(seed: int) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward_helpers import _quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    w = _weights(256, 1024, seed)
    shrink = np.empty((256, 8), np.float32)
    assert int4_search.search_mse(w.view(np.uint16), 1, 128, shrink, symmetric=False) == -1
    assert np.any(shrink < 1) and np.all((shrink <= 1) & (shrink >= 0.6))
    ours = int4_scheme.quantize(w, 128, False, shrink)
    assert _rel_mse(w, ours) < 0.95 * _rel_mse(w, int4_scheme.quantize(w, 128, False))
    # the clipped range goes through compressed-tensors' own qparams and quantizer, as the observers do it
    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=128,
                            zp_dtype=torch.int8)  # fmt: skip
    x = torch.from_numpy(w.view(np.int16)).view(torch.bfloat16).reshape(256, 8, 128)
    # the observers multiply a BF16 range by a Python float: computed in float32, rounded to BF16
    p = torch.from_numpy(shrink)
    lo = torch.clamp((x.amin(-1).float() * p).to(torch.bfloat16), max=0)
    hi = torch.clamp((x.amax(-1).float() * p).to(torch.bfloat16), min=0)
    scale, zp = calculate_qparams(lo, hi, args)
    q = _quantize(x, scale.unsqueeze(-1), zp.unsqueeze(-1), torch.tensor(-8), torch.tensor(7), args)
    codes = q.reshape(256, 1024).to(torch.int8).numpy()
    assert np.array_equal(PackQuantized.unpack(ours.packed, 4, 1024, axis=1), codes)
    assert np.array_equal(ours.scale.view(np.uint16), scale.view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(PackQuantized.unpack(ours.zero_point, 4, 256, axis=0), zp.to(torch.int8).numpy())


def test_search_modes_and_names() -> None:
    assert make_scheme("w4a16-asym", 128, "mse").scale_search == "mse"
    with pytest.raises(WeightsmithError, match="symmetric observer"):
        make_scheme("w4a16-asym", 128, "memoryless_mse")
    with pytest.raises(WeightsmithError, match="unknown scale search"):
        make_scheme("w4a16", 128, "bogus")
    assert (
        make_scheme("w4a16", 128, "memoryless_mse").quantization_config([])["config_groups"]["W4A16"]["weights"][
            "observer"
        ]
        == "memoryless_mse"
    )


def test_noclip_puts_each_groups_extremes_on_the_grid_ends_and_stays_exact_in_format() -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    w = _weights(64, 512, 4)
    shrink = np.empty((64, 4), np.float32)
    assert int4_search.search_noclip(w.view(np.uint16), 1, 128, shrink) == -1
    assert np.any(shrink > 1) and np.any(shrink < 1)  # wider where the maximum is positive, narrower otherwise
    ours = int4_scheme.quantize(w, 128, True, shrink)
    g = w.astype(np.float32).reshape(64, 4, 128)
    dq = int4_scheme.dequantize(ours, 128).astype(np.float32).reshape(64, 4, 128)
    rtn = int4_scheme.dequantize(int4_scheme.quantize(w, 128), 128).astype(np.float32).reshape(64, 4, 128)
    absmax = np.abs(g).max(-1)
    live = absmax > 0
    # the end that sets the scale (max / 7 or -min / 8) lands on the grid's end, off only by BF16 rounding;
    # RTN's absmax / 7.5 step leaves the largest weight absmax / 15 off
    at = np.where((g.max(-1) / 7 >= -g.min(-1) / 8), g.argmax(-1), g.argmin(-1))[..., None]
    assert np.all(np.abs(np.take_along_axis(dq - g, at, -1))[..., 0][live] <= absmax[live] * 2**-6)
    big = np.abs(g).argmax(-1)[..., None]
    assert np.allclose(np.abs(np.take_along_axis(rtn - g, big, -1))[..., 0][live] / absmax[live], 1 / 15, atol=0.01)
    # the range scaled by the factor goes through compressed-tensors' own qparams
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=128)
    x = torch.from_numpy(w.view(np.int16)).view(torch.bfloat16).reshape(64, 4, 128)
    p = torch.from_numpy(shrink)
    lo = torch.clamp((x.amin(-1).float() * p).to(torch.bfloat16), max=0)
    hi = torch.clamp((x.amax(-1).float() * p).to(torch.bfloat16), min=0)
    scale, _ = calculate_qparams(lo, hi, args)
    assert np.array_equal(ours.scale.view(np.uint16), scale.view(torch.int16).numpy().view(np.uint16))
    with pytest.raises(WeightsmithError, match="noclip sets a symmetric scale"):
        make_scheme("w4a16-asym", 128, "noclip")


@pytest.mark.parametrize("symmetric", [True, False])
def test_wmse_lowers_the_magnitude_weighted_error_and_leaves_mse_unchanged(symmetric: bool) -> None:
    w = _weights(256, 1024, 5)
    a = w.astype(np.float64)

    def weighted(shrink: np.ndarray | None) -> float:
        d = int4_scheme.dequantize(int4_scheme.quantize(w, 128, symmetric, shrink), 128).astype(np.float64) - a
        return float((np.abs(a) * d * d).sum())

    ours, default, power = (np.empty((256, 8), np.float32) for _ in range(3))
    assert int4_search.search_mse(w.view(np.uint16), 1, 128, ours, symmetric, int4_search.MAGNITUDE) == -1
    assert int4_search.search_mse(w.view(np.uint16), 1, 128, default, symmetric) == -1
    assert int4_search.search_mse(w.view(np.uint16), 1, 128, power, symmetric, int4_search.POWER25) == -1
    assert np.array_equal(default, power)
    assert not np.array_equal(ours, default)
    assert np.any(ours > 1) and np.any(ours < 1)  # it widens some groups and clips others
    assert weighted(ours) < weighted(None) and weighted(ours) <= weighted(default)
