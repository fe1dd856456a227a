"""Statistics that keep a benchmark honest: spread, noise floor, paired tests, two-mode detection.

The rules, and why:

- Arms are compared on matched prompts (the same body was sent to both), as the geometric mean
  of the per-prompt ratios. Pairing removes the prompt-to-prompt spread, which is usually far
  larger than the difference between arms; a ratio makes the effect read as a percentage.
- The confidence interval is a paired bootstrap over prompts (percentile method, seeded).
- A paired sign test over the same prompts guards against one extreme prompt carrying the mean.
- The noise floor is the same estimator applied between two repeats of the *same* arm: a gap
  between two arms no larger than either arm's gap with itself is not evidence of anything.
- A difference is "shown" only when all three agree: the interval excludes zero, the sign test
  rejects at alpha, and the effect is larger than the noise floor. Anything else is reported as
  "no difference shown", never as a small win.
- TTFT is checked for two modes with a two-component Gaussian mixture on log(TTFT), accepted
  only with strong BIC support (delta > 10), clear separation (Ashman's D > 2), a minor mode of at
  least 10% of samples, and modes at least 10% apart: a skewed or long-tailed sample is not
  bimodal, and a median of a bimodal sample describes no request that actually happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

SHOWN = "difference shown"
NOT_SHOWN = "no difference shown"
TOO_FEW = "not enough data"

BOOTSTRAP_RESAMPLES = 5000


@dataclass
class Summary:
    """Centre and spread of one sample, all samples counted."""

    n: int
    median: float
    mean: float
    p10: float
    p90: float
    min: float
    max: float


def summarize(values: Sequence[float]) -> Summary | None:
    """Median, mean, 10th/90th percentiles and range; None for an empty sample."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return None
    return Summary(
        n=int(x.size),
        median=float(np.median(x)),
        mean=float(x.mean()),
        p10=float(np.percentile(x, 10)),
        p90=float(np.percentile(x, 90)),
        min=float(x.min()),
        max=float(x.max()),
    )


def _bootstrap(
    x: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], tail: float, seed: int
) -> tuple[np.floating, np.floating]:
    """Percentile bootstrap: the `tail` and `100 - tail` percentiles (in percent) of `statistic`
    over BOOTSTRAP_RESAMPLES seeded resamples of `x`, each row one resample of `x.size` values."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(BOOTSTRAP_RESAMPLES, x.size))
    boot = statistic(x[idx])
    return np.percentile(boot, tail), np.percentile(boot, 100 - tail)


def _row_means(resamples: np.ndarray) -> np.ndarray:
    means: np.ndarray = resamples.mean(axis=1)
    return means


def median_ci(values: Sequence[float], confidence: float = 0.95, seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap percentile interval of the median (None below 3 samples)."""
    x = np.asarray(values, dtype=float)
    if x.size < 3:
        return None
    low, high = _bootstrap(x, lambda resamples: np.median(resamples, axis=1), (1 - confidence) / 2 * 100, seed)
    return float(low), float(high)


