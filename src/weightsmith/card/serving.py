"""The card's serving section, recomputed from the raw `weightsmith bench` results.

The analysis is rebuilt from the samples (as `bench report` does), never read from the file, so the
card and `card --check` derive the same numbers the bench report shows.
"""

from __future__ import annotations

from weightsmith.bench.analysis import METRICS
from weightsmith.bench.paths import PLACEHOLDERS, served_model
from weightsmith.bench.stats import NoiseFloor
from weightsmith.card.cite import Citations
from weightsmith.card.measured import table
from weightsmith.card.sources import BENCH_FILE, CardSources
from weightsmith.core.terminal import env_line, markdown_code, markdown_text, shell_line

B = BENCH_FILE
_LABEL = {m.key: m.label for m in METRICS}


def _n(c: Citations, value: float | None, spec: str, field: str) -> str:
    return "not measured" if value is None else c.num(format(value, spec), B, field)


def serving(src: CardSources, c: Citations) -> list[str]:
    """Noise floor, serve commands, the per-cell table with intervals, verdicts, acceptance, best k, environment."""
    res, an = src.bench, src.analysis
    assert res is not None and an is not None
    lines = [
        f"`weightsmith bench` (`{B}`, analysis recomputed from its samples). These numbers describe each arm's "
        "server serving the model file named below, which is not necessarily the safetensors in this folder. "
        "In the commands, `$MODEL` and `$DRAFT` stand for the model and draft files named beside them.",
        "",
    ]
    for key, floor in an.noise.items():  # the noise floor first: every difference below is read against it
        value = (
            "not measured" if floor.value is None else c.num(format(floor.value, ".1%"), B, f"analysis.noise[{key}]")
        )
        lines.append(f"- noise floor, {_LABEL[key]}: ±{value} ({_largest_in(floor)})")
    lines.append("")
    for arm in res.arms:
        files = ", ".join(f"{markdown_code('$' + k)} = {markdown_code(v)}" for k, v in arm.files.items())
        model = markdown_code(served_model(arm) or "not recorded")
        files = f"; {files}" if files else ""
        lines.append(
            f"- {markdown_code(arm.name)} ({markdown_text(arm.kind)}, model {model}{files}, "
            f"status {markdown_text(arm.status)}):"
        )
        if arm.command:
            lines.append(f"  {c.text(shell_line(arm.command, PLACEHOLDERS), B, f'arms[{arm.name}].command')}")
        elif arm.url:
            lines.append(f"  already running at {c.text(arm.url, B, f'arms[{arm.name}].url')}")
        if arm.env:
            lines.append(f"  environment {c.text(env_line(arm.env), B, f'arms[{arm.name}].env')}")
    lines += ["", *_cells(src, c), ""]
    if an.comparisons:
        lines += [*_verdicts(src, c), ""]
    lines += [*_acceptance(src, c), ""]
    for s in an.sweeps:
        if s.best_value is not None:
            best = c.text(str(s.best_value), B, f"analysis.sweeps[{s.base},{s.param}].best_value")
            note = f" ({s.best_note})" if s.best_note else ""
            lines.append(
                f"Best {markdown_code(s.param)} for {markdown_code(s.base)} by median decode rate: {best}{note}."
            )
    host = ", ".join(f"{k} {v}" for k, v in res.host.items())
    lines += [
        "",
        f"Measured {c.text(res.created, B, 'created')} with weightsmith "
        f"{c.text(res.weightsmith_version, B, 'weightsmith_version')}; client host {c.text(host, B, 'host')}; "
        f"{c.num(str(res.config.get('repeats')), B, 'config.repeats')} repeat(s) per arm in counterbalanced order.",
    ]
    return lines


def _largest_in(floor: NoiseFloor) -> str:
    """Where a noise floor comes from: the arm whose repeats moved most, quoted, or why there is none."""
    return markdown_code(floor.arm) if floor.arm is not None else markdown_text(floor.detail)


