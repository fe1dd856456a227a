"""Turn a raw run into the numbers a report shows: per-cell spread, acceptance, verdicts, sweeps.

Everything here is recomputed from `BenchResults`, so the same analysis comes out of a fresh run
and out of a results file read back years later.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from weightsmith.bench import determinism as det
from weightsmith.bench import metrics as m
from weightsmith.bench import stats
from weightsmith.bench.config import sweep_base
from weightsmith.bench.quality.verdict import QualityAnalysis, analyse_quality
from weightsmith.bench.results import ArmInfo, BenchResults, RequestRecord
from weightsmith.bench.schedule import is_fully_balanced
from weightsmith.core.terminal import markdown_code


@dataclass(frozen=True)
class MetricSpec:
    """A per-request measurement the arms are compared on."""

    key: str
    label: str
    higher_is_better: bool


METRICS = (
    MetricSpec("decode_tok_s", "decode rate", True),
    MetricSpec("ttft_s", "TTFT", False),
    MetricSpec("e2e_s", "end-to-end time", False),
)
#: Drafts are compared on each request's own mean acceptance length (`RequestRecord.acceptance_length`).
ACCEPTANCE = MetricSpec("acceptance_length", "mean acceptance length", True)


@dataclass
class CellSummary:
    """One arm at one prompt length, pooled over repeats (every sample kept in the results)."""

    arm: str
    target_tokens: int
    n_ok: int
    n_errors: int
    prompt_tokens_median: float | None = None
    completion_tokens_median: float | None = None
    cached_tokens_total: int = 0
    ttft: stats.Summary | None = None
    ttft_modality: stats.Bimodality | None = None
    decode: stats.Summary | None = None
    decode_median_ci: list[float] | None = None
    e2e: stats.Summary | None = None
    tokens_per_chunk: float | None = None
    prefill_tok_s: stats.Summary | None = None
    prefill_note: str | None = None


@dataclass
class AcceptanceSummary:
    """Spec-decode acceptance of one arm, pooled over its usable /metrics windows."""

    arm: str
    status: str
    detail: str = ""
    windows_ok: int = 0
    windows_total: int = 0
    flavour: str | None = None
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position_rate: list[float] = field(default_factory=list)
    window_rates: list[float] = field(default_factory=list)


@dataclass
class SweepPoint:
    """One value of a swept parameter: decode rate as the geometric mean over the (shared) prompts,
    each prompt's repeats combined first, with a bootstrap interval over prompts."""

    arm: str
    value: float | str
    decode_geomean: float | None
    decode_ci: list[float] | None
    mean_acceptance_length: float | None


@dataclass
class Sweep:
    """An arm expanded over one parameter, and the value with the best decode rate."""

    base: str
    param: str
    points: list[SweepPoint]
    best_arm: str | None
    best_value: float | str | None
    #: The arms whose decode interval reaches the best's: no ordering is shown between them and it.
    overlapping: list[str] = field(default_factory=list)

    @property
    def best_note(self) -> str:
        """Why the best is not settled, in words a report or card shows (names quoted), or ""."""
        if not self.overlapping:
            return ""
        return f"intervals overlap with {', '.join(map(markdown_code, self.overlapping))}: the ranking is not settled"


@dataclass
class Analysis:
    """What the report shows, in one object that serialises beside the raw results."""

    baseline: str
    cells: list[CellSummary]
    acceptance: list[AcceptanceSummary]
    noise: dict[str, stats.NoiseFloor]
    comparisons: list[stats.PairedComparison]
    sweeps: list[Sweep]
    determinism: list[det.ArmDeterminism]
    determinism_pairs: list[det.PairDeterminism]
    order_fully_balanced: bool
    notes: list[str] = field(default_factory=list)
    #: Drafts against the acceptance baseline's draft, prompt by prompt at the same swept value, and the
    #: repeat-to-repeat floor of per-prompt acceptance they are judged against.
    acceptance_baseline: str | None = None
    acceptance_noise: stats.NoiseFloor | None = None
    acceptance_comparisons: list[stats.PairedComparison] = field(default_factory=list)
    #: Task scores, their noise floors and verdicts; None when the run had no `[quality]` table.
    quality: QualityAnalysis | None = None


