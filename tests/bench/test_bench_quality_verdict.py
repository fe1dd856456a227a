"""Quality verdicts on planted answers: identical noisy arms, a planted gap, flips counted as flips."""

from __future__ import annotations

import json

import numpy as np
import numpy.typing as npt
import pytest

from weightsmith.bench.quality.verdict import (
    NOT_COMPARED,
    NOT_SHOWN,
    SHOWN,
    QualityAnalysis,
    analyse_quality,
)
from weightsmith.bench.results import QualityRun, ScenarioOutcome, to_jsonable
from weightsmith.bench.stats import sign_test

ALPHA = 0.05


def runs_of(arm: str, table: list[list[bool]], category: str = "c", suite: str = "s") -> list[QualityRun]:
    """One QualityRun per row of `table` (run i = row i), scenarios named s0, s1, ..."""
    return [
        QualityRun(arm, i, suite, [ScenarioOutcome(f"s{k}", category, p) for k, p in enumerate(row)])
        for i, row in enumerate(table)
    ]


def simulate(
    seed: int, *, scenarios: int = 160, gap: int = 0, flip: float = 0.1, runs: int = 2, pass_rate: float = 0.6
) -> list[QualityRun]:
    """A baseline and an arm over the same scenarios: each scenario's true outcome, the arm failing `gap`
    of those the baseline passes, and every run flipping each outcome with probability `flip`."""
    rng = np.random.default_rng(seed)
    truth: dict[str, npt.NDArray[np.bool_]] = {"base": rng.random(scenarios) < pass_rate}
    arm = truth["base"].copy()
    arm[rng.choice(np.flatnonzero(arm), size=gap, replace=False)] = False
    truth["arm"] = arm
    out = []
    for name, t in truth.items():
        table = [list(t ^ (rng.random(scenarios) < flip)) for _ in range(runs)]
        out += runs_of(name, [[bool(v) for v in row] for row in table], category=f"c{seed % 3}")
    return out


def verdict_of(runs: list[QualityRun]) -> QualityAnalysis:
    q = analyse_quality(runs, ["base", "arm"], "base", ALPHA)
    assert q is not None
    return q


def test_identical_arms_with_ten_percent_flips_show_no_ordering() -> None:
    n = 400
    comparisons = [verdict_of(simulate(seed)).comparisons[0] for seed in range(n)]
    shown = sum(c.verdict == SHOWN for c in comparisons)
    rejected = sum(c.p is not None and c.p < ALPHA for c in comparisons)
    assert shown <= ALPHA * n, f"{shown}/{n} identical pairs called different"
    # the exact test alone keeps its level: it rejects about alpha of the time, not more
    assert rejected <= 1.5 * ALPHA * n, f"sign test rejected {rejected}/{n} identical pairs"
    assert all(c.words.endswith(")") for c in comparisons if c.verdict == NOT_SHOWN)
    # two runs with 10% flips each: about 18% of 160 scenarios flip within each arm
    assert all(20 <= len(a.flips) <= 40 for a in verdict_of(simulate(0)).arms)


@pytest.mark.parametrize("flip", [0.0, 0.02])
def test_planted_25_point_gap_over_160_scenarios_is_shown(flip: float) -> None:
    for seed in range(50):
        c = verdict_of(simulate(seed, gap=40, flip=flip)).comparisons[0]
        assert c.verdict == SHOWN, c.words
        assert c.better == "base"
        assert c.p is not None and c.p < 1e-6
        assert len(c.baseline_better) - len(c.arm_better) >= 30
        assert c.words.endswith("difference shown: `base` passed more")


def test_noisy_runs_do_not_hide_a_25_point_gap_and_more_runs_do_not_raise_the_floor() -> None:
    # with 10% flips per run about 18% of scenarios flip within each arm, yet two runs of one arm
    # disagree on ~29 scenarios while a run of each disagrees on ~29 + 40: the gap stands out; a
    # third run measures the same per-pair floor, it does not raise it
    for runs in (2, 3):
        comparisons = [verdict_of(simulate(seed, gap=40, flip=0.1, runs=runs)).comparisons[0] for seed in range(50)]
        assert all(c.verdict == SHOWN for c in comparisons), runs
        assert all(c.floor is not None and c.between is not None for c in comparisons)
        floors = [c.floor for c in comparisons if c.floor is not None]
        assert 20 <= sum(floors) / len(floors) <= 40, runs


