"""Quality verdicts: what each arm passed, how much that moves between its own runs, and whether
another arm differs from the baseline by more than that.

The rules, and why:

- The unit is the scenario. Every arm answers the same scenarios, so arms are compared scenario by
  scenario (paired), which removes the easy-against-hard spread between scenarios.
- **Noise floor first.** Greedy decoding on a real server is not repeatable (batching, kernels,
  near-ties), so the same bytes can pass a scenario in one run and fail it in the next. Per arm:
  the scenarios whose outcome is not the same in all of its runs (*flips*), and the categories whose
  earned count moved between runs. A gap between arms that the arms' own reruns produce is not
  evidence of anything.
- **Discordant scenarios**: over all runs, those the two arms did not pass equally often (each
  scenario's share of runs passed, arm against baseline); per run index, those where run i of the
  arm and run i of the baseline disagree. Of the discordant ones, those that also flip within
  either arm are counted and named.
- **Test**: an exact two-sided sign test (`scipy.stats.binomtest`, p = 1/2) on the over-all-runs
  discordant scenarios, which is the exact McNemar test when each arm ran once. That one test
  decides; the per-run tests are shown beside it. Below 6 discordant scenarios no outcome can reach
  p < 0.05, and the reason says so.
- **Verdict**: "difference shown" only when the test rejects at the run's alpha *and* a run of the
  arm and a run of the baseline disagree on more scenarios, on average over every such pair of runs,
  than two runs of the noisier arm disagree with each other (as a speed comparison is held to the
  larger of its two arms' noise floors). Both sides are counts per pair of runs, so neither grows
  with the number of runs: more runs measure the floor better, they do not raise it. An arm that ran
  once has no measured noise floor, so nothing is shown against it. Anything else is "no ordering shown",
  never a small win, with the figures and the reason in one sentence that stays true when quoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations, product

from weightsmith.bench.results import QualityRun
from weightsmith.bench.stats import sign_test, sign_test_can_reach
from weightsmith.core.terminal import markdown_code, markdown_text

SHOWN = "difference shown"
NOT_SHOWN = "no ordering shown"
NOT_COMPARED = "not compared"

#: One run's outcomes: scenario id -> passed.
Outcomes = dict[str, bool]


@dataclass
class ScenarioRow:
    """One scenario across every arm and run: the per-scenario table of results.json."""

    scenario: str
    category: str
    #: arm -> passed in each of its runs, in run order; None where that run did not include it.
    passed: dict[str, list[bool | None]] = field(default_factory=dict)


@dataclass
class CategoryScore:
    """One category of one arm: earned and maximum per run (aligned with the arm's `runs`)."""

    category: str
    earned: list[int]
    total: list[int]


@dataclass
class ArmQuality:
    """One arm's scores per run, and its noise floor: what moved between its own runs."""

    arm: str
    suite: str
    #: The arm's run indices, in order; every list below is aligned with it.
    runs: list[int]
    earned: list[int]
    total: list[int]
    categories: list[CategoryScore]
    #: Scenarios whose outcome is not the same in all of the arm's runs.
    flips: list[str]
    #: Categories whose earned count is not the same in all of the arm's runs.
    moved: list[str]
    #: Scenarios on which two of the arm's runs disagree, on average over every pair of its runs
    #: (None with one run): the noise floor the between-arm disagreement is held to.
    disagreement: float | None = None
    words: str = ""

    @property
    def floor_measured(self) -> bool:
        """Two runs or more: only then can anything be seen to flip."""
        return len(self.runs) >= 2


@dataclass
class RunPair:
    """Run i of an arm against run i of the baseline, over the scenarios both runs answered."""

    run: int
    scenarios: int
    arm_only: int
    baseline_only: int
    p: float | None


@dataclass
class QualityComparison:
    """An arm against the baseline, scenario by scenario, read against both arms' own flips."""

    baseline: str
    arm: str
    verdict: str
    reason: str
    words: str
    #: Scenarios both arms answered.
    scenarios: int = 0
    #: Over all runs: scenarios the arm passed in a larger share of its runs than the baseline did.
    arm_better: list[str] = field(default_factory=list)
    baseline_better: list[str] = field(default_factory=list)
    #: The discordant scenarios that also flip between either arm's own runs.
    also_flip: list[str] = field(default_factory=list)
    #: Scenarios on which two runs of the noisier arm disagree, on average over its pairs of runs
    #: (None when either ran once), and which arm that is.
    floor: float | None = None
    floor_arm: str | None = None
    #: Scenarios on which a run of the arm and a run of the baseline disagree, on average over every
    #: such pair of runs.
    between: float | None = None
    p: float | None = None
    per_run: list[RunPair] = field(default_factory=list)
    #: Which arm passed more, when a difference is shown.
    better: str | None = None

    @property
    def discordant(self) -> int:
        return len(self.arm_better) + len(self.baseline_better)


@dataclass
class QualityAnalysis:
    """Everything the report's Quality section and the card read, recomputed from the raw runs."""

    baseline: str
    alpha: float
    arms: list[ArmQuality]
    comparisons: list[QualityComparison]
    categories: list[str]
    scenarios: list[ScenarioRow]


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _scores(a: ArmQuality) -> str:
    """'87 of 88', '87 and 85 of 88 in its 2 runs', or '87 of 88 and 85 of 87'."""
    if len(a.runs) == 1:
        return f"{a.earned[0]} of {a.total[0]}"
    if len(set(a.total)) == 1:
        return f"{_and([str(e) for e in a.earned])} of {a.total[0]} in its {len(a.runs)} runs"
    return _and([f"{e} of {t}" for e, t in zip(a.earned, a.total, strict=True)])


def _arm(name: str, suite: str, numbers: list[int], runs: list[Outcomes], category: dict[str, str]) -> ArmQuality:
    answered = list(dict.fromkeys(s for r in runs for s in r))
    names = list(dict.fromkeys(category[s] for s in answered))
    categories = [
        CategoryScore(
            c,
            [sum(passed for s, passed in r.items() if category[s] == c) for r in runs],
            [sum(1 for s in r if category[s] == c) for r in runs],
        )
        for c in names
    ]
    flips = [s for s in answered if len({r[s] for r in runs if s in r}) > 1]
    pairs = list(combinations(runs, 2))
    moved = [c.category for c in categories if len(set(c.earned)) > 1]
    a = ArmQuality(
        arm=name,
        suite=suite,
        runs=numbers,
        earned=[sum(r.values()) for r in runs],
        total=[len(r) for r in runs],
        categories=categories,
        flips=flips,
        moved=moved,
        disagreement=_mean_disagreement(pairs) if pairs else None,
    )
    if not a.floor_measured:
        a.words = (
            f"{markdown_code(name)} ran once and passed {_scores(a)}; what flips between two runs of the same bytes "
            "was not measured for it"
        )
    else:
        which = f" ({', '.join(map(markdown_text, moved))})" if moved else ""
        a.words = (
            f"{markdown_code(name)} passed {_scores(a)}; {len(flips)} of {len(answered)} scenarios flip between "
            f"its own runs, and {len(moved)} of {len(names)} categories moved{which}"
        )
    return a


def _disagree(a: Outcomes, b: Outcomes) -> int:
    """Scenarios both runs answered on which their outcomes differ."""
    return sum(1 for s, passed in a.items() if s in b and b[s] != passed)


def _mean_disagreement(pairs: Sequence[tuple[Outcomes, Outcomes]]) -> float:
    return sum(_disagree(a, b) for a, b in pairs) / len(pairs)


def _count(x: float) -> str:
    """A mean count of scenarios: whole when it is one, else to one decimal."""
    return f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def _share(runs: list[Outcomes], scenario: str) -> Fraction:
    seen = [r[scenario] for r in runs if scenario in r]
    return Fraction(sum(seen), len(seen))


def _per_run(base: list[Outcomes], arm: list[Outcomes]) -> list[RunPair]:
    pairs = []
    for i, (b, a) in enumerate(zip(base, arm, strict=False)):
        common = [s for s in b if s in a]
        arm_only = sum(1 for s in common if a[s] and not b[s])
        baseline_only = sum(1 for s in common if b[s] and not a[s])
        pairs.append(RunPair(i, len(common), arm_only, baseline_only, sign_test(arm_only, baseline_only)))
    return pairs


def _compare(
    base: ArmQuality, arm: ArmQuality, base_runs: list[Outcomes], arm_runs: list[Outcomes], alpha: float
) -> QualityComparison:
    order = list(dict.fromkeys(s for r in base_runs for s in r))
    in_arm = {s for r in arm_runs for s in r}
    shared = [s for s in order if s in in_arm]
    c = QualityComparison(baseline=base.arm, arm=arm.arm, verdict=NOT_SHOWN, reason="", words="", scenarios=len(shared))
    c.arm_better = [s for s in shared if _share(arm_runs, s) > _share(base_runs, s)]
    c.baseline_better = [s for s in shared if _share(arm_runs, s) < _share(base_runs, s)]
    within = set(base.flips) | set(arm.flips)
    c.also_flip = [s for s in shared if s in within and (s in c.arm_better or s in c.baseline_better)]
    c.per_run = _per_run(base_runs, arm_runs)
    c.p = sign_test(len(c.arm_better), len(c.baseline_better))
    c.between = _mean_disagreement(list(product(arm_runs, base_runs)))
    if base.disagreement is not None and arm.disagreement is not None:
        noisier = arm if arm.disagreement > base.disagreement else base
        c.floor, c.floor_arm = noisier.disagreement, noisier.arm

    untied = c.discordant
    reasons = []
    once = [markdown_code(x.arm) for x in (base, arm) if not x.floor_measured]
    if once:
        reasons.append(f"{_and(once)} ran once, so what flips between its own runs is unknown")
    if c.p is None:
        reasons.append("they passed the same scenarios")
    elif c.p >= alpha:
        if not sign_test_can_reach(untied, alpha):
            reasons.append(f"{untied} differing scenario(s) cannot reach p < {alpha:g} in a sign test")
        else:
            reasons.append(f"sign test p = {c.p:.3g} >= {alpha:g}")
    if c.floor is not None and c.between <= c.floor and c.p is not None:
        reasons.append(
            f"a run of each disagrees on {_count(c.between)} scenarios on average, not more than the "
            f"{_count(c.floor)} on which two of {markdown_code(str(c.floor_arm))}'s own runs disagree"
        )
    if reasons:
        c.reason = "; ".join(reasons)
        tail = f"{NOT_SHOWN} ({c.reason})"
    else:
        c.verdict = SHOWN
        c.better = arm.arm if len(c.arm_better) > len(c.baseline_better) else base.arm
        c.reason = (
            f"sign test p = {c.p:.3g} < {alpha:g}, and a run of each disagrees on {_count(c.between)} scenarios "
            f"on average, more than the {_count(c.floor or 0.0)} on which two of {markdown_code(str(c.floor_arm))}'s "
            "own runs disagree"
        )
        tail = f"{SHOWN}: {markdown_code(c.better)} passed more"

    several = len(base.runs) > 1 or len(arm.runs) > 1
    where = "they did not pass equally often" if several else "where they differ"
    measured = [x.arm for x in (arm, base) if x.floor_measured]
    if len(measured) == 2:
        flips = f"{len(c.also_flip)} also flip between either arm's own runs"
    elif measured:
        flips = f"{len(c.also_flip)} also flip between {markdown_code(measured[0])}'s own runs (the other arm ran once)"
    else:
        flips = "whether they also flip between an arm's own runs is unknown (each arm ran once)"
    p = "no test" if c.p is None else f"p = {c.p:.3g}"
    named, baseline = markdown_code(arm.arm), markdown_code(base.arm)
    c.words = (
        f"{named} passed {_scores(arm)}, {baseline} {_scores(base)}; of the {untied} scenarios {where}, "
        f"{flips}; sign test {len(c.arm_better)} for {named} and {len(c.baseline_better)} for {baseline}, "
        f"{p}: {tail}"
    )
    return c


def _not_compared(base: str, arm: str, reason: str) -> QualityComparison:
    words = f"{markdown_code(arm)} against {markdown_code(base)}: {reason}"
    return QualityComparison(baseline=base, arm=arm, verdict=NOT_COMPARED, reason=reason, words=words)


def analyse_quality(
    runs: Sequence[QualityRun], arms: Sequence[str], baseline: str, alpha: float
) -> QualityAnalysis | None:
    """Scores, noise floors and verdicts for `arms` (in order) against `baseline`; None without quality runs.

    Runs of arms not in `arms` are left out. A scenario that appears twice in one run keeps its last outcome.
    """
    known = [r for r in runs if r.arm in arms]
    if not known:
        return None
    category: dict[str, str] = {}
    for r in known:
        for o in r.outcomes:
            category.setdefault(o.scenario, o.category)
    per_arm: dict[str, list[QualityRun]] = {a: sorted((r for r in known if r.arm == a), key=lambda r: r.run)
                                            for a in arms}  # fmt: skip
    outcomes = {a: [{o.scenario: o.passed for o in r.outcomes} for r in rs] for a, rs in per_arm.items()}
    scored = {a: _arm(a, rs[0].suite, [r.run for r in rs], outcomes[a], category) for a, rs in per_arm.items() if rs}
    comparisons = []
    for a in arms:
        if a == baseline:
            continue
        if baseline not in scored or a not in scored:
            missing = baseline if baseline not in scored else a
            comparisons.append(_not_compared(baseline, a, f"{markdown_code(missing)} ran no quality suite"))
        elif scored[a].suite != scored[baseline].suite:
            comparisons.append(
                _not_compared(baseline, a, f"they ran different suites ({scored[baseline].suite}, {scored[a].suite})")
            )
        elif not {s for r in outcomes[a] for s in r} & {s for r in outcomes[baseline] for s in r}:
            comparisons.append(_not_compared(baseline, a, "no scenario was answered by both"))
        else:
            comparisons.append(_compare(scored[baseline], scored[a], outcomes[baseline], outcomes[a], alpha))
    scenarios = [
        ScenarioRow(s, c, {a: [r.get(s) for r in outcomes[a]] for a in arms if outcomes[a]})
        for s, c in category.items()
    ]
    return QualityAnalysis(
        baseline=baseline,
        alpha=alpha,
        arms=list(scored.values()),
        comparisons=comparisons,
        categories=list(dict.fromkeys(category.values())),
        scenarios=scenarios,
    )