def _ok_requests(results: BenchResults, arm: str) -> list[tuple[int, RequestRecord]]:
    return [(v.repeat, r) for v in results.visits if v.arm == arm for r in v.requests if r.ok]


def _per_prompt(
    rows: list[tuple[int, RequestRecord]], metric: str
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """(prompt -> geometric mean over repeats, repeat -> prompt -> value) for one metric."""
    by_prompt: dict[str, list[float]] = defaultdict(list)
    by_repeat: dict[int, dict[str, float]] = defaultdict(dict)
    for repeat, r in rows:
        value = getattr(r, metric)
        if value is None or value <= 0:
            continue
        by_prompt[r.prompt_key].append(value)
        by_repeat[repeat][r.prompt_key] = value
    return {k: stats.geometric_mean(v) for k, v in by_prompt.items()}, dict(by_repeat)


def _cells(results: BenchResults) -> list[CellSummary]:
    cells = []
    lengths = sorted({p.target_tokens for p in results.prompts})
    for arm in results.arms:
        all_requests = [r for v in results.visits if v.arm == arm.name for r in v.requests]
        for length in lengths:
            rs = [r for r in all_requests if r.target_tokens == length]
            ok = [r for r in rs if r.ok]
            cell = CellSummary(arm=arm.name, target_tokens=length, n_ok=len(ok), n_errors=len(rs) - len(ok))
            if ok:
                pt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
                ct = [r.completion_tokens for r in ok if r.completion_tokens is not None]
                cell.prompt_tokens_median = statistics.median(pt) if pt else None
                cell.completion_tokens_median = statistics.median(ct) if ct else None
                cell.cached_tokens_total = sum(r.cached_tokens or 0 for r in ok)
                ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
                decode = [r.decode_tok_s for r in ok if r.decode_tok_s is not None]
                cell.ttft = stats.summarize(ttft)
                cell.ttft_modality = stats.detect_bimodal(ttft)
                cell.decode = stats.summarize(decode)
                ci = stats.median_ci(decode)
                cell.decode_median_ci = list(ci) if ci else None
                cell.e2e = stats.summarize([r.e2e_s for r in ok if r.e2e_s is not None])
                chunks = [r.completion_tokens / r.token_chunks for r in ok if r.completion_tokens and r.token_chunks]
                cell.tokens_per_chunk = statistics.median(chunks) if chunks else None
                if cell.prompt_tokens_median is not None and (cell.prompt_tokens_median >= results.prefill_min_tokens):
                    cell.prefill_tok_s = stats.summarize(
                        [r.prompt_tokens / r.ttft_s for r in ok if r.prompt_tokens and r.ttft_s]
                    )
                else:
                    cell.prefill_note = (
                        f"prompts under {results.prefill_min_tokens} tokens: TTFT is mostly "
                        "fixed overhead, so no prefill rate is derived from it"
                    )
            cells.append(cell)
    return cells


def _acceptance(results: BenchResults) -> list[AcceptanceSummary]:
    out = []
    for arm in results.arms:
        windows = [v.spec for v in results.visits if v.arm == arm.name and v.spec is not None]
        usable = [w for w in windows if w.status == m.OK]
        summary = AcceptanceSummary(
            arm=arm.name, status=m.OK if usable else "", windows_ok=len(usable), windows_total=len(windows)
        )
        if not usable:
            if not windows:
                summary.status = m.UNAVAILABLE
                summary.detail = "no measured window"
            else:
                summary.status = windows[-1].status
                summary.detail = "; ".join(sorted({f"{w.status}: {w.detail}" for w in windows}))
            out.append(summary)
            continue
        summary.flavour = usable[0].flavour
        summary.drafts = sum(w.drafts or 0 for w in usable)
        summary.draft_tokens = sum(w.draft_tokens or 0 for w in usable)
        summary.accepted = sum(w.accepted or 0 for w in usable)
        per_pos = m.sum_per_position([w.accepted_per_pos for w in usable])
        summary.acceptance_rate, summary.mean_acceptance_length, summary.per_position_rate = m.acceptance_figures(
            summary.drafts, summary.draft_tokens, summary.accepted, per_pos
        )
        summary.window_rates = [w.acceptance_rate for w in usable if w.acceptance_rate is not None]
        skipped = [w for w in windows if w.status != m.OK]
        if skipped:
            summary.detail = f"{len(skipped)} window(s) not used: " + "; ".join(
                sorted({f"{w.status}: {w.detail}" for w in skipped})
            )
        out.append(summary)
    return out


def _sweeps(
    results: BenchResults, acceptance: list[AcceptanceSummary], decode_per_prompt: dict[str, dict[str, float]]
) -> list[Sweep]:
    """Sweep points from each arm's per-prompt decode rates (arm -> prompt -> rate, from `_per_prompt`)."""
    groups: dict[tuple[str, str], list[SweepPoint]] = defaultdict(list)
    accept = {a.arm: a.mean_acceptance_length for a in acceptance}
    for arm in results.arms:
        if arm.sweep_param is None:
            continue
        values = list(decode_per_prompt[arm.name].values())
        ci = stats.geomean_ci(values)
        groups[(sweep_base(arm.name), arm.sweep_param)].append(
            SweepPoint(
                arm=arm.name,
                value=arm.sweep_value,
                decode_geomean=stats.geometric_mean(values) if values else None,
                decode_ci=list(ci) if ci else None,
                mean_acceptance_length=accept.get(arm.name),
            )
        )
    sweeps = []
    for (base, param), points in groups.items():
        measured = [p for p in points if p.decode_geomean is not None]
        best = max(measured, key=lambda p: p.decode_geomean or 0.0) if measured else None
        overlapping = []
        if best is not None and best.decode_ci is not None:
            overlapping = [
                p.arm
                for p in measured
                if p is not best and p.decode_ci is not None and p.decode_ci[1] >= best.decode_ci[0]
            ]
        sweeps.append(
            Sweep(
                base=base,
                param=param,
                points=points,
                best_arm=best.arm if best else None,
                best_value=best.value if best else None,
                overlapping=overlapping,
            )
        )
    return sweeps


def _acceptance_partner(results: BenchResults, arm: ArmInfo, base: str) -> str | None:
    """The arm of draft `base` that `arm` is compared with: the one at the same swept value where `base`
    is swept, else `base` itself; None for `base`'s own arms."""
    if sweep_base(arm.name) == base:
        return None
    for other in results.arms:
        if (
            sweep_base(other.name) == base
            and other.sweep_param == arm.sweep_param
            and other.sweep_value == arm.sweep_value
        ):
            return other.name
    return base if any(a.name == base for a in results.arms) else None


def per_prompt_acceptance(
    results: BenchResults,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[int, dict[str, float]]]]:
    """Each arm's mean acceptance length per prompt (repeats combined by geometric mean), and per
    repeat and prompt: from the requests' own counts, so empty for arms measured without them."""
    per_prompt: dict[str, dict[str, float]] = {}
    per_repeat: dict[str, dict[int, dict[str, float]]] = {}
    for arm in results.arms:
        per_prompt[arm.name], per_repeat[arm.name] = _per_prompt(_ok_requests(results, arm.name), ACCEPTANCE.key)
    return per_prompt, per_repeat


