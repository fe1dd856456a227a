"""`--scale-search hqq`: half-quadratic quantization (HQQ) of int4 groups, re-derived for integer zero points.

HQQ (Badri and Shaikh, 2023; mobiusml/hqq `optimize_weights_proximal_legacy`) keeps a group's min/max
scale and solves its zero point alone, minimising the lp error sum |w - dequant(quant(w))|^p with p = 0.7
by half-quadratic splitting: an auxiliary error `e` takes the residual's outliers (the lp shrink operator
`sign(d) max(|d| - |d|^(p-1) / beta, 0)`), the zero point is then the least-squares one for the codes and
`w - e` (a mean), and `beta` grows by `kappa` = 1.01 each of at most 20 rounds, stopping when the mean
absolute error stops falling (here per group; HQQ decides it over the tensor).

That zero point is a float. compressed-tensors stores an int8 zero point in [-8, 7], and its grid,
`(q - zp) * s`, then always holds 0: a fractional shift of the grid is out of reach, and on SmolLM2's
layers HQQ's zero point rounded to an integer never lowered the lp error of round-to-nearest's. What
is left free is the scale, so the same splitting is applied to it: with the zero point held at HQQ's
rounded to the nearest integer, each round takes the codes at scale `s`, the shrunk residual `e`, and
the least-squares scale of `w - e` on `q - zp` (closed form: <w - e, q - zp> / <q - zp, q - zp>), rounded
to the weight dtype as it will be stored, with HQQ's early stop (the mean absolute error stops falling)
and at most 20 rounds. Symmetric groups (zero point 0) run that scale step alone, from
compressed-tensors' absmax / 7.5.

The result and round-to-nearest's parameters are then scored by their lp error with the codes
`int4.quantize_given` will write (every intermediate rounded to the weight dtype), and each group keeps
the lower: never worse than round-to-nearest by HQQ's own measure. On SmolLM2-135M (group 64) the
asymmetric search lowers the relative weight MSE 11 % and next-token KL 3 % against asymmetric RTN;
the symmetric one lowers weight MSE 12 % but raises KL 8 % (docs/scale-search-study.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from weightsmith.quant import INT4_PACK
from weightsmith.quant.floatbits import MODE_BF16, MODE_F16, MODE_F32, array_helper, round_to, scalar_helper
from weightsmith.quant.int4 import Q_MAX, Q_MIN, load_group, quantize_rows
from weightsmith.quant.lanes import LANES, lane_total

#: HQQ's published defaults: the lp exponent, the splitting weight and its growth per round, the rounds.
P, BETA, KAPPA, ITERS = 0.7, 10.0, 1.01, 20
#: polynomial coefficients of `_pow_abs`: log2(1 + m) / m and 2^f on [0, 1), least-squares fits
_L0, _L1, _L2 = np.float32(1.4426832), np.float32(-0.72044159), np.float32(0.46929683)
_L3, _L4, _L5 = np.float32(-0.30337745), np.float32(0.14642029), np.float32(-0.034589962)
_E0, _E1, _E2 = np.float32(0.99999990), np.float32(0.69315462), np.float32(0.24014079)
_E3, _E4, _E5 = np.float32(0.055863258), np.float32(0.0089462249), np.float32(0.0018951086)


@scalar_helper
def _pow_abs(v: np.float32, p: np.float32) -> np.float32:
    """|v|^p as 2^(p log2|v|), both by polynomial: plain arithmetic, so the group loops vectorise
    (numba calls libm's pow once per element, several times slower). Relative error about 1e-5 for
    normal float32 values; 0 gives 2^-88.9 for p = 0.7 and 2^38 for p = -0.3, finite either way."""
    bits = np.float32(abs(v)).view(np.uint32)
    e = np.float32(np.int32(bits >> np.uint32(23)) - np.int32(127))
    m = np.uint32((bits & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1.0)
    # log2(1 + m) on [0, 1), a least-squares fit of degree 6 (abs. error 9e-6)
    lg = m * (_L0 + m * (_L1 + m * (_L2 + m * (_L3 + m * (_L4 + m * _L5)))))
    y = min(max(p * (e + lg), np.float32(-126.0)), np.float32(126.0))
    n = np.float32(np.floor(y))
    f = y - n
    # 2^f on [0, 1), degree 5 (abs. error 1.1e-7)
    ex = _E0 + f * (_E1 + f * (_E2 + f * (_E3 + f * (_E4 + f * _E5))))
    return np.uint32(np.uint32(np.int32(n) + np.int32(127)) << np.uint32(23)).view(np.float32) * ex


#: How the per-group loops are compiled: each a function of its own, called once per group. Their sums
#: are kept in lanes (`quant.lanes`: `sums` float32 [SUMS, LANES]), which vectorise in one written order.
_group_loop = njit(nogil=True, cache=True, error_model="numpy")
#: Sums one group loop keeps at most.
SUMS = 4


@scalar_helper
def _shrink(d: np.float32, beta: np.float32) -> np.float32:
    """HQQ's lp shrink operator: the part of residual `d` the auxiliary error takes,
    sign(d) max(|d| - |d|^(p-1) / beta, 0)."""
    a = abs(d)
    r = max(a - _pow_abs(a, np.float32(P - 1.0)) / beta, np.float32(0.0))
    return r if d >= 0 else -r


@scalar_helper
def _untouched(beta: np.float32) -> np.float32:
    """The largest |residual| the shrink operator maps to 0: |d|^(2-p) <= 1 / beta.

    About 0.17 at beta = 10, far above an int4 step of LLM weights: there the auxiliary error is 0
    and each round is plain least squares, so the rounds below make a pass without the operator
    first and a second one with it only for a group that has a residual past this bound.
    """
    return np.float32(beta ** (-1.0 / (2.0 - P)))


@scalar_helper
def _lp_term(mode: int, symmetric: bool, v: np.float32, s: np.float32, zp: np.float32) -> np.float32:
    """|w - dequant|^p of one value (see `_lp_error`)."""
    t = round_to(mode, v / s)
    if not symmetric:
        t = round_to(mode, t + zp)
    q = np.rint(min(max(t, np.float32(Q_MIN)), np.float32(Q_MAX)))
    return _pow_abs(round_to(mode, (q - zp) * s) - v, np.float32(P))


@_group_loop
def _lp_error(
    mode: int, symmetric: bool, vals: np.ndarray, s: np.float32, zp: np.float32, sums: np.ndarray
) -> np.float32:
    """sum |w - dequant|^p of one group with the codes `int4.quantize_given` writes and the
    dequantized values rounded to the weight dtype, as the model will see them.

    A function of its own, called once per group (`mode` and `symmetric` are loop-invariant
    branches here): inside the search's large body LLVM stopped inlining the rounding helpers into
    this loop, which then ran some 10x slower.
    """
    err = sums[0]
    err[:] = 0
    n = vals.size
    whole = n - n % LANES
    for i0 in range(0, whole, LANES):
        for k in range(LANES):
            err[k] += _lp_term(mode, symmetric, vals[i0 + k], s, zp)
    for i in range(whole, n):
        err[i - whole] += _lp_term(mode, symmetric, vals[i], s, zp)
    return lane_total(err)


@array_helper
def _add_zero(
    v: np.float32, s: np.float32, inv: np.float32, z: np.float32, bound: np.float32, k: int,
    l1: np.ndarray, over: np.ndarray, acc: np.ndarray,
) -> None:  # fmt: skip
    """`_zero_round`'s terms of value `v` into lane `k`: |residual|, whether it exceeds `bound`, q - v / s."""
    q = np.rint(min(max(v * inv + z, np.float32(Q_MIN)), np.float32(Q_MAX)))
    d = abs(v - (q - z) * s)
    l1[k] += d
    over[k] += np.float32(1.0) if d > bound else np.float32(0.0)
    acc[k] += q - v * inv


@array_helper
def _add_zero_shrunk(
    v: np.float32, s: np.float32, inv: np.float32, z: np.float32, beta: np.float32, k: int, acc: np.ndarray
) -> None:
    """`_zero_round`'s term of value `v` once the auxiliary error takes outliers, q - (v - e) / s, into lane `k`."""
    q = np.rint(min(max(v * inv + z, np.float32(Q_MIN)), np.float32(Q_MAX)))
    acc[k] += q - (v - _shrink(v - (q - z) * s, beta)) * inv


@_group_loop
def _zero_round(
    vals: np.ndarray, s: np.float32, z: np.float32, beta: np.float32, sums: np.ndarray
) -> tuple[np.float32, np.float32]:
    """One HQQ round on a float zero point `z` at scale `s`: (mean |residual| at `z`, the next zero point,
    the mean of q - (w - e) / s)."""
    inv = np.float32(1.0) / s
    bound = _untouched(beta)
    l1, over, acc = sums[0], sums[1], sums[2]  # `over` a count, as a float sum: the loop stays vectors
    sums[:] = 0
    n = vals.size
    whole = n - n % LANES
    for i0 in range(0, whole, LANES):
        for k in range(LANES):
            _add_zero(vals[i0 + k], s, inv, z, bound, k, l1, over, acc)
    for i in range(whole, n):
        _add_zero(vals[i], s, inv, z, bound, i - whole, l1, over, acc)
    if lane_total(over) > 0:
        acc[:] = 0
        for i0 in range(0, whole, LANES):
            for k in range(LANES):
                _add_zero_shrunk(vals[i0 + k], s, inv, z, beta, k, acc)
        for i in range(whole, n):
            _add_zero_shrunk(vals[i], s, inv, z, beta, i - whole, acc)
    count = np.float32(n)
    return lane_total(l1) / count, lane_total(acc) / count


@array_helper
def _add_scale(
    v: np.float32, s: np.float32, inv: np.float32, zp: np.float32, bound: np.float32, k: int,
    l1: np.ndarray, over: np.ndarray, num: np.ndarray, den: np.ndarray,
) -> None:  # fmt: skip
    """`_scale_round`'s terms of value `v` into lane `k`: |residual|, whether it exceeds `bound`, and v u
    and u^2 of its code offset u = q - zp."""
    u = np.rint(min(max(v * inv + zp, np.float32(Q_MIN)), np.float32(Q_MAX))) - zp
    d = abs(v - u * s)
    l1[k] += d
    over[k] += np.float32(1.0) if d > bound else np.float32(0.0)
    num[k] += v * u
    den[k] += u * u


@array_helper
def _add_scale_shrunk(
    v: np.float32, s: np.float32, inv: np.float32, zp: np.float32, beta: np.float32, k: int, num: np.ndarray
) -> None:
    """`_scale_round`'s term of value `v` once the auxiliary error takes outliers, (v - e) u, into lane `k`."""
    u = np.rint(min(max(v * inv + zp, np.float32(Q_MIN)), np.float32(Q_MAX))) - zp
    num[k] += (v - _shrink(v - u * s, beta)) * u


@_group_loop
def _scale_round(
    vals: np.ndarray, s: np.float32, zp: np.float32, beta: np.float32, sums: np.ndarray
) -> tuple[np.float32, np.float32]:
    """One half-quadratic round on the scale, the zero point `zp` held: (mean |residual| at `s`, the
    least-squares scale of `w - e` on the codes' offsets `q - zp`, 0 when every offset is 0)."""
    inv = np.float32(1.0) / s
    bound = _untouched(beta)
    l1, over, num, den = sums[0], sums[1], sums[2], sums[3]
    sums[:] = 0
    n = vals.size
    whole = n - n % LANES
    for i0 in range(0, whole, LANES):
        for k in range(LANES):
            _add_scale(vals[i0 + k], s, inv, zp, bound, k, l1, over, num, den)
    for i in range(whole, n):
        _add_scale(vals[i], s, inv, zp, bound, i - whole, l1, over, num, den)
    if lane_total(over) > 0:
        num[:] = 0
        for i0 in range(0, whole, LANES):
            for k in range(LANES):
                _add_scale_shrunk(vals[i0 + k], s, inv, zp, beta, k, num)
        for i in range(whole, n):
            _add_scale_shrunk(vals[i], s, inv, zp, beta, i - whole, num)
    total = lane_total(den)
    return lane_total(l1) / np.float32(n), lane_total(num) / total if total > 0 else np.float32(0.0)


@array_helper
def _hqq_rows(
    x: np.ndarray,
    mode: int,
    group: int,
    symmetric: bool,
    scale: np.ndarray,
    zero_point: np.ndarray,
) -> int:
    rows, cols = x.shape
    vals = np.empty(group, np.float32)
    sums = np.empty((SUMS, LANES), np.float32)
    kappa = np.float32(KAPPA)
    for r in range(rows):
        for g in range(cols // group):
            lo, hi, bad = load_group(x, r, g * group, group, mode, vals)
            if bad >= 0:
                return int(r * cols + bad)
            s, zp = scale[r, g], np.float32(zero_point[r, g])  # round-to-nearest's
            if not hi > lo:  # an all-zero group: nothing to solve
                continue
            s_rtn, zp_rtn = s, zp
            if not symmetric:  # HQQ: the zero point alone, at the min/max scale, from the min/max zero point
                z = np.float32(Q_MIN) - lo / s
                beta, prev, z_best = np.float32(BETA), np.float32(np.inf), z
                for _ in range(ITERS):
                    l1, z_next = _zero_round(vals, s, z, beta, sums)
                    if not l1 < prev:
                        break
                    prev, z_best, z = l1, z, z_next
                    beta *= kappa
                zp = np.float32(np.rint(min(max(z_best, np.float32(Q_MIN)), np.float32(Q_MAX))))
            # then the scale, by the same splitting, at that integer zero point; the same early stop
            beta, prev, s_best = np.float32(BETA), np.float32(np.inf), s
            for _ in range(ITERS):
                l1, s_next = _scale_round(vals, s, zp, beta, sums)
                if not l1 < prev:
                    break
                prev, s_best = l1, s
                s_next = round_to(mode, s_next)  # as it will be stored
                if not s_next > 0 or s_next == s:
                    break
                s = s_next
                beta *= kappa
            if _lp_error(mode, symmetric, vals, s_best, zp, sums) < _lp_error(
                mode, symmetric, vals, s_rtn, zp_rtn, sums
            ):
                scale[r, g] = s_best
                zero_point[r, g] = np.int8(zp)
    return -1


def _specialise(mode: int, symmetric: bool) -> Callable[..., int]:
    """One compiled search per (dtype, symmetry), constants folded in as in int4.py's kernels."""

    @njit(nogil=True, cache=True, error_model="numpy")
    def kernel(x: np.ndarray, group: int, scale: np.ndarray, zero_point: np.ndarray) -> int:
        return _hqq_rows(x, mode, group, symmetric, scale, zero_point)

    return kernel


_KERNELS = {
    (mode, symmetric): _specialise(mode, symmetric)
    for mode in (MODE_BF16, MODE_F16, MODE_F32)
    for symmetric in (True, False)
}


def search_hqq(x: np.ndarray, mode: int, group: int, symmetric: bool, scale: np.ndarray, zero_point: np.ndarray) -> int:
    """Fill `scale` (float32 [rows, cols/group], each exact in the weight dtype) and `zero_point`
    (int8 [rows, cols/group] in [-8, 7]; 0 when symmetric) with each group's HQQ parameters.

    `x`: bf16/fp16 bits as uint16, or float32 (`int4.kernel_input`). Releases the GIL. Returns the
    flat index of the first NaN/Inf element, or -1.

    Round-to-nearest's parameters come from `int4.quantize_rows` itself, not from its helpers
    compiled into the search: compiled into it, `group_params` left its rounding helper (`rint_small`)
    returning unrounded values in every kernel compiled after it in the same process, round-to-nearest's
    included (tests/quant/test_hqq.py holds the two apart).
    """
    rows, cols = x.shape
    codes = np.empty((rows, cols // INT4_PACK), np.uint32)  # round-to-nearest's, not kept
    zero_point.fill(0)
    bad = quantize_rows(x, mode, group, symmetric, np.ones(scale.shape, np.float32), codes, scale, zero_point)
    if bad >= 0:
        return bad
    return _KERNELS[(mode, bool(symmetric))](x, group, scale, zero_point)


__all__ = ["search_hqq"]