def test_discordant_scenarios_that_flip_within_an_arm_are_counted_as_such() -> None:
    # s0, s1 flip between the baseline's own runs, s2 between the arm's; s3 differs consistently
    base = [[True, True, True, True, True], [False, False, True, True, True]]
    arm = [[True, True, True, False, True], [True, True, False, False, True]]
    q = verdict_of(runs_of("base", base) + runs_of("arm", arm))
    b, a = q.arms
    assert (b.flips, a.flips) == (["s0", "s1"], ["s2"])
    c = q.comparisons[0]
    assert c.arm_better == ["s0", "s1"] and c.baseline_better == ["s2", "s3"]
    assert c.also_flip == ["s0", "s1", "s2"]
    # two baseline runs disagree on 2 scenarios, two arm runs on 1; a run of each on 1, 3, 2 and 4
    assert (c.floor, c.floor_arm, c.between) == (2, "base", 2.5)
    assert c.verdict == NOT_SHOWN
    assert "of the 4 scenarios they did not pass equally often, 3 also flip between either arm's own runs" in c.words
    assert c.reason == "4 differing scenario(s) cannot reach p < 0.05 in a sign test"


def test_a_rejecting_test_inside_the_noise_floor_is_not_a_win() -> None:
    # the arm fails 12 scenarios the baseline passes in both runs (p < 0.001), but each arm's own two
    # runs disagree on 30 others: a 12-scenario gap is smaller than what a rerun of either moves
    n = 60
    base = [[True] * n, [k >= 30 for k in range(n)]]
    arm = [[k < 30 or k >= 42 for k in range(n)], [k >= 42 for k in range(n)]]
    c = verdict_of(runs_of("base", base) + runs_of("arm", arm)).comparisons[0]
    assert c.p is not None and c.p < 0.001
    assert c.verdict == NOT_SHOWN
    # a run of each disagrees on 12, 42, 42 and 12 scenarios: 27 on average, below the 30 of either arm
    assert c.reason == "a run of each disagrees on 27 scenarios on average, not more than the 30 on which two of " \
        "`base`'s own runs disagree"  # fmt: skip


def test_one_run_per_arm_measures_no_noise_floor_and_shows_nothing() -> None:
    q = verdict_of(simulate(1, gap=40, flip=0.0, runs=1))
    c = q.comparisons[0]
    assert c.p is not None and c.p < 1e-6  # the test alone would reject
    assert c.verdict == NOT_SHOWN and c.floor is None
    assert "`base` and `arm` ran once, so what flips between its own runs is unknown" in c.reason
    assert all("was not measured" in a.words for a in q.arms)
    assert "where they differ, whether they also flip between an arm's own runs is unknown (each arm ran once)" in (
        c.words
    )
    half = verdict_of([r for r in simulate(1, gap=40, flip=0.0) if r.arm == "base" or r.run == 0]).comparisons[0]
    assert "also flip between `base`'s own runs (the other arm ran once)" in half.words
    assert half.verdict == NOT_SHOWN and half.reason.startswith("`arm` ran once")


def test_the_sentence_states_scores_discordance_test_and_verdict() -> None:
    # the shape of the Laguna-S reading: 9 scenarios differ, 6 of them flip within an arm's own runs
    base = [[True] * 88, [True] * 88]
    arm = [[True] * 88, [True] * 88]
    for k in range(0, 6):  # within-arm flips (s0, s2, s4 in the arm, s1, s3, s5 in the baseline)
        (base if k % 2 else arm)[k % 2][k] = False
    for k in range(6, 9):  # consistent losses of the arm
        arm[0][k] = arm[1][k] = False
    for k in range(9, 11):  # scenarios both arms fail in every run
        for row in (*base, *arm):
            row[k] = False
    c = verdict_of(runs_of("base", base) + runs_of("arm", arm)).comparisons[0]
    assert c.words == (
        "`arm` passed 80 and 83 of 88 in its 2 runs, `base` 86 and 83 of 88 in its 2 runs; of the 9 scenarios they "
        "did not pass equally often, 6 also flip between either arm's own runs; sign test 3 for `arm` and 6 for "
        "`base`, p = 0.508: no ordering shown (sign test p = 0.508 >= 0.05)"
    )