def _acceptance_comparisons(
    results: BenchResults, acceptance: list[AcceptanceSummary]
) -> tuple[stats.NoiseFloor | None, list[stats.PairedComparison]]:
    """Each speculating arm against its acceptance-baseline partner on per-prompt acceptance length."""
    base = results.acceptance_baseline
    speculating = {a.arm for a in acceptance if a.status == m.OK}
    if base is None or not speculating:
        return None, []
    per_prompt, per_repeat = per_prompt_acceptance(results)
    floor = stats.noise_floor({a: r for a, r in per_repeat.items() if r})
    comparisons = []
    for arm in results.arms:
        partner = _acceptance_partner(results, arm, base)
        if partner is None or arm.name not in speculating:
            continue
        comparisons.append(
            stats.compare_paired(
                ACCEPTANCE.key,
                partner,
                arm.name,
                per_prompt[partner],
                per_prompt[arm.name],
                noise=_pair_floor(floor, partner, arm.name),
                alpha=results.alpha,
                higher_is_better=True,
            )
        )
    return floor, comparisons


def _pair_floor(floor: stats.NoiseFloor, a: str, b: str) -> float | None:
    """The noise floor for comparing `a` with `b`: the larger of their own repeat-to-repeat gaps
    (a noisy third arm says nothing about these two)."""
    gaps = [floor.per_arm[x] for x in (a, b) if x in floor.per_arm]
    return max(gaps) if gaps else None


