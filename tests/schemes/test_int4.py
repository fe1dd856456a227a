"""Int4 group RTN: exact against compressed-tensors' own functions, and round trips through its decompressor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from weightsmith.formats.compressors.pack_quantized import PackQuantized
from weightsmith.quant import int4_unsupported
from weightsmith.schemes import int4 as int4_scheme

torch = pytest.importorskip("torch")
ct_q = pytest.importorskip("compressed_tensors.quantization")

DTYPES = [(ml_dtypes.bfloat16, "bfloat16"), (np.float16, "float16"), (np.float32, "float32")]


def _awkward(dtype: object, rows: int = 64, cols: int = 512, seed: int = 0) -> np.ndarray:
    """Weights with the cases that break naive emulation: zero groups, tiny and huge groups, ties."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
    w[0, :128] = 0.0  # all-zero group: eps scale, asymmetric NaN zero point
    w[1, 128:256] = 1e-7  # below fp16 normals
    w[2, :128] = np.linspace(-1, 1, 128)  # exact ties at half steps
    w[3, 256:384] *= 1000
    w[4, :] = np.abs(w[4, :])  # one-signed rows: asymmetric ranges clip at zero
    w[5, :] = -np.abs(w[5, :])
    w[6, :128] = 3.0  # constant group
    # the range is read from the stored bits: signed zeros and subnormals of either sign must not fool it
    w[7, :128] = -0.0
    w[7, 128:256] = np.where(np.arange(128) % 2, -0.0, 0.0)
    w[7, 256:384] = -np.abs(w[7, 256:384]) * 1e-36  # float32 subnormals, zero in bf16/fp16
    w[8, :128] = np.where(np.arange(128) % 3, -1e-39, 2e-39)
    out = w.astype(dtype)
    out[9, :128] = np.where(np.arange(128) % 2, -1, 1) * ml_dtypes.finfo(dtype).smallest_subnormal
    return out


def _reference(w: np.ndarray, torch_dtype: str, group: int, symmetric: bool) -> tuple[np.ndarray, ...]:
    """compressed-tensors' calculate_qparams + _quantize on CPU, exactly as model_free_ptq runs them."""
    from compressed_tensors.quantization.lifecycle.forward_helpers import _quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = ct_q.QuantizationArgs(
        num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=group,
        zp_dtype=None if symmetric else torch.int8,
    )  # fmt: skip
    rows, cols = w.shape
    x = torch.from_numpy(w.astype(np.float32)).to(getattr(torch, torch_dtype)).reshape(rows, cols // group, group)
    scale, zp = calculate_qparams(x.amin(-1), x.amax(-1), args)
    q = _quantize(
        x, scale.unsqueeze(-1), None if symmetric else zp.unsqueeze(-1), torch.tensor(-8), torch.tensor(7), args
    )
    return q.reshape(rows, cols).to(torch.int8).numpy(), scale.float().numpy(), zp.to(torch.int8).numpy()


@pytest.mark.parametrize("dtype,torch_dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [32, 128])
def test_kernel_matches_compressed_tensors(dtype: object, torch_dtype: str, symmetric: bool, group: int) -> None:
    for seed in range(3):
        w = _awkward(dtype, seed=seed)
        ours = int4_scheme.quantize(w, group, symmetric)
        q, scale, zp = _reference(w, torch_dtype, group, symmetric)
        assert np.array_equal(PackQuantized.unpack(ours.packed, 4, w.shape[1], axis=1), q)
        assert np.array_equal(ours.scale.astype(np.float32), scale)
        assert ours.scale.dtype == np.dtype(dtype)
        if symmetric:
            assert ours.zero_point is None
        else:
            assert np.array_equal(PackQuantized.unpack(ours.zero_point, 4, w.shape[0], axis=0), zp)


@pytest.mark.parametrize("dtype,torch_dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_dequantize_matches_compressed_tensors_decompressor(dtype: object, torch_dtype: str, symmetric: bool) -> None:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    w = _awkward(dtype, rows=40)  # 40 rows: zero points pack into a partial last word
    ours = int4_scheme.quantize(w, 128, symmetric)
    ours_deq = int4_scheme.dequantize(ours, 128)
    assert ours_deq.dtype == np.dtype(dtype)

    scheme = ct_q.QuantizationScheme(
        targets=["Linear"],
        weights=ct_q.QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=128),
    )
    state = {
        "weight_packed": torch.from_numpy(ours.packed),
        "weight_scale": torch.from_numpy(ours.scale.astype(np.float32)).to(getattr(torch, torch_dtype)),
        "weight_shape": torch.tensor(w.shape),
    }
    if not symmetric:
        state["weight_zero_point"] = torch.from_numpy(ours.zero_point)
    theirs = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
    assert np.array_equal(theirs.float().numpy(), ours_deq.astype(np.float32))
    # And the round trip is close to the input: at most half a step per element, one step where clipped.
    step = np.repeat(ours.scale.astype(np.float32), 128, axis=1)
    assert np.all(np.abs(ours_deq.astype(np.float32) - w.astype(np.float32)) <= step * 1.01 + 1e-30)


def test_packing_matches_documented_examples() -> None:
    def words(q: list[int]) -> list[str]:
        return [hex(int(v)) for v in PackQuantized.pack(np.array([q]), 4, axis=1)[0].view(np.uint32)]

    assert words(list(range(-8, 8))) == ["0x76543210", "0xfedcba98"]
    assert words([1, 0, 0, 0, 0, 0, 0, 0]) == ["0x88888889"]
    assert words([0, 0, 0, 0, 0, 0, 0, 1]) == ["0x98888888"]
    q = np.random.default_rng(0).integers(-8, 8, size=(13, 24))
    assert np.array_equal(PackQuantized.unpack(PackQuantized.pack(q, 4, axis=0), 4, 13, axis=0), q)


@pytest.mark.parametrize("dtype", [d for d, _ in DTYPES])
def test_non_finite_and_bad_shapes_are_refused(dtype: object) -> None:
    for bad in (np.nan, np.inf, -np.inf, -np.nan):
        w = np.zeros((8, 256), dtype)
        w[3, 77] = bad
        w[3, 100] = np.nan  # the first one in the group is the one reported
        with pytest.raises(ValueError, match="row 3, column 77"):
            int4_scheme.quantize(w)
        with pytest.raises(ValueError, match="row 3, column 77"):
            int4_scheme.quantize(w, symmetric=False)
    assert int4_unsupported(576, 128) == "input size 576 is not a multiple of the group size 128"
    assert int4_unsupported(576, 64) is None


def test_format_level_dequantize_reads_disk_parameters() -> None:
    from weightsmith.formats import compressed_tensors as ct
    from weightsmith.formats import compressors

    w = _awkward(ml_dtypes.bfloat16, rows=16, cols=256)
    for symmetric in (True, False):
        q = int4_scheme.quantize(w, 128, symmetric)
        params = {"weight_packed": q.packed, "weight_scale": q.scale, "weight_shape": np.array(w.shape, np.int64)}
        if not symmetric:
            params["weight_zero_point"] = q.zero_point
        args = ct.weight_args(4, symmetric, 128)
        assert np.array_equal(compressors.decompress(ct.PACK_QUANTIZED, args, params), int4_scheme.dequantize(q, 128))
    with pytest.raises(NotImplementedError):
        compressors.decompress("float-quantized", {"num_bits": 8}, {})
