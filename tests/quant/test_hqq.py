"""`--scale-search hqq`: HQQ's lp objective at least round-to-nearest's, integer zero points in range,
parameters exact in the weight dtype, and the output decoded by compressed-tensors as we decode it."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.compressors.pack_quantized import PackQuantized
from weightsmith.quant import int4, int4_hqq
from weightsmith.schemes import int4 as int4_scheme
from weightsmith.schemes import make_scheme
from weightsmith.searches import SEARCHES

DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]


def _weights(rows: int, cols: int, seed: int, dtype: object = ml_dtypes.bfloat16) -> np.ndarray:
    """LLM-like rows (scaled per row, a few outliers) and the awkward groups: all zero, constant, one-signed."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
    w *= np.exp(0.3 * rng.standard_normal((rows, 1))).astype(np.float32)
    w[rng.random(w.shape) < 2e-3] *= 8
    w[0, :128] = 0.0
    w[1, :128] = 0.01
    w[2] = np.abs(w[2])
    w[3] = -np.abs(w[3])
    w[4, :128] *= 1000  # residuals past the shrink operator's bound: the splitting's outlier branch
    return w.astype(dtype)


def _lp(w: np.ndarray, q: int4_scheme.Int4Weight, group: int) -> np.ndarray:
    """HQQ's objective per group: sum |w - dequant|^0.7."""
    d = np.abs(int4_scheme.dequantize(q, group).astype(np.float64) - w.astype(np.float64))
    return (d**int4_hqq.P).reshape(w.shape[0], -1, group).sum(-1)


def _rel_mse(w: np.ndarray, q: int4_scheme.Int4Weight, group: int) -> float:
    a = w.astype(np.float64)
    return float(((int4_scheme.dequantize(q, group).astype(np.float64) - a) ** 2).sum() / (a**2).sum())