def _cells(src: CardSources, c: Citations) -> list[str]:
    an = src.analysis
    assert an is not None
    rows = []
    for cell in an.cells:
        f = f"analysis.cells[{cell.arm},{cell.target_tokens}]"
        ci = cell.decode_median_ci
        decode = _n(c, cell.decode.median if cell.decode else None, ".1f", f + ".decode.median")
        if ci:
            low = _n(c, ci[0], ".1f", f + ".decode_median_ci[0]")
            decode += f" [{low}–{_n(c, ci[1], '.1f', f + '.decode_median_ci[1]')}]"
        t = cell.ttft
        ttft = "not measured"
        if t:
            ttft = (
                f"{_n(c, t.median * 1000, '.1f', f + '.ttft.median')} "
                f"[{_n(c, t.p10 * 1000, '.1f', f + '.ttft.p10')}–{_n(c, t.p90 * 1000, '.1f', f + '.ttft.p90')}]"
            )
        rows.append(
            [
                markdown_code(cell.arm, cell=True),
                c.num(str(cell.target_tokens), B, f + ".target_tokens"),
                f"{c.num(str(cell.n_ok), B, f + '.n_ok')}/{c.num(str(cell.n_ok + cell.n_errors), B, f + '.sent')}",
                ttft,
                decode,
                _n(c, cell.e2e.median if cell.e2e else None, ".2f", f + ".e2e.median"),
            ]
        )
    header = ["arm", "prompt tokens", "ok/sent", "TTFT ms median [p10–p90]", "decode tok/s median [95% CI]", "e2e s"]
    return table(header, rows)


def _verdicts(src: CardSources, c: Citations) -> list[str]:
    an = src.analysis
    assert an is not None
    rows = []
    for cmp in an.comparisons:
        f = f"analysis.comparisons[{cmp.arm},{cmp.metric}]"
        ci = "not measured"
        if cmp.ci_low is not None and cmp.ci_high is not None:
            ci = f"{_n(c, cmp.ci_low, '+.1%', f + '.ci_low')} … {_n(c, cmp.ci_high, '+.1%', f + '.ci_high')}"
        rows.append(
            [
                markdown_code(cmp.arm, cell=True),
                _LABEL[cmp.metric],
                c.num(str(cmp.n_pairs), B, f + ".n_pairs"),
                _n(c, cmp.effect, "+.1%", f + ".effect"),
                ci,
                "not measured" if cmp.noise_floor is None else "±" + _n(c, cmp.noise_floor, ".1%", f + ".noise_floor"),
                c.text(cmp.verdict, B, f + ".verdict", cell=True),
            ]
        )
    head = (
        f"Against the baseline {markdown_code(an.baseline)} on matched prompts "
        "(effect: geometric mean of per-prompt ratios):"
    )
    return [head, "", *table(["arm", "metric", "pairs", "effect", "95% CI", "noise floor", "verdict"], rows)]


def _acceptance(src: CardSources, c: Citations) -> list[str]:
    an = src.analysis
    assert an is not None
    rows = []
    for a in an.acceptance:
        f = f"analysis.acceptance[{a.arm}]"
        rows.append(
            [
                markdown_code(a.arm, cell=True),
                c.text(a.status, B, f + ".status", cell=True),
                c.num(str(a.windows_ok), B, f + ".windows_ok")
                + "/"
                + c.num(str(a.windows_total), B, f + ".windows_total"),
                _n(c, a.acceptance_rate, ".3f", f + ".acceptance_rate"),
                _n(c, a.mean_acceptance_length, ".2f", f + ".mean_acceptance_length"),
            ]
        )
    head = "Speculative-decoding acceptance from the servers' counters over the measured windows:"
    header = ["arm", "status", "windows used", "acceptance rate", "mean acceptance length"]
    return [head, "", *table(header, rows)]
