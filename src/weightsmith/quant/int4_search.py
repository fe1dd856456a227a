"""Data-free searches for int4 group scales: same format, same kernels, a different scale per group.

Each search chooses, per group, a factor `p` that scales the group's range before the scale is
computed (`int4.quantize_rows` applies it exactly as llm-compressor's observers do): below 1 it
clips, above 1 it widens. What they buy on two real models is in docs/scale-search-study.md; lower
weight error is not lower output error there, so each search says which it lowers.

- `mse` (symmetric and asymmetric): the sum of |error|^2.5 over 8 coarse factors (1.00 to 0.65)
  and 4 refinements around the best (+-0.0125, +-0.025). Candidates are scored side by side, one
  per vector lane, in a pass over the group while it sits in L1: two passes for the whole search,
  each sum in one written order, so the same bytes from any CPU. Lower weight error than RTN;
  next-token KL lower on SmolLM2-135M (0.386 against 0.399), higher on Qwen2.5-Coder-1.5B.
- `wmse` (symmetric and asymmetric): the same loop scoring sum |w| * error^2 over factors 0.80 to
  1.08 in steps of 0.02. Weighing each error by its weight's magnitude keeps the large weights,
  which a plain error sum trades away for many small ones, close; widening lets a group's largest
  weight land on the grid. Next-token KL 8 % and 15 % below RTN's (symmetric) and 10 % and
  2.5 % below asymmetric RTN's on SmolLM2-135M and Qwen2.5-Coder-1.5B.
- `noclip` (symmetric): scale max(max/7, -min/8), so the end that sets the scale lands on the grid
  (compressed-tensors' absmax / 7.5 misses the largest weight by absmax / 15). Weight error a little
  above RTN's; KL 0.2 % (SmolLM2-135M) and 11.6 % (Qwen2.5-Coder-1.5B) below.
- `memoryless_mse` (symmetric): llm-compressor's `memoryless_mse` observer reproduced exactly for BF16 weights
  (grid 100, maxshrink 0.2, norm 2.4, patience 5): every intermediate rounded to BF16 as torch does
  on CPU (the exponent 2.4 itself becomes BF16 2.40625), and early stopping decided over the whole
  tensor, as the observer sees it. It needs the whole tensor before quantizing any of it, so it
  runs as two passes: `memoryless_steps` marks each group's improving steps, `memoryless_choice`
  applies the tensor-wide patience rule and returns the factors.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from weightsmith.quant.floatbits import MODE_BF16, MODE_F16, MODE_F32, array_helper, round_to
from weightsmith.quant.int4 import group_params, group_range, load_group
from weightsmith.quant.lanes import LANES

#: objectives of the clipping search: |e|^2.5 (`mse`), |w| e^2 (`wmse`)
POWER25, MAGNITUDE = 0, 1
COARSE = np.array([1.0 - 0.05 * k for k in range(8)], np.float32)
FINE = np.array([-0.025, -0.0125, 0.0125, 0.025], np.float32)
#: `wmse` factors: clips to 0.80 and widenings to 1.08 in steps of 0.02, no refinement. A factor above 1
#: widens the step so a group's largest weight, which compressed-tensors' absmax / 7.5 misses by
#: absmax / 15, can land on the grid.
WIDE = np.array([1.0 - 0.02 * k for k in range(11)] + [1.0 + 0.02 * k for k in range(1, 5)], np.float32)
NO_FINE = np.zeros(0, np.float32)
#: llm-compressor `memoryless_mse` defaults.
MEMORYLESS = {"maxshrink": 0.2, "grid": 100.0, "norm": 2.4, "patience": 5}


@array_helper
def _term(objective: int, v: np.float32, s: np.float32, inv: np.float32, zp: np.float32) -> np.float32:
    """One value's error under RTN at scale `s` (`inv` = 1 / s) and zero point `zp` (0 when symmetric),
    dequantized as (q - zp) * s: |w| e^2 for `wmse`, |e|^2.5 (e^2 sqrt|e|) for `mse`.

    The exponent 2.5 weighs large errors a little more than squared error does, as llm-compressor's 2.4
    does. On SmolLM2-135M (2048 tokens of stdlib code) plain squared error gave the lowest weight MSE but
    the worst next-token KL, worse even than RTN; 2.5 gave the lowest KL of the exponents tried (2, 2.25,
    2.5) for 0.6 % more weight MSE than 2.4. Weighing by |w| instead is a data-free stand-in for each
    weight's importance, so a clip that saves many small weights a little cannot cost the few large ones
    much.
    """
    q: np.float32 = np.rint(min(max(v * inv + zp, np.float32(-8.0)), np.float32(7.0)))
    d = (q - zp) * s - v
    if objective == MAGNITUDE:
        return abs(v) * d * d
    root: np.float32 = np.sqrt(abs(d))
    return d * d * root


@array_helper
def _score(
    objective: int, vals: np.ndarray, s: np.ndarray, inv: np.ndarray, zp: np.ndarray, even: np.ndarray, odd: np.ndarray
) -> None:
    """Each lane's error summed over the group into `even`: the values at even positions in order, those
    at odd positions in order (two chains of adds at once), then the two added.

    Every sum has one order, written here: a lane per candidate (`LANES` at least as many as any search
    has, `WIDE`'s 15), each summing the group in order, so the loop over the lanes vectorises with no
    sum reordered (`quant.lanes` says why that matters: near-ties between candidates).
    """
    even[:] = 0
    odd[:] = 0
    for i in range(0, vals.size, 2):  # a group is whole packs of INT4_PACK values: an even count
        v, w = vals[i], vals[i + 1]
        for k in range(LANES):
            even[k] += _term(objective, v, s[k], inv[k], zp[k])
            odd[k] += _term(objective, w, s[k], inv[k], zp[k])
    for k in range(LANES):
        even[k] += odd[k]


@array_helper
def _candidate(
    mode: int, symmetric: bool, lo: np.float32, hi: np.float32, p: np.float32, k: int,
    s: np.ndarray, inv: np.ndarray, zp: np.ndarray,
) -> None:  # fmt: skip
    """Lane `k` set to the scale, its reciprocal and the zero point of the range [lo, hi] clipped by `p`."""
    s[k], zp[k] = group_params(mode, symmetric, lo, hi, p)
    inv[k] = np.float32(1.0) / s[k]


@array_helper
def _mse_rows(
    x: np.ndarray,
    mode: int,
    group: int,
    symmetric: bool,
    objective: int,
    coarse: np.ndarray,
    fine: np.ndarray,
    shrink: np.ndarray,
) -> int:
    rows, cols = x.shape
    vals = np.empty(group, np.float32)
    s, inv, zp = np.ones(LANES, np.float32), np.ones(LANES, np.float32), np.zeros(LANES, np.float32)
    even, odd = np.empty(LANES, np.float32), np.empty(LANES, np.float32)  # lanes no candidate fills score s = 1
    ps = np.empty(LANES, np.float32)
    for r in range(rows):
        for g in range(cols // group):
            c0 = g * group
            lo, hi, bad = load_group(x, r, c0, group, mode, vals)
            if bad >= 0:
                return int(r * cols + bad)
            for k in range(coarse.size):
                _candidate(mode, symmetric, lo, hi, coarse[k], k, s, inv, zp)
            _score(objective, vals, s, inv, zp, even, odd)
            best, best_p = np.float32(np.inf), np.float32(1.0)
            for k in range(coarse.size):  # the first of equal errors, as the candidates are ordered
                if even[k] < best:
                    best, best_p = even[k], coarse[k]
            m = 0
            for k in range(fine.size):
                p = best_p + fine[k]
                if p <= 1:
                    ps[m] = p
                    _candidate(mode, symmetric, lo, hi, p, m, s, inv, zp)
                    m += 1
            if m:
                _score(objective, vals, s, inv, zp, even, odd)
                for k in range(m):
                    if even[k] < best:
                        best, best_p = even[k], ps[k]
            shrink[r, g] = best_p
    return -1


def _specialise(mode: int, symmetric: bool, objective: int) -> Callable[..., int]:
    """One compiled search per (dtype, symmetry, objective), as int4.py's kernels: the three arrive
    as closure constants, so the per-group rounding and objective branches vanish (with `mode` a
    runtime argument the wmse search ran some 12 % slower)."""

    @njit(nogil=True, cache=True)
    def kernel(x: np.ndarray, group: int, coarse: np.ndarray, fine: np.ndarray, shrink: np.ndarray) -> int:
        return _mse_rows(x, mode, group, symmetric, objective, coarse, fine, shrink)

    return kernel


_KERNELS = {
    (mode, symmetric, objective): _specialise(mode, symmetric, objective)
    for mode in (MODE_BF16, MODE_F16, MODE_F32)
    for symmetric in (True, False)
    for objective in (POWER25, MAGNITUDE)
}


def search_mse(
    x: np.ndarray, mode: int, group: int, shrink: np.ndarray, symmetric: bool = True, objective: int = POWER25
) -> int:
    """Fill `shrink` with each group's best clipping factor (our search). Returns a NaN/Inf index or -1.

    Asymmetric groups clip both ends by the same factor, as llm-compressor's observers do; the zero
    point then moves with the clipped range.
    """
    kernel = _KERNELS[(mode, bool(symmetric), objective)]
    if objective == MAGNITUDE:
        return kernel(x, group, WIDE, NO_FINE, shrink)
    return kernel(x, group, COARSE, FINE, shrink)


@njit(nogil=True, cache=True)
def _noclip_rows(x: np.ndarray, mode: int, group: int, shrink: np.ndarray) -> int:
    rows, cols = x.shape
    for r in range(rows):
        for g in range(cols // group):
            lo, hi, bad = group_range(x, r, g * group, group, mode)
            if bad >= 0:
                return int(r * cols + bad)
            m = max(-lo, hi)
            p = np.float32(1.0)
            if m > 0:
                p = np.float32(7.5) * max(hi / np.float32(7.0), -lo / np.float32(8.0)) / m
            shrink[r, g] = p
    return -1


def search_noclip(x: np.ndarray, mode: int, group: int, shrink: np.ndarray) -> int:
    """Fill `shrink` with the factor that makes a symmetric group's scale max(max/7, -min/8).

    compressed-tensors' symmetric scale is absmax / 7.5, so a group's largest weight lands on
    +-7.5 steps: +7.5 clamps to 7, -7.5 rounds to -8, and either way the largest weight is off by
    absmax / 15, the largest error in the group. This scale puts the extremes on the grid's ends
    (7 and -8) instead. The factor is above 1 when the maximum is positive (a wider step), below 1
    when the minimum dominates. Returns a NaN/Inf index or -1.
    """
    return _noclip_rows(x, mode, group, shrink)


@njit(nogil=True, cache=True)
def _memoryless_rows(
    x: np.ndarray,
    mode: int,
    group: int,
    steps: int,
    grid: float,
    norm: np.float32,
    masks: np.ndarray,
    improved: np.ndarray,
) -> int:
    rows, cols = x.shape
    vals = np.empty(group, np.float32)
    big = np.float32(3.3895313892515355e38) if mode == MODE_BF16 else np.float32(np.finfo(np.float32).max)
    if mode == MODE_F16:
        big = np.float32(65504.0)
    power = round_to(mode, norm)  # torch casts the scalar exponent to the tensor dtype
    for r in range(rows):
        for g in range(cols // group):
            c0 = g * group
            lo, hi, bad = load_group(x, r, c0, group, mode, vals)
            if bad >= 0:
                return int(r * cols + bad)
            best = big
            mask = np.uint32(0)
            for k in range(steps):
                p = np.float32(1.0 - k / grid)
                s = group_params(mode, True, lo, hi, p)[0]
                err = np.float32(0.0)
                for i in range(group):
                    v = vals[i]
                    q = np.rint(min(max(round_to(mode, v / s), np.float32(-8.0)), np.float32(7.0)))
                    diff = round_to(mode, round_to(mode, q * s) - v)
                    err += round_to(mode, abs(diff) ** power)
                err = round_to(mode, err)
                if err < best:
                    best = err
                    mask |= np.uint32(1) << np.uint32(k)
                    improved[k] = True
            masks[r, g] = mask
    return -1


def memoryless_steps(x: np.ndarray, mode: int, group: int, masks: np.ndarray, improved: np.ndarray) -> int:
    """First pass: for each group, the steps at which its error improved (bit k of `masks[r, g]`).

    `improved[k]` is set when any group improved at step k. Returns a NaN/Inf index or -1.
    """
    steps = int(MEMORYLESS["maxshrink"] * MEMORYLESS["grid"])
    return _memoryless_rows(x, mode, group, steps, MEMORYLESS["grid"], np.float32(MEMORYLESS["norm"]), masks, improved)


def memoryless_choice(masks: np.ndarray, improved: np.ndarray) -> np.ndarray:
    """Second pass: the observer's factors, with its tensor-wide early stop applied.

    The observer stops after `patience` consecutive steps in which no group of the tensor improved;
    each group keeps the last step (up to there) at which it improved.
    """
    steps = len(improved)
    last, misses = steps - 1, 0
    for k in range(steps):
        misses = 0 if improved[k] else misses + 1
        if misses >= MEMORYLESS["patience"]:
            last = k
            break
    visible = masks & np.uint32((1 << (last + 1)) - 1)
    best_step = np.zeros(masks.shape, np.int64)
    for k in range(last + 1):
        best_step[(visible >> np.uint32(k)) & 1 == 1] = k
    return (1.0 - best_step / MEMORYLESS["grid"]).astype(np.float32)


__all__ = ["MAGNITUDE", "POWER25", "memoryless_choice", "memoryless_steps", "search_mse", "search_noclip"]