def _params(w: np.ndarray, group: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = w.shape
    scale = np.empty((rows, cols // group), np.float32)
    zp = np.full((rows, cols // group), 99, np.int8)
    assert int4_hqq.search_hqq(int4.kernel_input(w), int4.mode_of(w.dtype), group, symmetric, scale, zp) == -1
    return scale, zp


def test_pow_approximation_is_close() -> None:
    from numba import njit

    pow_abs = njit(lambda v, p: int4_hqq._pow_abs(v, p))
    for v in (1e-30, 3e-8, 1e-3, 0.0173, 0.5, 1.0, 7.25, 1e4, -2.5e-3):
        for p in (0.7, -0.3):
            assert abs(pow_abs(np.float32(v), np.float32(p)) / abs(v) ** p - 1) < 3e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_lp_error_is_never_above_round_to_nearest(dtype: object, symmetric: bool) -> None:
    w = _weights(128, 1024, 1, dtype)
    ours = _lp(w, int4_scheme.quantize(w, 128, symmetric, search="hqq"), 128)
    rtn = _lp(w, int4_scheme.quantize(w, 128, symmetric), 128)
    assert np.all(ours <= rtn * (1 + 1e-4))  # per group, up to the kernel's float32 sum and pow
    assert ours.sum() < (0.98 if not symmetric else 0.999) * rtn.sum()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_parameters_are_stored_exactly_and_zero_points_are_integers_in_range(dtype: object, symmetric: bool) -> None:
    w = _weights(64, 512, 2, dtype)
    scale, zp = _params(w, 128, symmetric)
    assert np.all(scale > 0)
    assert np.array_equal(scale.astype(dtype).astype(np.float32), scale)  # what is stored is what was scored
    if symmetric:
        assert np.all(zp == 0)
    else:
        assert zp.min() >= -8 and zp.max() <= 7
        rtn_zp = PackQuantized.unpack(int4_scheme.quantize(w, 128, False).zero_point, 4, 64, axis=0)
        assert not np.array_equal(zp, rtn_zp)  # the search moves some zero points


def test_an_all_zero_group_keeps_round_to_nearests_parameters() -> None:
    w = _weights(8, 256, 3)
    for symmetric in (False, True):
        scale, zp = _params(w, 128, symmetric)
        assert scale[0, 0] == 2.0**-7 and zp[0, 0] == 0  # compressed-tensors' eps scale, its NaN zero point as 0
        dq = int4_scheme.dequantize(int4_scheme.quantize(w, 128, symmetric, search="hqq"), 128)
        assert np.all(dq[0, :128].astype(np.float32) == 0)


def test_quantize_given_on_round_to_nearests_parameters_is_round_to_nearest() -> None:
    for dtype in DTYPES:
        w = _weights(16, 512, 4, dtype)
        xin, mode = int4.kernel_input(w), int4.mode_of(w.dtype)
        for symmetric, bytewise in ((False, False), (True, False), (True, True)):
            shape = (16, 512) if bytewise else (16, 64)
            out_dtype = np.int8 if bytewise else np.uint32
            rtn, given = np.empty(shape, out_dtype), np.empty(shape, out_dtype)
            scale, zp = np.empty((16, 4), np.float32), np.zeros((16, 4), np.int8)
            shrink = np.ones((16, 4), np.float32)
            assert int4.quantize_rows(xin, mode, 128, symmetric, shrink, rtn, scale, zp) == -1
            assert int4.quantize_given(xin, mode, 128, symmetric, scale, zp, given) == -1
            assert np.array_equal(rtn, given)


@pytest.mark.parametrize("search", ["hqq", "qkx2"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_compressed_tensors_decompresses_it_as_we_dequantize(dtype: object, symmetric: bool, search: str) -> None:
    torch = pytest.importorskip("torch")
    ct_q = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    w = _weights(40, 512, 5, dtype)  # 40 rows: zero points pack into a partial last word
    ours = int4_scheme.quantize(w, 128, symmetric, search=search)
    deq = int4_scheme.dequantize(ours, 128)
    scheme = ct_q.QuantizationScheme(
        targets=["Linear"],
        weights=ct_q.QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=128),
    )
    torch_dtype = {np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.float16): torch.float16}
    state = {
        "weight_packed": torch.from_numpy(ours.packed),
        "weight_scale": torch.from_numpy(ours.scale.astype(np.float32)).to(
            torch_dtype.get(ours.scale.dtype, torch.float32)
        ),
        "weight_shape": torch.tensor(w.shape),
    }
    if not symmetric:
        state["weight_zero_point"] = torch.from_numpy(ours.zero_point)
    theirs = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
    assert np.array_equal(theirs.float().numpy(), deq.astype(np.float32))
    # the codes are the nearest on the chosen grid: inside its ends each value is within half a step
    # (and the dtype's rounding of w / s and of the result); a scale the search narrowed clips the ends
    step = np.repeat(ours.scale.astype(np.float32), 128, axis=1)
    codes = PackQuantized.unpack(ours.packed, 4, w.shape[1], axis=1)
    inside = (codes > -8) & (codes < 7)
    err = np.abs(deq.astype(np.float32) - w.astype(np.float32))
    assert np.all(err[inside] <= 0.55 * step[inside] + 1e-30)


@pytest.mark.parametrize("search", ["hqq", "qkx2"])
@pytest.mark.parametrize("scheme", ["w4a16-asym", "w4a16", "w4afp8"])
def test_encode_writes_the_search_and_reports_a_nan(scheme: str, search: str) -> None:
    w = _weights(16, 256, 6)
    hqq = make_scheme(scheme, 128, search)
    assert hqq.grid(w) is None  # no clip factors for GPTQ to start from
    writes, bad = hqq.encode(w, 0, w.shape)
    assert bad == -1
    plain = make_scheme(scheme, 128, "none").encode(w, 0, w.shape)[0]
    assert [name for name, _, _ in writes] == [name for name, _, _ in plain]
    assert any(not np.array_equal(a, b) for (_, a, _), (_, b, _) in zip(writes, plain, strict=True))
    w[5, 200] = np.nan
    assert hqq.encode(w, 0, w.shape) == ([], 5 * 256 + 200)
    scale, zp = np.empty((16, 2), np.float32), np.zeros((16, 2), np.int8)
    assert SEARCHES[search].parameters(w.view(np.uint16), int4.MODE_BF16, 128, False, scale, zp) == 5 * 256 + 200


def test_real_weights_lower_lp_and_squared_error() -> None:
    """SmolLM2-135M's layers (fp32, and in BF16): asymmetric HQQ lowers both errors against asymmetric RTN."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from models import smollm2_fp32

    safetensors = pytest.importorskip("safetensors")
    try:
        folder = smollm2_fp32()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    with safetensors.safe_open(folder / "model.safetensors", framework="numpy") as f:
        keys = f.keys()  # a safe_open handle, not a dict: it does not iterate
        names = [n for n in keys if n.startswith("model.layers.3.") and n.endswith("proj.weight")]
        layers = [f.get_tensor(n) for n in sorted(names)]
    assert len(layers) == 7
    for w in (*layers, *(x.astype(ml_dtypes.bfloat16) for x in layers)):
        ours = int4_scheme.quantize(w, 64, False, search="hqq")
        rtn = int4_scheme.quantize(w, 64, False)
        assert np.all(_lp(w, ours, 64) <= _lp(w, rtn, 64) * (1 + 1e-4))
        assert _rel_mse(w, ours, 64) < 0.95 * _rel_mse(w, rtn, 64)


def test_gptq_refuses_it_in_one_line() -> None:
    from weightsmith.quantization.request import GptqOptions, gptq_options

    with pytest.raises(WeightsmithError, match=r"does not take --scale-search hqq \(which sets each group's scale"):
        gptq_options("gptq", GptqOptions(tokens=64, seq_len=32, dampening=0.01), "hqq")


@pytest.mark.parametrize("search", ["hqq", "qkx2"])
def test_compiling_the_search_first_leaves_round_to_nearest_unchanged(tmp_path, search: str) -> None:
    """In a fresh process with an empty kernel cache, round-to-nearest compiled after the search
    writes the bytes it writes alone (a helper compiled into the search once changed it)."""
    import hashlib
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, hashlib, numpy as np, ml_dtypes\n"
        "from weightsmith.schemes import int4 as s\n"
        "w = (np.random.default_rng(0).standard_normal((64, 512)) * 0.02).astype(ml_dtypes.bfloat16)\n"
        "if sys.argv[1] == '1': s.quantize(w, 128, False, search=sys.argv[2])\n"
        "q = s.quantize(w, 128, False)\n"
        "print(hashlib.sha256(q.packed.tobytes() + q.zero_point.tobytes() + q.scale.tobytes()).hexdigest())\n"
    )
    src = str(Path(__file__).parents[2] / "src")
    digests = []
    for first in ("0", "1"):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / first), "PYTHONPATH": src}
        out = subprocess.run(
            [sys.executable, "-c", code, first, search], env=env, capture_output=True, text=True, check=True
        )
        digests.append(out.stdout.strip())
    assert digests[0] == digests[1] and len(digests[0]) == len(hashlib.sha256().hexdigest())


def test_a_gptq_recipe_naming_it_is_refused_naming_the_rule(tmp_path) -> None:
    from weightsmith.quantization.recipe import load_recipe

    path = tmp_path / "recipe.toml"
    path.write_text("[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16-asym'\nscale_search = 'hqq'\n")
    assert load_recipe(path).rules[0].scheme.scale_search == "hqq"
    with pytest.raises(WeightsmithError, match=r"rule 1.*does not take scale_search = 'hqq'"):
        load_recipe(path, gptq=True)
