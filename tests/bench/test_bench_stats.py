"""Statistics on cases with a known answer: identical arms, a planted gap, planted two-mode TTFT."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightsmith.bench.stats import (
    NOT_SHOWN,
    SHOWN,
    TOO_FEW,
    compare_paired,
    detect_bimodal,
    geomean_ci,
    geometric_mean,
    median_ci,
    noise_floor,
    summarize,
)


def _simulate(seed: int, gap: float, noise: float = 0.02, prompts: int = 12, repeats: int = 2, drift: float = 0.0):
    """Per-prompt decode rates for a baseline and an arm `gap` faster, with multiplicative noise.

    Prompts differ a lot from each other (50-150 tok/s), which pairing must cancel out; `drift`
    slows the baseline's later repeats, as a warming machine would.
    """
    rng = np.random.default_rng(seed)
    base = rng.uniform(50, 150, prompts)
    arms: dict[str, dict[int, dict[str, float]]] = {"base": {}, "arm": {}}
    for r in range(repeats):
        for name, factor in (("base", 1.0 - drift * r), ("arm", 1.0 + gap)):
            values = base * factor * np.exp(rng.normal(0, noise, prompts))
            arms[name][r] = {f"p{i}": float(v) for i, v in enumerate(values)}
    per_prompt = {
        name: {k: geometric_mean([arms[name][r][k] for r in range(repeats)]) for k in arms[name][0]} for name in arms
    }
    return arms, per_prompt


def _verdict(seed: int, gap: float, **kwargs):
    repeats, per_prompt = _simulate(seed, gap, **kwargs)
    floor = noise_floor(repeats)
    return compare_paired(
        "decode_tok_s", "base", "arm", per_prompt["base"], per_prompt["arm"], noise=floor.value, seed=seed
    )


def test_identical_arms_show_no_difference() -> None:
    verdicts = [_verdict(seed, gap=0.0) for seed in range(200)]
    false_positives = sum(v.verdict == SHOWN for v in verdicts)
    assert false_positives <= 10, f"{false_positives}/200 identical pairs called different"
    assert all(abs(v.effect) < 0.03 for v in verdicts)
    assert any("noise floor" in v.reason for v in verdicts)


def test_planted_ten_percent_gap_is_found() -> None:
    for seed in range(50):
        v = _verdict(seed, gap=0.10)
        assert v.verdict == SHOWN, v.reason
        assert v.arm_better is True
        assert 0.08 < v.effect < 0.12
        assert v.ci_low is not None and v.ci_high is not None and v.ci_low < v.effect < v.ci_high
        assert v.n_higher == 12 and v.sign_p is not None and v.sign_p < 0.001


def test_lower_is_better_metrics_read_the_direction() -> None:
    _, per_prompt = _simulate(1, gap=-0.10)
    v = compare_paired(
        "ttft_s", "base", "arm", per_prompt["base"], per_prompt["arm"], noise=0.01, higher_is_better=False
    )
    assert v.verdict == SHOWN and v.effect < 0 and v.arm_better is True


def test_a_gap_inside_the_noise_floor_is_not_a_win() -> None:
    # the baseline drifts 8% between its own repeats; a 3% gap between arms proves nothing
    repeats, per_prompt = _simulate(3, gap=0.03, noise=0.005, drift=0.08)
    floor = noise_floor(repeats)
    assert floor.value is not None and floor.value > 0.07
    v = compare_paired("decode_tok_s", "base", "arm", per_prompt["base"], per_prompt["arm"], noise=floor.value)
    assert v.verdict == NOT_SHOWN
    assert "within the noise floor" in v.reason


def test_without_repeats_there_is_no_noise_floor_and_no_claim() -> None:
    repeats, per_prompt = _simulate(4, gap=0.10, repeats=1)
    floor = noise_floor(repeats)
    assert floor.value is None
    v = compare_paired("decode_tok_s", "base", "arm", per_prompt["base"], per_prompt["arm"], noise=floor.value)
    assert v.verdict == NOT_SHOWN and "no noise floor" in v.reason


def test_too_few_pairs_cannot_pass_the_sign_test() -> None:
    _, per_prompt = _simulate(5, gap=0.2, prompts=4)
    v = compare_paired("decode_tok_s", "base", "arm", per_prompt["base"], per_prompt["arm"], noise=0.0)
    assert v.verdict == NOT_SHOWN
    assert "cannot reach p < 0.05" in v.reason
    one = compare_paired("decode_tok_s", "b", "a", {"p": 1.0}, {"p": 2.0}, noise=0.0)
    assert one.verdict == TOO_FEW


def test_noise_floor_is_the_largest_within_arm_repeat_gap() -> None:
    floor = noise_floor(
        {
            "a": {0: {"x": 100.0, "y": 50.0}, 1: {"x": 110.0, "y": 55.0}},
            "b": {0: {"x": 10.0, "y": 20.0}, 1: {"x": 10.2, "y": 20.4}},
        }
    )
    assert floor.value == pytest.approx(0.10)
    assert floor.per_arm["b"] == pytest.approx(0.02)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(1.0, 1000.0), min_size=1, max_size=20),
    st.floats(0.2, 5.0),
)
def test_paired_effect_recovers_an_exact_scale(values: list[float], scale: float) -> None:
    base = {f"p{i}": v for i, v in enumerate(values)}
    arm = {k: v * scale for k, v in base.items()}
    v = compare_paired("decode_tok_s", "b", "a", base, arm, noise=0.0)
    if len(values) < 2:
        assert v.verdict == TOO_FEW and v.effect is None
    else:
        assert v.effect == pytest.approx(scale - 1, rel=1e-9, abs=1e-12)
        # every ratio is the same: the bootstrap interval collapses onto the effect
        assert v.ci_low == pytest.approx(v.effect, rel=1e-9, abs=1e-12)


def test_summary_and_median_interval() -> None:
    values = list(np.random.default_rng(0).normal(100, 10, 200))
    s = summarize(values)
    assert s is not None and s.n == 200 and s.p10 < s.median < s.p90
    lo, hi = median_ci(values)
    assert lo < s.median < hi and hi - lo < 6
    assert summarize([]) is None and median_ci([1.0, 2.0]) is None


def _two_modes(rng: np.random.Generator, n: int, low: float, high: float, share_low: float) -> list[float]:
    n_low = round(n * share_low)
    return list(
        np.concatenate([low * np.exp(rng.normal(0, 0.05, n_low)), high * np.exp(rng.normal(0, 0.05, n - n_low))])
    )


def test_planted_two_mode_ttft_is_flagged() -> None:
    for seed in range(20):
        sample = _two_modes(np.random.default_rng(seed), 40, 0.020, 0.080, 0.6)
        b = detect_bimodal(sample)
        assert b.flagged, b.reason
        assert b.modes[0] == pytest.approx(0.020, rel=0.1) and b.modes[1] == pytest.approx(0.080, rel=0.1)
        assert b.weights[0] == pytest.approx(0.6, abs=0.05)
        assert b.delta_bic is not None and b.delta_bic > 10 and b.ashman_d is not None and b.ashman_d > 2


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("lognormal", lambda rng: list(0.03 * np.exp(rng.normal(0, 0.3, 200)))),
        ("normal", lambda rng: list(np.abs(rng.normal(0.050, 0.005, 100)))),
        ("gamma tail", lambda rng: list(0.01 + rng.gamma(2.0, 0.01, 150))),
        ("5% outliers", lambda rng: _two_modes(rng, 100, 0.020, 0.200, 0.95)),
        ("modes 5% apart", lambda rng: _two_modes(rng, 100, 0.020, 0.021, 0.5)),
    ],
)
def test_one_mode_samples_are_not_flagged(name: str, make) -> None:
    flagged = [detect_bimodal(make(np.random.default_rng(seed))).flagged for seed in range(30)]
    assert sum(flagged) == 0, f"{name}: flagged {sum(flagged)}/30"


def test_too_few_samples_are_not_judged() -> None:
    b = detect_bimodal([0.01, 0.011, 0.05, 0.051, 0.01, 0.052])
    assert not b.flagged and b.reason.startswith("too few")


def test_geometric_mean_ignores_non_positive() -> None:
    assert geometric_mean([1.0, 4.0, 0.0]) == pytest.approx(2.0)
    assert math.isnan(geometric_mean([]))


def test_geometric_mean_interval() -> None:
    values = list(np.exp(np.random.default_rng(2).normal(math.log(50), 0.2, 40)))
    lo, hi = geomean_ci(values)
    assert lo < geometric_mean(values) < hi and lo > 40 and hi < 60
    assert geomean_ci([1.0, 2.0]) is None


def test_one_sign_test_serves_both_verdicts() -> None:
    """The quality verdict and the paired speed comparison share one exact sign test and its floor."""
    from weightsmith.bench.quality import verdict
    from weightsmith.bench.stats import sign_test, sign_test_can_reach

    assert verdict.sign_test is sign_test and verdict.sign_test_can_reach is sign_test_can_reach
    assert sign_test(5, 0) == pytest.approx(2 * 0.5**5) and sign_test(3, 3) == pytest.approx(1.0)
    assert sign_test(0, 0) is None
    assert not sign_test_can_reach(0, 0.05) and not sign_test_can_reach(5, 0.05)
    assert sign_test_can_reach(6, 0.05)