def analyse(results: BenchResults) -> Analysis:
    """The full analysis of a run."""
    baseline = results.baseline
    cells = _cells(results)
    acceptance = _acceptance(results)
    noise: dict[str, stats.NoiseFloor] = {}
    comparisons: list[stats.PairedComparison] = []
    decode_per_prompt: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        per_arm_prompt: dict[str, dict[str, float]] = {}
        per_arm_repeat: dict[str, dict[int, dict[str, float]]] = {}
        for arm in results.arms:
            per_arm_prompt[arm.name], per_arm_repeat[arm.name] = _per_prompt(
                _ok_requests(results, arm.name), metric.key
            )
        if metric.key == "decode_tok_s":
            decode_per_prompt = per_arm_prompt
        floor = stats.noise_floor(per_arm_repeat)
        noise[metric.key] = floor
        for arm in results.arms:
            if arm.name == baseline:
                continue
            comparisons.append(
                stats.compare_paired(
                    metric.key,
                    baseline,
                    arm.name,
                    per_arm_prompt.get(baseline, {}),
                    per_arm_prompt[arm.name],
                    noise=_pair_floor(floor, baseline, arm.name),
                    alpha=results.alpha,
                    higher_is_better=metric.higher_is_better,
                )
            )
    runs = {r.arm: r for r in results.determinism}
    within = {name: det.analyse_arm(run) for name, run in runs.items()}
    pairs = []
    if baseline in runs:
        for name, run in runs.items():
            if name != baseline:
                pair = det.compare_arms(runs[baseline], run, within)
                if pair is not None:
                    pairs.append(pair)
    notes: list[str] = []
    acceptance_noise, acceptance_comparisons = _acceptance_comparisons(results, acceptance)
    if acceptance_comparisons and not any(c.n_pairs for c in acceptance_comparisons):
        notes.append(
            "drafts: no request carries its own acceptance counts (they are read only at concurrency 1), "
            "so no two drafts are compared prompt by prompt"
        )
    n_arms = len(results.arms)
    repeats = 1 + max((v.repeat for v in results.visits), default=0)
    balanced = is_fully_balanced(n_arms, repeats)
    if not balanced:
        notes.append(
            f"order: {repeats} repeat(s) of {n_arms} arms do not use every row of the "
            "counterbalancing design; positions are not fully balanced"
        )
    return Analysis(
        baseline=baseline,
        cells=cells,
        acceptance=acceptance,
        noise=noise,
        comparisons=comparisons,
        sweeps=_sweeps(results, acceptance, decode_per_prompt),
        determinism=list(within.values()),
        determinism_pairs=pairs,
        order_fully_balanced=balanced,
        notes=notes,
        acceptance_baseline=results.acceptance_baseline,
        acceptance_noise=acceptance_noise,
        acceptance_comparisons=acceptance_comparisons,
        quality=analyse_quality(results.quality, [a.name for a in results.arms], baseline, results.alpha),
    )
