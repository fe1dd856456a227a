"""The Markdown report: verdicts first, then the spread behind them, then the evidence.

A reader should learn, in this order: did anything fail, is there a difference that survives the
noise, what the distributions look like, what the servers' own counters and logs say, and exactly
what was run. Numbers that could not be measured say why instead of showing a zero, and a number
that is not finite shows as `–`, never as `nan` or `inf`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from weightsmith.bench import logcheck
from weightsmith.bench.analysis import ACCEPTANCE, METRICS, Analysis, analyse
from weightsmith.bench.determinism import ArmDeterminism
from weightsmith.bench.metrics import INVALID, VOID
from weightsmith.bench.outdir import claim, write_owned
from weightsmith.bench.paths import PLACEHOLDERS, served_model
from weightsmith.bench.plots import sweep_key, write_plots
from weightsmith.bench.quality.verdict import SHOWN as QUALITY_SHOWN
from weightsmith.bench.quality.verdict import ArmQuality, QualityAnalysis
from weightsmith.bench.results import VISIT_OK, BenchResults, to_jsonable, write_json
from weightsmith.bench.stats import SHOWN, PairedComparison
from weightsmith.core.terminal import env_line, fenced_block, markdown_code, markdown_text, shell_line, text_file

_METRIC = {m.key: m for m in (*METRICS, ACCEPTANCE)}
#: Prompt tokens per request a server may take from its cache without comment: the BOS token and
#: the `#` that every unique first line starts with.
_CACHED_TOKENS_NOTED = 3
_MAX_POSITIONS_SHOWN = 8
#: Scenario ids named inline (flips, discordant ones) before "and N more"; the per-scenario table
#: in the report stops at _MAX_SCENARIO_ROWS (results.json holds every one).
_MAX_NAMED = 12
_MAX_SCENARIO_ROWS = 200


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1000:.1f}"


def _num(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:+.1%}"


def _cell(text: str) -> str:
    """`text` as one table cell: a `|` escaped (GitHub splits a row on it, even inside a code span, and
    drops the one backslash before it), a line break made a space."""
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A table; every cell, the header's too, passes through `_cell`, the one place a row is kept whole
    (so a name in a cell is `markdown_code(name)`, never with `cell=True`, which would escape it twice)."""
    lines = ["| " + " | ".join(_cell(c) for c in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _value(value: object) -> str:
    """A swept value as a cell shows it: a number as it is, any other value (a stranger's string, or
    whatever a results file holds there) as plain words or quoted (`markdown_text`)."""
    return str(value) if isinstance(value, int | float) else markdown_text(str(value))


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def _problems(results: BenchResults, analysis: Analysis) -> list[str]:
    lines: list[str] = []
    if results.interrupted:
        lines.append("- **The run was interrupted**; what was measured before is kept below.")
    for arm in results.arms:
        if arm.status != VISIT_OK:
            lines.append(f"- **Arm {markdown_code(arm.name)} failed**: {arm.failure}")
    for v in results.visits:
        if v.log_tail:
            lines += [
                f"  - end of the log of {markdown_code(v.arm)} repeat {v.repeat + 1}:",
                "",
                *fenced_block(v.log_tail.splitlines()[-15:]),
                "",
            ]
    errors: dict[str, int] = {}
    example: dict[str, str] = {}
    for v in results.visits:
        for r in v.requests:
            if r.error:
                errors[v.arm] = errors.get(v.arm, 0) + 1
                example.setdefault(v.arm, r.error)
    for name, n in errors.items():
        lines.append(f"- {markdown_code(name)}: {n} request(s) failed, e.g. {example[name]}")
    for v in results.visits:
        if v.status == VISIT_OK and v.spec is not None and v.spec.status in (VOID, INVALID):
            lines.append(
                f"- {markdown_code(v.arm)} repeat {v.repeat + 1}: its /metrics window is left out ({v.spec.status}): "
                f"{v.spec.detail}"
            )
    for arm in results.arms:
        failed = [o for r in results.quality if r.arm == arm.name for o in r.outcomes if o.error]
        if failed:
            lines.append(
                f"- {markdown_code(arm.name)}: {len(failed)} quality scenario request(s) failed and count as not "
                f"passed, e.g. {markdown_code(failed[0].scenario)}: {failed[0].error}"
            )
    for cell in analysis.cells:
        per_request = cell.cached_tokens_total / max(1, cell.n_ok)
        if per_request > _CACHED_TOKENS_NOTED:
            lines.append(
                f"- {markdown_code(cell.arm)} at {cell.target_tokens} tokens: the server served {per_request:.0f} "
                "prompt tokens per request from its prefix cache despite the unique first lines; "
                "TTFT there is flattered"
            )
    lines += [f"- {note}" for note in analysis.notes]
    return lines


def _comparison_rows(comparisons: list[PairedComparison]) -> list[list[str]]:
    rows = []
    for c in comparisons:
        spec = _METRIC[c.metric]
        verdict = c.verdict
        if c.verdict == SHOWN:
            better = "better" if c.arm_better else "worse"
            verdict = f"**{c.arm} {better}**"
        ci = "–" if c.ci_low is None else f"{_pct(c.ci_low)} … {_pct(c.ci_high)}"
        sign = "–" if c.sign_p is None else f"{c.n_higher}↑ {c.n_lower}↓, p={c.sign_p:.3g}"
        floor = "–" if c.noise_floor is None else f"±{c.noise_floor:.1%}"
        rows.append(
            [
                markdown_code(c.arm),
                spec.label,
                str(c.n_pairs),
                _pct(c.effect),
                ci,
                sign,
                floor,
                verdict,
                c.reason,
            ]
        )
    return rows


_COMPARISON_HEADER = ["arm", "metric", "pairs", "effect", "95% CI", "sign test", "noise floor", "verdict", "why"]


def _verdicts(analysis: Analysis) -> list[str]:
    if not analysis.comparisons:
        return ["Only one arm: nothing to compare."]
    return [
        f"Each arm against the baseline {markdown_code(analysis.baseline)} on matched prompts (the same body "
        "sent to both; effect = geometric mean of per-prompt ratios, positive = the arm's value "
        "is higher). A difference is shown only when the interval excludes 0, the sign test "
        "rejects, and the effect exceeds the noise floor (the larger of the two arms' gaps between "
        "two of their own repeats).",
        "",
        *_table(_COMPARISON_HEADER, _comparison_rows(analysis.comparisons)),
    ]


def _draft_verdicts(analysis: Analysis) -> list[str]:
    """The drafts against the acceptance baseline's draft, prompt by prompt."""
    if not analysis.acceptance_comparisons:
        return []
    comps = analysis.acceptance_comparisons
    floor = analysis.acceptance_noise
    floor_text = "no arm has two repeats with matched prompts"
    if floor is not None and floor.value is not None:
        floor_text = f"±{floor.value:.1%} at most (in {markdown_code(floor.arm or '')})"
    return [
        f"Each draft against {markdown_code(analysis.acceptance_baseline or '')}'s draft at the same swept value, "
        "on each prompt's own mean acceptance length (its requests' counters, /metrics read before and after "
        "each request, repeats combined by geometric mean); baseline column = the arm it is compared "
        f"with. Noise floor: the largest gap between two repeats of one arm, {floor_text}. Same rule "
        "as the verdicts above.",
        "",
        *_table(
            ["against", *_COMPARISON_HEADER],
            [[markdown_code(c.baseline), *row] for c, row in zip(comps, _comparison_rows(comps), strict=True)],
        ),
    ]


def _cells(analysis: Analysis) -> list[str]:
    if not any(c.n_ok + c.n_errors for c in analysis.cells):
        return ["Nothing was measured."]
    rows = []
    notes = set()
    for c in analysis.cells:
        ttft = "–"
        if c.ttft:
            ttft = f"{_ms(c.ttft.median)} [{_ms(c.ttft.p10)}–{_ms(c.ttft.p90)}]"
        shape = "–"
        if c.ttft_modality is not None:
            shape = "**two modes**" if c.ttft_modality.flagged else "one mode"
            if not c.ttft_modality.flagged and c.ttft_modality.reason.startswith("too few"):
                shape = "too few to tell"
        decode = "–"
        if c.decode:
            ci = c.decode_median_ci
            decode = f"{_num(c.decode.median)}" + (f" [{_num(ci[0])}–{_num(ci[1])}]" if ci else "")
        prefill = "–"
        if c.prefill_tok_s:
            prefill = f"{c.prefill_tok_s.median:.0f}"
        elif c.prefill_note:
            prefill = "n/a¹"
            notes.add(c.prefill_note)
        rows.append(
            [
                markdown_code(c.arm),
                str(c.target_tokens),
                _num(c.prompt_tokens_median, 0),
                f"{c.n_ok}/{c.n_ok + c.n_errors}",
                ttft,
                shape,
                decode,
                _num(c.tokens_per_chunk, 2),
                _num(c.e2e.median if c.e2e else None, 2),
                prefill,
            ]
        )
    lines = _table(
        [
            "arm",
            "target tokens",
            "prompt tokens (server)",
            "ok/sent",
            "TTFT ms median [p10–p90]",
            "TTFT shape",
            "decode tok/s median [95% CI]",
            "tokens/chunk",
            "e2e s",
            "prefill tok/s",
        ],
        rows,
    )
    if notes:
        lines += ["", f"¹ {sorted(notes)[0]}."]
    flagged = [c for c in analysis.cells if c.ttft_modality and c.ttft_modality.flagged]
    if flagged:
        lines += ["", "TTFT distributions with two modes (a median describes neither):", ""]
        for c in flagged:
            b = c.ttft_modality
            assert b is not None
            lines.append(
                f"- {markdown_code(c.arm)} at {c.target_tokens} tokens: {b.weights[0]:.0%} near "
                f"{b.modes[0] * 1000:.1f} ms, {b.weights[1]:.0%} near {b.modes[1] * 1000:.1f} ms "
                f"(BIC gain {b.delta_bic:.0f}, Ashman's D {b.ashman_d:.1f}, n={b.n})"
            )
    return lines


def _acceptance(analysis: Analysis) -> list[str]:
    rows = []
    for a in analysis.acceptance:
        shown = a.per_position_rate[:_MAX_POSITIONS_SHOWN]
        per_pos = ", ".join(f"{r:.2f}" for r in shown) or "–"
        if len(a.per_position_rate) > len(shown):
            per_pos += f", … ({len(a.per_position_rate)} positions)"
        spread = "–"
        if len(a.window_rates) > 1:
            spread = f"{min(a.window_rates):.3f}–{max(a.window_rates):.3f}"
        rows.append(
            [
                markdown_code(a.arm),
                a.status,
                f"{a.windows_ok}/{a.windows_total}",
                _num(a.acceptance_rate, 3),
                spread,
                _num(a.mean_acceptance_length, 2),
                f"{a.accepted:.0f}/{a.draft_tokens:.0f} in {a.drafts:.0f} drafts" if a.drafts else "–",
                per_pos,
                a.detail,
            ]
        )
    return [
        "From the servers' Prometheus counters, differenced over each measured window (warmups "
        "excluded), summed over engines. Acceptance rate = accepted / draft tokens; mean "
        "acceptance length = 1 + accepted / drafts; per position = accepted at position / drafts.",
        "",
        *_table(
            [
                "arm",
                "status",
                "windows used",
                "acceptance rate",
                "per-window range",
                "mean acceptance length",
                "accepted/drafted",
                "per position",
                "detail",
            ],
            rows,
        ),
    ]


def _sweeps(analysis: Analysis, plots: dict[str, Path], out_dir: Path) -> list[str]:
    lines: list[str] = []
    for s in analysis.sweeps:
        lines += [f"### {markdown_code(s.base)} over {markdown_code(s.param)}", ""]
        rows = [
            [
                _value(p.value),
                markdown_code(p.arm),
                _num(p.decode_geomean),
                f"{_num(p.decode_ci[0])}–{_num(p.decode_ci[1])}" if p.decode_ci else "–",
                _num(p.mean_acceptance_length, 2),
                "★" if p.arm == s.best_arm else "",
            ]
            for p in s.points
        ]
        lines += _table(
            [
                markdown_text(s.param),
                "arm",
                "decode tok/s (geometric mean over prompts)",
                "95% CI",
                "mean acceptance length",
                "best",
            ],
            rows,
        )
        if s.best_value is not None:
            lines += ["", f"Best by decode rate: {markdown_code(f'{s.param}={s.best_value}')}."]
            if s.best_note:
                lines[-1] += f" {s.best_note[0].upper()}{s.best_note[1:]}."
        key = sweep_key(s.base)
        if key in plots:
            lines += ["", f"![decode against {markdown_text(s.param)}]({_rel(plots[key], out_dir)})"]
        lines.append("")
    return lines


def _divergence(d: ArmDeterminism) -> str:
    if d.replicates < 2:
        return "–"
    if d.logprobs:
        return "never" if d.first_divergence is None else f"token {d.first_divergence}"
    return "never" if d.first_divergence_char is None else f"character {d.first_divergence_char}"


def _determinism(results: BenchResults, analysis: Analysis) -> list[str]:
    if not analysis.determinism:
        return ["Not run (`[determinism] replicates = 0`)."]
    det = results.config.get("determinism", {})
    rows = []
    for d in analysis.determinism:
        rows.append(
            [
                markdown_code(d.arm),
                f"{d.replicates}" + (f" ({d.errors} failed)" if d.errors else ""),
                str(d.distinct_outputs),
                str(d.positions) if d.logprobs else "–",
                "–" if d.token_stable_share is None else f"{d.token_stable_share:.1%}",
                "–" if d.bitwise_stable_share is None else f"{d.bitwise_stable_share:.1%}",
                _divergence(d),
                "–" if d.kl_within_mean is None else f"{d.kl_within_mean:.3g}",
                d.note,
            ]
        )
    lines = [
        f"The same request ({det.get('prompt_tokens', '?')}-token prompt, "
        f"{det.get('max_tokens', '?')} tokens, temperature 0, top-{det.get('top_logprobs', '?')} "
        "logprobs) sent repeatedly to each arm.",
        "",
        *_table(
            [
                "arm",
                "replicates",
                "distinct outputs",
                "positions compared",
                "token-stable",
                "token+logprob bitwise stable",
                "first divergence",
                "KL within arm (mean)",
                "note",
            ],
            rows,
        ),
    ]
    if analysis.determinism_pairs:
        rows = [
            [
                markdown_code(p.arm),
                "never" if p.first_divergence is None else str(p.first_divergence),
                str(p.positions_compared),
                "–" if p.kl_between_mean is None else f"{p.kl_between_mean:.3g}",
                "–" if p.kl_within_baseline is None else f"{p.kl_within_baseline:.3g}",
                "–" if p.kl_within_arm is None else f"{p.kl_within_arm:.3g}",
                p.reading,
            ]
            for p in analysis.determinism_pairs
        ]
        lines += [
            "",
            f"Against the baseline {markdown_code(analysis.baseline)} (first replicates; KL over positions "
            "whose preceding tokens agree):",
            "",
            *_table(
                [
                    "arm",
                    "first divergence",
                    "positions",
                    "KL between arms",
                    "KL within baseline (max)",
                    "KL within arm (max)",
                    "reading",
                ],
                rows,
            ),
        ]
    return lines


def _named(ids: list[str]) -> str:
    """Scenario ids as code spans, the first _MAX_NAMED of them."""
    shown = ", ".join(markdown_code(s) for s in ids[:_MAX_NAMED])
    return shown + (f" and {len(ids) - _MAX_NAMED} more" if len(ids) > _MAX_NAMED else "")


def _runs_cell(earned: list[int], total: list[int]) -> str:
    """'87, 85 / 88' (one maximum) or '87/88, 85/87'."""
    if len(set(total)) == 1:
        return ", ".join(map(str, earned)) + f" / {total[0]}"
    return ", ".join(f"{e}/{t}" for e, t in zip(earned, total, strict=True))


def _quality_floor(q: QualityAnalysis) -> list[str]:
    lines = [
        "### Noise floor: each arm against its own runs",
        "",
        "An arm's runs send the same scenarios to the same server serving the same bytes at temperature 0; "
        "whatever moves between them is noise, and every comparison below is read against it.",
        "",
    ]
    for a in q.arms:
        lines.append(f"- {a.words}." + (f" Flipping: {_named(a.flips)}." if a.flips else ""))
    return lines


def _quality_comparisons(q: QualityAnalysis) -> list[str]:
    lines = [
        "### Against the baseline",
        "",
        f"Each arm against {markdown_code(q.baseline)}, scenario by scenario. A scenario is discordant when the two "
        "arms did not pass it in the same share of their runs; the exact two-sided sign test is on those scenarios. "
        f"A difference is shown only when the test rejects at alpha {q.alpha:g} and a run of each arm disagrees "
        "with a run of the baseline on more scenarios, on average, than two runs of the noisier arm disagree "
        "with each other.",
        "",
    ]
    rows = []
    for c in q.comparisons:
        verdict = f"**{c.verdict}**" if c.verdict == QUALITY_SHOWN else c.verdict
        lines.append(f"- {verdict}: {c.words}.")
        if c.discordant:
            lines.append(
                f"  Better in {markdown_code(c.arm)}: {_named(c.arm_better) or 'none'}; better in "
                f"{markdown_code(c.baseline)}: "
                f"{_named(c.baseline_better) or 'none'}."
            )
        per_run = "; ".join(
            f"run {r.run + 1}: {r.arm_only}↑ {r.baseline_only}↓" + ("" if r.p is None else f", p={r.p:.3g}")
            for r in c.per_run
        )
        rows.append(
            [
                markdown_code(c.arm),
                str(c.scenarios),
                f"{len(c.arm_better)}↑ {len(c.baseline_better)}↓",
                str(len(c.also_flip)),
                "–" if c.between is None else f"{c.between:.3g}",
                "–" if c.floor is None else f"{c.floor:.3g} ({markdown_code(c.floor_arm or '')})",
                "–" if c.p is None else f"{c.p:.3g}",
                per_run or "–",
                verdict,
            ]
        )
    lines += [
        "",
        *_table(
            [
                "arm",
                "scenarios paired",
                "discordant (↑ arm passed more)",
                "of them flip within an arm",
                "disagree per pair of runs, between arms",
                "disagree per pair of runs, noisier arm",
                "sign test p",
                "per run index (McNemar)",
                "verdict",
            ],
            rows,
        ),
    ]
    return lines


def _quality_categories(q: QualityAnalysis) -> list[str]:
    arms: list[ArmQuality] = q.arms
    rows = [["**all scenarios**", *(_runs_cell(a.earned, a.total) + (" ‡" if a.flips else "") for a in arms)]]
    for name in q.categories:
        cells = []
        for a in arms:
            found = [c for c in a.categories if c.category == name]
            cells.append(
                "–" if not found else _runs_cell(found[0].earned, found[0].total) + (" ‡" if name in a.moved else "")
            )
        rows.append([markdown_text(name), *cells])
    return [
        "### Per category",
        "",
        "Passed per run / maximum, runs in order; ‡: the count moved between the arm's own runs.",
        "",
        *_table(["category", *(markdown_code(a.arm) for a in arms)], rows),
    ]


def _quality_scenarios(q: QualityAnalysis) -> list[str]:
    arms = [a.arm for a in q.arms]
    varying = [s for s in q.scenarios if len({p for a in arms for p in s.passed.get(a, [])}) > 1]
    if not varying:
        return ["Every scenario had the same outcome in every run of every arm."]
    rows = [
        [markdown_code(s.scenario), markdown_text(s.category)]
        + ["".join("–" if p is None else ("✓" if p else "✗") for p in s.passed.get(a, [])) or "–" for a in arms]
        for s in varying[:_MAX_SCENARIO_ROWS]
    ]
    more = len(varying) - len(rows)
    return [
        f"<details><summary>Scenarios whose outcome is not the same in every run of every arm ({len(varying)} of "
        f"{len(q.scenarios)})</summary>",
        "",
        *_table(["scenario", "category", *(markdown_code(a) for a in arms)], rows),
        "",
        ("" if not more else f"{more} more not shown; ")
        + "✓ passed, ✗ not passed, – not run; every scenario of every run is in results.json "
        "(`analysis.quality.scenarios`).",
        "",
        "</details>",
    ]


def _quality(analysis: Analysis, plots: dict[str, Path], out_dir: Path) -> list[str]:
    q = analysis.quality
    if q is None:
        return ["Not run (no `[quality]` table in the arms file)."]
    suites = ", ".join(dict.fromkeys(markdown_code(a.suite) for a in q.arms))
    counts = {len(a.runs) for a in q.arms}
    if len(counts) == 1:
        runs = f"{counts.pop()} run(s) per arm"
    else:
        runs = ", ".join(f"{markdown_code(a.arm)} {len(a.runs)} run(s)" for a in q.arms)
    lines = [
        f"Suite {suites}; {runs} at temperature 0, after the measured requests of the same serve visits. "
        "A failed request counts as not passed.",
        "",
        *_quality_floor(q),
        "",
    ]
    if q.comparisons:
        lines += [*_quality_comparisons(q), ""]
    lines += [*_quality_categories(q), ""]
    if "quality" in plots:
        lines += [f"![scenarios passed per run, per arm and category]({_rel(plots['quality'], out_dir)})", ""]
    lines += _quality_scenarios(q)
    return lines


def _logcheck(results: BenchResults) -> list[str]:
    lines = []
    for arm in results.arms:
        if not arm.log_paths and not arm.evidence:
            lines += ["", f"{markdown_code(arm.name)}: no server log (a `url` arm; the server was not started here)"]
            continue
        if not arm.evidence:
            lines += ["", f"{markdown_code(arm.name)}: none of the patterns below matched."]
            continue
        lines += ["", f"{markdown_code(arm.name)}:", ""]
        lines += _table(
            ["pattern", "severity", "lines", "value", "first line"],
            [[e.pattern, e.severity, str(e.count), e.value or "", markdown_code(e.first_line)] for e in arm.evidence],
        )
    lines += ["", "<details><summary>Patterns checked</summary>", ""]
    lines += _table(
        ["pattern", "looks in", "severity", "meaning"],
        [[p.id, p.source, p.severity, p.meaning] for p in logcheck.PATTERNS],
    )
    lines += ["", "</details>"]
    return lines


def _setup(results: BenchResults) -> list[str]:
    w = results.config.get("workload", {})
    lines = [
        f"- weightsmith {results.weightsmith_version}, {results.created}; client host: "
        + ", ".join(f"{k} {v}" for k, v in results.host.items()),
        f"- workload: code-continuation prompts cut from Python's standard library at "
        f"{w.get('prompt_tokens')} target tokens, {w.get('prompts_per_length')} per length, "
        f"unique first line per request; {markdown_code(str(w.get('endpoint')))} endpoint, "
        f"max_tokens {w.get('max_tokens')}, temperature {w.get('temperature')}, "
        f"ignore_eos {w.get('ignore_eos')}, concurrency {w.get('concurrency')}",
        f"- prompts sized at {results.chars_per_token:.2f} characters per token "
        f"({results.chars_per_token_source}); token counts in the tables are the servers' `usage`",
        f"- {results.config.get('repeats')} repeat(s) per arm in counterbalanced order, "
        f"{results.config.get('warmups')} warmup request(s) per visit discarded; alpha {results.alpha}",
        "",
    ]
    rows = []
    for a in results.arms:
        what = markdown_code(shell_line(a.command, PLACEHOLDERS)) if a.command else (a.url or "")
        env = ", ".join(markdown_code(env_line({k: v})) for k, v in a.env.items())
        model = served_model(a)
        rows.append([markdown_code(a.name), a.kind, model or "–", what + (f" (env: {env})" if env else ""), a.status])
    lines += _table(["arm", "kind", "model", "server", "status"], rows)
    lines += ["", "Visits in the order they ran:", ""]
    vrows = []
    for v in results.visits:
        ok = sum(1 for r in v.requests if r.ok)
        vrows.append(
            [
                str(v.position + 1),
                markdown_code(v.arm),
                str(v.repeat + 1),
                v.status + (f": {v.failure}" if v.failure else ""),
                _num(v.startup_s, 1),
                f"{ok}/{len(v.requests)}",
                v.spec.status if v.spec else "–",
            ]
        )
    lines += _table(["#", "arm", "repeat", "status", "startup s", "requests ok", "/metrics window"], vrows)
    return lines


def _noise(analysis: Analysis) -> list[str]:
    rows: list[list[str]] = []
    for key, floor in analysis.noise.items():
        per_arm = ", ".join(f"{markdown_code(a)} {v:.1%}" for a, v in floor.per_arm.items()) or "–"
        where = markdown_code(floor.arm) if floor.arm is not None else floor.detail
        rows.append([_METRIC[key].label, "–" if floor.value is None else f"±{floor.value:.1%}", per_arm, where])
    return [
        "For each arm, the largest gap between two of its own repeats (same estimator as the "
        "verdicts). A comparison uses the larger of its two arms' gaps.",
        "",
        *_table(["metric", "largest", "per arm", "largest in"], rows),
    ]


def render_markdown(results: BenchResults, analysis: Analysis, plots: dict[str, Path], out_dir: Path) -> str:
    """The whole report as Markdown, with plot links relative to `out_dir`."""
    names = ", ".join(markdown_code(a.name) for a in results.arms)
    lines = [f"# Serving benchmark: {names}", ""]
    problems = _problems(results, analysis)
    if problems:
        lines += ["## Read first", "", *problems, ""]
    lines += ["## Verdicts", "", *_verdicts(analysis), ""]
    lines += ["## Per arm and prompt length", "", *_cells(analysis), ""]
    if "ttft" in plots:
        lines += [f"![TTFT distributions]({_rel(plots['ttft'], out_dir)})", ""]
    if "decode" in plots:
        lines += [f"![decode rate]({_rel(plots['decode'], out_dir)})", ""]
    lines += ["## Speculative decoding acceptance", "", *_acceptance(analysis), ""]
    drafts = _draft_verdicts(analysis)
    if drafts:
        lines += ["### Drafts compared", "", *drafts, ""]
    if "acceptance" in plots:
        lines += [f"![acceptance per position]({_rel(plots['acceptance'], out_dir)})", ""]
    if analysis.sweeps:
        lines += ["## Sweeps", "", *_sweeps(analysis, plots, out_dir)]
    lines += ["## Determinism", "", *_determinism(results, analysis), ""]
    lines += ["## Quality", "", *_quality(analysis, plots, out_dir), ""]
    lines += ["## Server log check", "", *_logcheck(results), ""]
    lines += ["## Noise floor", "", *_noise(analysis), ""]
    lines += ["## Setup", "", *_setup(results), ""]
    return text_file(lines)  # arm names, server messages and logs are a stranger's text, read with `cat` too


RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"


def write_results_file(results: BenchResults, analysis: Analysis | None, out_dir: Path) -> Path:
    """results.json: the raw record plus (for convenience, never read back) the analysis."""
    payload = to_jsonable(results)
    if analysis is not None:
        payload["analysis"] = to_jsonable(analysis)
    path = out_dir / RESULTS_FILE
    write_json(path, payload)
    return path


def write_all(results: BenchResults, out_dir: Path, *, with_results: bool = True) -> tuple[Analysis, dict[str, Path]]:
    """Analyse, then write results.json (unless not `with_results`: `report` never rewrites its input),
    the plots and report.md into `out_dir`: an empty folder or one bench claimed (`outdir.claim`)."""
    claim(out_dir)
    analysis = analyse(results)
    files = {"results": write_results_file(results, analysis, out_dir)} if with_results else {}
    plots = write_plots(results, analysis, out_dir)
    report = write_owned(out_dir, REPORT_FILE, render_markdown(results, analysis, plots, out_dir).encode("utf-8"))
    files["report"] = report
    files.update(plots)
    return analysis, files