def test_too_few_discordant_scenarios_cannot_reach_the_level() -> None:
    base = [[True] * 20] * 2
    arm = [[k >= 5 for k in range(20)]] * 2
    c = verdict_of(runs_of("base", base) + runs_of("arm", arm)).comparisons[0]
    assert c.verdict == NOT_SHOWN
    assert "5 differing scenario(s) cannot reach p < 0.05 in a sign test" in c.reason
    same = verdict_of(runs_of("base", base) + runs_of("arm", base)).comparisons[0]
    assert same.p is None and "they passed the same scenarios" in same.reason and "no test" in same.words


def test_per_run_pairs_are_exact_mcnemar_on_each_run() -> None:
    base = [[True, True, False, False, True], [True, True, True, False, True]]
    arm = [[False, True, True, True, True], [True, True, True, True, False]]
    c = verdict_of(runs_of("base", base) + runs_of("arm", arm)).comparisons[0]
    assert [(r.run, r.scenarios, r.arm_only, r.baseline_only) for r in c.per_run] == [(0, 5, 2, 1), (1, 5, 1, 1)]
    assert c.per_run[0].p == pytest.approx(1.0) and c.per_run[1].p == pytest.approx(1.0)
    assert sign_test(0, 6) == pytest.approx(2 * 0.5**6)
    assert sign_test(0, 0) is None


def test_scores_per_category_and_moved_categories() -> None:
    runs = [
        QualityRun("base", i, "s", [ScenarioOutcome(f"{c}{k}", c, p) for c, k, p in rows])
        for i, rows in enumerate(
            [
                [("tool", 0, True), ("tool", 1, True), ("code", 0, False), ("code", 1, True)],
                [("tool", 0, True), ("tool", 1, True), ("code", 0, True), ("code", 1, False)],
            ]
        )
    ]
    runs += [QualityRun("arm", 0, "s", [ScenarioOutcome("tool0", "tool", False, error="timeout")])]
    q = analyse_quality(runs, ["base", "arm"], "base", ALPHA)
    assert q is not None
    b = q.arms[0]
    assert (b.earned, b.total) == ([3, 3], [4, 4])
    assert [(c.category, c.earned, c.total) for c in b.categories] == [
        ("tool", [2, 2], [2, 2]),
        ("code", [1, 1], [2, 2]),
    ]
    assert b.flips == ["code0", "code1"] and b.moved == []  # two scenarios flip, the category's count does not move
    assert q.categories == ["tool", "code"]
    assert q.scenarios[0].passed == {"base": [True, True], "arm": [False]}
    assert q.scenarios[2].passed == {"base": [False, True], "arm": [None]}
    assert q.comparisons[0].scenarios == 1  # only tool0 was answered by both


def test_arms_without_runs_or_with_another_suite_are_not_compared() -> None:
    only_base = runs_of("base", [[True, False]])
    q = analyse_quality(only_base, ["base", "arm"], "base", ALPHA)
    assert q is not None and q.comparisons[0].verdict == NOT_COMPARED
    assert q.comparisons[0].reason == "`arm` ran no quality suite"
    other = runs_of("base", [[True]]) + runs_of("arm", [[True]], suite="builtin:tool-use")
    q = analyse_quality(other, ["base", "arm"], "base", ALPHA)
    assert q is not None and "different suites" in q.comparisons[0].reason
    disjoint = [*runs_of("base", [[True]]), QualityRun("arm", 0, "s", [ScenarioOutcome("other", "c", True)])]
    q = analyse_quality(disjoint, ["base", "arm"], "base", ALPHA)
    assert q is not None and q.comparisons[0].reason == "no scenario was answered by both"
    assert analyse_quality([], ["base"], "base", ALPHA) is None
    assert analyse_quality(runs_of("ghost", [[True]]), ["base"], "base", ALPHA) is None


def test_swapping_the_baseline_mirrors_the_comparison() -> None:
    runs = simulate(7, gap=10, flip=0.05)
    one = verdict_of(runs).comparisons[0]
    other = analyse_quality(runs, ["arm", "base"], "arm", ALPHA)
    assert other is not None
    two = other.comparisons[0]
    assert (one.arm_better, one.baseline_better) == (two.baseline_better, two.arm_better)
    assert one.p == two.p and one.also_flip == two.also_flip and one.verdict == two.verdict


def test_the_analysis_is_plain_json() -> None:
    q = verdict_of(simulate(3, gap=40, flip=0.05))
    data = json.loads(json.dumps(to_jsonable(q), allow_nan=False))
    assert data["comparisons"][0]["verdict"] == SHOWN
    assert len(data["scenarios"]) == 160 and set(data["scenarios"][0]["passed"]) == {"base", "arm"}
