"""llama.cpp's data-free weighted scale searches, re-derived for int4 groups with an integer zero point.

llama.cpp (ggml/src/ggml-quants.c) quantizes each block by trying a handful of inverse scales,
rounding the block with each, and fitting the step to those codes by weighted least squares:

- `make_qkx2_quants` (Q4_K; here the asymmetric search): weights `w = rms(G) + |x|`, codes 0..15,
  inverse scales (15 - 1 + 0.1 k) / (max - min) for k = 0..20; for each, the codes L and a
  weighted least-squares fit of `x ~ scale * L + min`, kept when its weighted squared error is the
  lowest. Its `min` is a float; ours must be an integer zero point in [-8, 7]. So each fit's offset
  -min / scale is rounded to the grid (zp = that - 8, clamped), the step re-fitted to the codes
  with that integer offset (still closed form, from the same sums), and rounded to the weight dtype.
- `make_qx_quants`, rmse_type 1 (Q6_K, Q3_K; here the symmetric search): weights `w = x^2`,
  inverse scales (n + 0.1 k) / amax for k = -9..9, the step fitted to the codes, `scale = sum(w x L)
  / sum(w L^2)`. llama.cpp lets the scale go negative so the largest magnitude always lands on the
  -8 end; a compressed-tensors scale must be positive, so n is 8 when the group's extreme is
  negative and 7 when it is positive.

llama.cpp stores the codes it fitted; here the format's own quantizer recomputes them from (scale,
zero point): q = clamp(round(x / scale) + zp, -8, 7) with compressed-tensors' rounding of each
intermediate to the weight dtype (as `int4.quantize_rows`). So the candidates are ranked as
llama.cpp ranks them (each fit's weighted error on its own codes), and the best SCORED of them,
with compressed-tensors' RTN parameters, are scored on the codes the checkpoint will hold, with
their stored scales, by the search's weighted squared error; the best is then re-fitted to its own
codes while that helps. RTN is among the scored, so a group's weighted error is never above RTN's.
Scoring every candidate instead lowers asymmetric weight error a little more (SmolLM2-135M, group
64: 7.63e-3 relative MSE against 7.81e-3) at about half the speed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from weightsmith.quant import INT4_PACK
from weightsmith.quant.floatbits import MODE_BF16, MODE_F16, MODE_F32, array_helper, round_to, scalar_helper
from weightsmith.quant.int4 import Q_MAX, Q_MIN, group_params, load_group
from weightsmith.quant.lanes import LANES, lane_total

#: make_qkx2_quants as Q4_K calls it: nmax 15, rmin -1, rdelta 0.1, nstep 20.
LEVELS, RMIN, RDELTA, NSTEP = 15, -1.0, 0.1, 20
#: make_qx_quants: inverse scales (n + 0.1 k) / amax for k = -SYM_STEPS..SYM_STEPS.
SYM_STEPS = 9
#: How many candidates, the best by llama.cpp's own ranking (the error of each fit on its own
#: codes), are scored on the format's codes.
SCORED = 2
#: At most this many re-fits of the best step to its own codes.
REFITS = 3
#: Sums a pass over a group's values keeps at most, each in `LANES` partial sums (`quant.lanes`).
SUMS = 7
#: Lanes of a candidate pass: at least llama.cpp's 21 (Q4_K) and 19 (make_qx_quants) candidates.
CANDIDATES = 2 * LANES


@scalar_helper
def _code(symmetric: bool, x: np.float32, lo: np.float32, iscale: np.float32) -> np.float32:
    """llama.cpp's code of `x` at inverse scale `iscale`: min(round(iscale (x - lo)), 15), or
    clamp(round(iscale x), -8, 7) when symmetric."""
    if symmetric:
        return min(max(np.rint(iscale * x), np.float32(Q_MIN)), np.float32(Q_MAX))
    return min(np.rint(iscale * (x - lo)), np.float32(LEVELS))  # x - lo >= 0: lo is the minimum or 0


@array_helper
def _code_sums(
    symmetric: bool, vals: np.ndarray, w: np.ndarray, lo: np.float32, iscale: np.ndarray, sl: np.ndarray,
    sl2: np.ndarray, slx: np.ndarray,
) -> None:  # fmt: skip
    """Every candidate's (sum w L, sum w L^2, sum w L x) into sl, sl2, slx, candidate k (inverse scale
    iscale[k]) in lane k: each sums the group in order, so the loop over the lanes
    vectorises with no sum reordered (`quant.lanes`)."""
    sl[:] = 0
    sl2[:] = 0
    slx[:] = 0
    for i0 in range(0, vals.size, INT4_PACK):  # a group is whole packs
        for k in range(CANDIDATES):
            a, b, c = sl[k], sl2[k], slx[k]
            for i in range(i0, i0 + INT4_PACK):
                x = vals[i]
                q = _code(symmetric, x, lo, iscale[k])
                wq = w[i] * q
                a += wq
                b += wq * q
                c += wq * x
            sl[k], sl2[k], slx[k] = a, b, c


@array_helper
def _add_score(
    mode: int, symmetric: bool, x: np.float32, wi: np.float32, s: np.float32, zp: np.float32, k: int,
    err: np.ndarray, scx: np.ndarray, sc2: np.ndarray,
) -> None:  # fmt: skip
    """w e^2, w c x and w c^2 of value `x` (weight `wi`), with the format's own code at (s, zp) and
    c = q - zp, into lane `k` of each sum."""
    t = round_to(mode, x / s)
    if not symmetric:
        t = round_to(mode, t + zp)
    c = np.rint(min(max(t, np.float32(Q_MIN)), np.float32(Q_MAX))) - zp
    d = c * s - x
    wc = wi * c
    err[k] += wi * d * d
    scx[k] += wc * x
    sc2[k] += wc * c


@njit(nogil=True, cache=True)
def _score(
    mode: int, symmetric: bool, vals: np.ndarray, w: np.ndarray, s: np.float32, zp: np.float32, sums: np.ndarray
) -> tuple[np.float32, np.float32, np.float32]:
    """(sum w e^2, sum w c x, sum w c^2) of the format's own codes at (s, zp), c = q - zp.

    The codes are computed as `int4.quantize_rows` computes them; the two sums give the step that
    fits these codes best.
    """
    err, scx, sc2 = sums[0], sums[1], sums[2]
    sums[:3] = 0
    n = vals.size
    whole = n - n % LANES
    for i0 in range(0, whole, LANES):
        for k in range(LANES):
            _add_score(mode, symmetric, vals[i0 + k], w[i0 + k], s, zp, k, err, scx, sc2)
    for i in range(whole, n):
        _add_score(mode, symmetric, vals[i], w[i], s, zp, i - whole, err, scx, sc2)
    return lane_total(err), lane_total(scx), lane_total(sc2)


@array_helper
def _add_moments(
    x: np.float32, k: int, m0: np.ndarray, m1: np.ndarray, m2: np.ndarray, m3: np.ndarray, m4: np.ndarray,
    m5: np.ndarray, m6: np.ndarray,
) -> None:  # fmt: skip
    """x, x^2, |x|, |x| x, |x| x^2, x^3 and x^4 of one value into lane `k` of each sum."""
    x2 = x * x
    m0[k] += x
    m1[k] += x2
    m2[k] += abs(x)
    m3[k] += abs(x) * x
    m4[k] += abs(x) * x2
    m5[k] += x2 * x
    m6[k] += x2 * x2


@array_helper
def _weights(
    symmetric: bool, vals: np.ndarray, w: np.ndarray, sums: np.ndarray
) -> tuple[np.float32, np.float32, np.float32]:
    """Fill `w` with the search's weights; returns (sum w, sum w x, sum w x^2).

    Asymmetric: rms(G) + |x| (Q4_K's), which favours large weights without ignoring small ones.
    Symmetric: x^2 (make_qx_quants' rmse_type 1). The sums come from moments of the group, in the
    same pass as its energy.
    """
    m0, m1, m2, m3, m4, m5, m6 = sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6]
    sums[:] = 0
    n = vals.size
    whole = n - n % LANES
    for i0 in range(0, whole, LANES):
        for k in range(LANES):
            _add_moments(vals[i0 + k], k, m0, m1, m2, m3, m4, m5, m6)
    for i in range(whole, n):
        _add_moments(vals[i], i - whole, m0, m1, m2, m3, m4, m5, m6)
    s1, s2, a0, a1, a2 = lane_total(m0), lane_total(m1), lane_total(m2), lane_total(m3), lane_total(m4)
    s3, s4 = lane_total(m5), lane_total(m6)
    if symmetric:
        for i in range(n):
            w[i] = vals[i] * vals[i]
        return s2, s3, s4
    rms = np.float32(np.sqrt(s2 / np.float32(n)))
    for i in range(n):
        w[i] = rms + abs(vals[i])
    return rms * np.float32(n) + a0, rms * s1 + a1, rms * s2 + a2


@array_helper
def _fit_error(
    symmetric: bool, sw: np.float32, sx: np.float32, sxx: np.float32, sl: np.float32, sl2: np.float32, sxl: np.float32
) -> np.float32:
    """The weighted squared error of llama.cpp's least-squares fit to one candidate's codes L.

    By this llama.cpp ranks its candidates. Symmetric: x ~ scale L, error sum w x^2 - (sum w L x)^2 /
    sum w L^2. Asymmetric: x ~ scale L + min with the normal equations' solution (det = sw sl2 -
    sl^2), or, where that min would be positive, llama.cpp's fallback min 0 (the symmetric form).
    One division each: the step itself is only needed for the few candidates that are scored.
    Infinite for a fit that has no positive step.
    """
    inf = np.float32(np.inf)
    if symmetric or sl2 * sx - sl * sxl > 0:
        return sxx - sxl * sxl / sl2 if (sl2 > 0 and sxl > 0) else inf
    det = sw * sl2 - sl * sl
    if not (det > 0 and sw * sxl - sx * sl > 0):
        return inf
    return sxx - (sw * sxl * sxl - np.float32(2.0) * sx * sl * sxl + sl2 * sx * sx) / det


@array_helper
def _step(
    mode: int, symmetric: bool, sw: np.float32, sx: np.float32, sl: np.float32, sl2: np.float32, sxl: np.float32
) -> tuple[np.float32, np.float32]:
    """(step in the weight dtype, zero point) of one ranked candidate; step 0 when it has none.

    Symmetric: llama.cpp's step sum w L x / sum w L^2. Asymmetric: llama.cpp's least-squares
    (scale, min), min at most 0; then the offset -min / scale rounded to the integer grid, and the
    step re-fitted with that offset: minimising sum w (s (L - o) - x)^2 gives
    s = (sum w L x - o sum w x) / sum w (L - o)^2.
    """
    zero = np.float32(0.0)
    if symmetric:
        return round_to(mode, sxl / sl2), zero
    det = sw * sl2 - sl * sl
    lo, step = zero, zero
    if det > 0:  # a degenerate fit (every code equal) has no (scale, min): the offset stays 0
        step = (sw * sxl - sx * sl) / det
        lo = (sl2 * sx - sl * sxl) / det
    if lo > 0 or not step > 0:
        lo, step = zero, sxl / sl2 if sl2 > 0 else zero
    o = np.float32(np.rint(min(max(-lo / step, zero), np.float32(LEVELS)))) if step > 0 else zero
    num = sxl - o * sx
    den = sl2 - np.float32(2.0) * o * sl + o * o * sw
    if not (num > 0 and den > 0):
        return zero, zero
    return round_to(mode, num / den), o + np.float32(Q_MIN)


@array_helper
def _rank(picks: np.ndarray, e: np.float32, sl: np.float32, sl2: np.float32, sxl: np.float32) -> None:
    """Insert a candidate (its fit error and code sums) into `picks`, kept sorted, best first."""
    for p in range(SCORED):
        if e < picks[p, 0]:
            for q in range(SCORED - 1, p, -1):
                for j in range(4):
                    picks[q, j] = picks[q - 1, j]
            picks[p, 0], picks[p, 1], picks[p, 2], picks[p, 3] = e, sl, sl2, sxl
            return


@njit(nogil=True, cache=True)
def _candidates(
    symmetric: bool, vals: np.ndarray, w: np.ndarray, lo: np.float32, hi: np.float32, picks: np.ndarray,
    sums: np.ndarray, lanes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.float32, np.float32]:  # fmt: skip
    """Rank llama.cpp's candidates of one group by their fit error; the SCORED best go to `picks`.

    picks: float32 [SCORED, 4] of (fit error, sum w L, sum w L^2, sum w L x), best first, error
    inf where fewer candidates were usable. Returns (sum w, sum w x) for `_step`. One compiled
    function with its loops inlined: passing arrays to a call costs reference counting, per call.
    """
    sw, sx, sxx = _weights(symmetric, vals, w, sums)
    for p in range(SCORED):
        picks[p, 0] = np.inf
    if symmetric:
        top = np.float32(-Q_MIN) if -lo > hi else np.float32(Q_MAX)  # the end the extreme lands on
        first, last, base, inv = -SYM_STEPS, SYM_STEPS, top, np.float32(1.0) / max(-lo, hi)
    else:
        first, last, base, inv = 0, NSTEP, np.float32(LEVELS + RMIN), np.float32(1.0) / (hi - lo)
    iscale, sl, sl2, slx = lanes
    for k in range(CANDIDATES):  # lanes past the last candidate repeat it
        iscale[k] = (base + np.float32(RDELTA) * np.float32(min(first + k, last))) * inv
    _code_sums(symmetric, vals, w, lo, iscale, sl, sl2, slx)
    for k in range(last - first + 1):
        _rank(picks, _fit_error(symmetric, sw, sx, sxx, sl[k], sl2[k], slx[k]), sl[k], sl2[k], slx[k])
    return sw, sx


@array_helper
def _search_group(
    mode: int,
    symmetric: bool,
    vals: np.ndarray,
    w: np.ndarray,
    lo: np.float32,
    hi: np.float32,
    picks: np.ndarray,
    sums: np.ndarray,
    lanes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.float32, np.float32]:
    """(scale, zero point) of one group: RTN's, or the scored candidate with the lowest weighted error."""
    s, zp = group_params(mode, symmetric, lo, hi, np.float32(1.0))
    if not hi > lo:  # all zero: RTN's eps scale
        return s, zp
    sw, sx = _candidates(symmetric, vals, w, lo, hi, picks, sums, lanes)
    best, scx, sc2 = _score(mode, symmetric, vals, w, s, zp, sums)
    for p in range(SCORED):
        if not picks[p, 0] < np.inf:
            break
        cs, cz = _step(mode, symmetric, sw, sx, picks[p, 1], picks[p, 2], picks[p, 3])
        if not (cs > 0 and cs < np.inf) or (cs == s and cz == zp):
            continue
        e, a, b = _score(mode, symmetric, vals, w, cs, cz, sums)
        if e < best:
            best, s, zp, scx, sc2 = e, cs, cz, a, b
    for _ in range(REFITS):  # the step that fits the best candidate's own codes, while it helps
        if not (scx > 0 and sc2 > 0):
            break
        cs = round_to(mode, scx / sc2)
        if cs == s or not cs < np.inf:
            break
        e, a, b = _score(mode, symmetric, vals, w, cs, zp, sums)
        if not e < best:
            break
        best, s, scx, sc2 = e, cs, a, b
    return s, zp


@array_helper
def _search_rows(
    x: np.ndarray, mode: int, group: int, symmetric: bool, scale: np.ndarray, zero_point: np.ndarray
) -> int:
    rows, cols = x.shape
    vals = np.empty(group, np.float32)
    w = np.empty(group, np.float32)
    picks = np.empty((SCORED, 4), np.float32)
    sums = np.empty((SUMS, LANES), np.float32)
    lanes = (
        np.empty(CANDIDATES, np.float32),
        np.empty(CANDIDATES, np.float32),
        np.empty(CANDIDATES, np.float32),
        np.empty(CANDIDATES, np.float32),
    )
    for r in range(rows):
        for g in range(cols // group):
            lo, hi, bad = load_group(x, r, g * group, group, mode, vals)
            if bad >= 0:
                return int(r * cols + bad)
            s, zp = _search_group(mode, symmetric, vals, w, lo, hi, picks, sums, lanes)
            scale[r, g] = s
            zero_point[r, g] = np.int8(zp)
    return -1


def _specialise(mode: int, symmetric: bool) -> Callable[..., int]:
    """One compiled search per (dtype, symmetry): closure constants, as int4.py's kernels."""

    @njit(nogil=True, cache=True)
    def kernel(x: np.ndarray, group: int, scale: np.ndarray, zero_point: np.ndarray) -> int:
        return _search_rows(x, mode, group, symmetric, scale, zero_point)

    return kernel


_KERNELS = {
    (mode, symmetric): _specialise(mode, symmetric)
    for mode in (MODE_BF16, MODE_F16, MODE_F32)
    for symmetric in (True, False)
}


def search_qkx2(
    x: np.ndarray, mode: int, group: int, symmetric: bool, scale: np.ndarray, zero_point: np.ndarray
) -> int:
    """Fill each group's scale and zero point by the weighted search above.

    x: `int4.kernel_input` rows (bf16/fp16 bits as uint16, or float32); mode: `int4.mode_of`;
    scale: float32 [rows, cols/group] (values exact in the weight dtype); zero_point: int8
    [rows, cols/group] in [-8, 7] (0 when symmetric). Releases the GIL. Returns the flat index of
    the first NaN/Inf element, or -1.
    """
    return _KERNELS[(mode, bool(symmetric))](x, group, scale, zero_point)


__all__ = ["search_qkx2"]