def geomean_ci(values: Sequence[float], confidence: float = 0.95, seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap percentile interval of the geometric mean of positive values (None below 3)."""
    x = np.log(np.asarray([v for v in values if v > 0], dtype=float))
    if x.size < 3:
        return None
    low, high = _bootstrap(x, _row_means, (1 - confidence) / 2 * 100, seed)
    return float(np.exp(low)), float(np.exp(high))


def _log_ratios(baseline: Mapping[str, float], arm: Mapping[str, float]) -> tuple[list[str], np.ndarray]:
    keys = sorted(k for k in baseline.keys() & arm.keys() if baseline[k] > 0 and arm[k] > 0)
    return keys, np.array([math.log(arm[k] / baseline[k]) for k in keys], dtype=float)


def geometric_mean(values: Sequence[float]) -> float:
    """Geometric mean of positive values (how repeats of one prompt are combined)."""
    x = np.asarray([v for v in values if v > 0], dtype=float)
    return float(np.exp(np.log(x).mean())) if x.size else float("nan")


@dataclass
class NoiseFloor:
    """Largest relative gap between two repeats of the same arm, per arm and overall."""

    value: float | None
    per_arm: dict[str, float] = field(default_factory=dict)
    #: Why there is no floor (no arm has two repeats); empty where there is one.
    detail: str = ""

    @property
    def arm(self) -> str | None:
        """The arm whose repeats moved most (the floor's), for a reader to quote; None without a floor."""
        return next((a for a, v in self.per_arm.items() if v == self.value), None)


def noise_floor(per_arm_repeats: Mapping[str, Mapping[int, Mapping[str, float]]]) -> NoiseFloor:
    """Noise floor from within-arm repeats: arm -> repeat -> prompt key -> value."""
    per_arm: dict[str, float] = {}
    for arm, repeats in per_arm_repeats.items():
        order = sorted(repeats)
        gaps = []
        for i, r1 in enumerate(order):
            for r2 in order[i + 1 :]:
                keys, lr = _log_ratios(repeats[r1], repeats[r2])
                if len(keys) >= 2:
                    gaps.append(abs(math.expm1(lr.mean())))
        if gaps:
            per_arm[arm] = max(gaps)
    if not per_arm:
        return NoiseFloor(None, {}, "no arm has two repeats with matched prompts")
    return NoiseFloor(max(per_arm.values()), per_arm)


@dataclass
class PairedComparison:
    """One metric, one arm against the baseline, over matched prompts."""

    metric: str
    baseline: str
    arm: str
    n_pairs: int
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_higher: int = 0
    n_lower: int = 0
    sign_p: float | None = None
    noise_floor: float | None = None
    verdict: str = TOO_FEW
    reason: str = ""
    arm_better: bool | None = None


def sign_test(higher: int, lower: int) -> float | None:
    """Exact two-sided sign test of `higher` against `lower` (ties left out); None with nothing untied."""
    if higher + lower == 0:
        return None
    from scipy.stats import binomtest  # here: scipy.stats takes most of a second to import

    return float(binomtest(higher, higher + lower, 0.5).pvalue)


def sign_test_can_reach(untied: int, alpha: float) -> bool:
    """Whether `untied` pairs could give p < `alpha` at all: the smallest two-sided p is 2 * 0.5**untied.

    Says "too few pairs" apart from "the pairs did not lean one way", which read alike as a bare p.
    """
    return untied > 0 and 2 * 0.5**untied < alpha


def compare_paired(
    metric: str,
    baseline_name: str,
    arm_name: str,
    baseline: Mapping[str, float],
    arm: Mapping[str, float],
    *,
    noise: float | None,
    alpha: float = 0.05,
    higher_is_better: bool = True,
    seed: int = 0,
) -> PairedComparison:
    """Paired bootstrap CI, sign test and noise floor, combined into one verdict."""
    keys, lr = _log_ratios(baseline, arm)
    out = PairedComparison(metric=metric, baseline=baseline_name, arm=arm_name, n_pairs=len(keys), noise_floor=noise)
    if len(keys) < 2:
        out.reason = f"{len(keys)} matched prompt(s); need at least 2"
        return out
    out.effect = float(math.expm1(lr.mean()))
    low, high = _bootstrap(lr, _row_means, alpha / 2 * 100, seed)
    out.ci_low = float(math.expm1(low))
    out.ci_high = float(math.expm1(high))
    out.n_higher = int((lr > 0).sum())
    out.n_lower = int((lr < 0).sum())
    untied = out.n_higher + out.n_lower
    out.sign_p = sign_test(out.n_higher, out.n_lower)
    out.arm_better = (out.effect > 0) == higher_is_better if out.effect != 0 else None

    reasons = []
    ci_excludes_zero = out.ci_low > 0 or out.ci_high < 0
    if not ci_excludes_zero:
        reasons.append(f"the {100 * (1 - alpha):.0f}% interval includes 0")
    if out.sign_p is None or out.sign_p >= alpha:
        if not sign_test_can_reach(untied, alpha):
            reasons.append(f"{untied} untied pairs cannot reach p < {alpha:g} in a sign test")
        else:
            reasons.append(f"sign test p = {out.sign_p:.3g} >= {alpha:g}")
    if noise is None:
        reasons.append("no noise floor (needs two repeats of an arm)")
    elif abs(out.effect) <= noise:
        reasons.append(f"|effect| {abs(out.effect):.1%} is within the noise floor {noise:.1%}")
    if reasons:
        out.verdict = NOT_SHOWN
        out.reason = "; ".join(reasons)
    else:
        out.verdict = SHOWN
        out.reason = f"interval excludes 0, sign test p = {out.sign_p:.3g}, effect beyond noise {noise:.1%}"
    return out


@dataclass
class Bimodality:
    """Whether a sample has two modes, and the evidence either way."""

    flagged: bool
    n: int
    reason: str
    delta_bic: float | None = None
    ashman_d: float | None = None
    modes: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)


_VAR_FLOOR = 1e-4  # (1% relative spread)^2 in log units: keeps EM off zero-width components


def _normal_loglik(x: np.ndarray, mu: float, var: float) -> np.ndarray:
    loglik: np.ndarray = -0.5 * (np.log(2 * np.pi * var) + (x - mu) ** 2 / var)
    return loglik


def _best_split(x: np.ndarray) -> int:
    """Index splitting sorted `x` into two groups with the least within-group squares."""
    n = x.size
    csum = np.cumsum(x)
    csq = np.cumsum(x * x)
    best, best_i = math.inf, 2
    for i in range(2, n - 1):
        left = csq[i - 1] - csum[i - 1] ** 2 / i
        right = (csq[-1] - csq[i - 1]) - (csum[-1] - csum[i - 1]) ** 2 / (n - i)
        if left + right < best:
            best, best_i = left + right, i
    return best_i


def _fit_two(x: np.ndarray, iterations: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """EM for a two-component 1-D Gaussian mixture, started from the best split."""
    xs = np.sort(x)
    i = _best_split(xs)
    mu = np.array([xs[:i].mean(), xs[i:].mean()])
    var = np.maximum([xs[:i].var(), xs[i:].var()], _VAR_FLOOR)
    w = np.array([i / xs.size, 1 - i / xs.size])
    previous = -math.inf
    loglik = previous
    for _ in range(iterations):
        comp = np.stack([np.log(w[k]) + _normal_loglik(x, mu[k], var[k]) for k in range(2)])
        top = comp.max(axis=0)
        total = top + np.log(np.exp(comp - top).sum(axis=0))
        loglik = float(total.sum())
        resp = np.exp(comp - total)
        nk = resp.sum(axis=1)
        if np.any(nk < 1e-9):
            break
        w = nk / x.size
        mu = (resp * x).sum(axis=1) / nk
        var = np.maximum((resp * (x - mu[:, None]) ** 2).sum(axis=1) / nk, _VAR_FLOOR)
        if loglik - previous < 1e-9:
            break
        previous = loglik
    return w, mu, var, loglik


def detect_bimodal(
    samples: Sequence[float],
    *,
    min_n: int = 12,
    min_delta_bic: float = 10.0,
    min_separation: float = 2.0,
    min_weight: float = 0.1,
    min_gap: float = 0.1,
) -> Bimodality:
    """Flag a sample of positive timings whose distribution has two distinct modes."""
    x = np.log(np.asarray([v for v in samples if v is not None and v > 0], dtype=float))
    n = int(x.size)
    if n < min_n:
        return Bimodality(False, n, f"too few samples to tell (n = {n} < {min_n})")
    var1 = max(float(x.var()), _VAR_FLOOR)
    loglik1 = float(_normal_loglik(x, float(x.mean()), var1).sum())
    bic1 = -2 * loglik1 + 2 * math.log(n)
    w, mu, var, loglik2 = _fit_two(x)
    bic2 = -2 * loglik2 + 5 * math.log(n)
    delta = bic1 - bic2
    d = float(math.sqrt(2) * abs(mu[0] - mu[1]) / math.sqrt(var[0] + var[1]))
    order = np.argsort(mu)
    modes = [float(math.exp(mu[k])) for k in order]
    weights = [float(w[k]) for k in order]
    gap = modes[1] / modes[0] - 1
    result = Bimodality(False, n, "", delta_bic=float(delta), ashman_d=d, modes=modes, weights=weights)
    if delta < min_delta_bic:
        result.reason = f"one mode fits as well (BIC gain {delta:.1f} < {min_delta_bic:g})"
    elif d <= min_separation:
        result.reason = f"components overlap (Ashman's D {d:.2f} <= {min_separation:g})"
    elif min(weights) < min_weight:
        result.reason = f"minor mode holds {min(weights):.0%} of samples (outliers, not a mode)"
    elif gap < min_gap:
        result.reason = f"modes only {gap:.0%} apart"
    else:
        result.flagged = True
        result.reason = (
            f"two modes: {weights[0]:.0%} near {modes[0]:.4g}, {weights[1]:.0%} near "
            f"{modes[1]:.4g} (BIC gain {delta:.0f}, Ashman's D {d:.1f})"
        )
    return result
