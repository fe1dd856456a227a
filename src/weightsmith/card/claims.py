"""What we can and cannot claim: the noise floor first, then each verdict in words that cannot be misquoted.

Task scores from the benchmark's quality suite follow the same order: what moved between an arm's own
runs first, then each comparison, "no ordering shown" unless `bench/quality/verdict.py` showed one.

A comparison inside the noise floor, or one whose interval includes no change, is written as "no
ordering shown" and never as better or worse; a difference that survived every test is written as
what was measured (faster, slower, sooner) against the named baseline, on this workload and host.
Fidelity caveats say what the eval did not measure: task accuracy, and outputs when no teacher ran.
"""

from __future__ import annotations

from typing import Any

from weightsmith.bench.analysis import METRICS
from weightsmith.bench.quality import verdict as qv
from weightsmith.bench.stats import NOT_SHOWN, SHOWN, PairedComparison
from weightsmith.card.cite import Citations
from weightsmith.card.sources import BENCH_FILE, EVAL_FILE, CardSources
from weightsmith.core.terminal import markdown_code

B, E = BENCH_FILE, EVAL_FILE
_LABEL = {m.key: m.label for m in METRICS}
#: What a shown difference means, by metric and sign of the effect (arm against baseline).
_SHOWN_WORDS = {
    "decode_tok_s": ("decoded faster than", "decoded slower than"),
    "ttft_s": ("took longer to the first token than", "reached the first token sooner than"),
    "e2e_s": ("took longer end to end than", "finished sooner end to end than"),
}


def claims(src: CardSources, c: Citations) -> list[str]:
    """Speed claims (noise floor first) when a benchmark was given, task scores when it ran a quality suite,
    then fidelity claims."""
    scores = _quality(src, c)
    return [*_speed(src, c), "", *scores, *([""] if scores else []), *_fidelity(src, c)]


def _speed(src: CardSources, c: Citations) -> list[str]:
    an = src.analysis
    if src.bench is None or an is None:
        return ["- **Speed**: no serving benchmark was given, so this card claims nothing about speed."]
    floors = []
    for key, floor in an.noise.items():
        shown = None if floor.value is None else c.num(format(floor.value, ".1%"), B, f"analysis.noise[{key}]")
        floors.append(f"{_LABEL[key]} " + ("not measured" if shown is None else f"±{shown}"))
    lines = [
        f"**Noise floor first.** The same arm, measured again in another repeat, moved by up to {', '.join(floors)}. "
        "A difference no larger than its metric's noise floor is not shown by this run, whatever its interval says.",
        "",
    ]
    lines += [_verdict(cmp, c) for cmp in an.comparisons]
    for s in an.sweeps:
        if s.best_note:
            lines.append(
                f"- {markdown_code(s.param)} for {markdown_code(s.base)}: {s.best_note}; "
                "**no ordering shown** between those values, and the "
                "highest median is not a settled best."
            )
    lines.append(
        "- Every figure describes the model files the arms served, on the client host and workload recorded under "
        "Serving benchmark (code continuation, greedy decoding, the listed concurrency); it does not carry over to "
        "other hardware, batch sizes or prompts."
    )
    return lines


def _verdict(cmp: PairedComparison, c: Citations) -> str:
    f = f"analysis.comparisons[{cmp.arm},{cmp.metric}]"
    head = f"- {markdown_code(cmp.arm)} against {markdown_code(cmp.baseline)}, {_LABEL[cmp.metric]}:"
    if cmp.verdict == SHOWN and cmp.effect is not None:
        effect = c.num(format(cmp.effect, "+.1%"), B, f + ".effect")
        faster, slower = _SHOWN_WORDS.get(cmp.metric, ("measured higher than", "measured lower than"))
        words = faster if cmp.effect > 0 else slower
        return f"{head} {effect}, a difference shown: it {words} the baseline, beyond the noise floor."
    if cmp.verdict == NOT_SHOWN:
        effect = "" if cmp.effect is None else f" (effect {c.num(format(cmp.effect, '+.1%'), B, f + '.effect')})"
        why = f": {c.text(cmp.reason, B, f + '.reason')}" if cmp.reason else ""
        return f"{head} **no ordering shown**{effect}{why}. This run does not rank them."
    return f"{head} not compared ({c.text(cmp.reason or cmp.verdict, B, f + '.reason')})."


def _scores(c: Citations, a: qv.ArmQuality, field: str) -> str:
    """Each run's earned count of its maximum, cited: '87 and 85 of 88', or '87 of 88 and 85 of 87'."""
    earned = [c.num(str(e), B, f"{field}.earned[{i}]") for i, e in enumerate(a.earned)]
    total = [c.num(str(t), B, f"{field}.total[{i}]") for i, t in enumerate(a.total)]
    if len(set(a.total)) == 1:
        return " and ".join([", ".join(earned[:-1]), earned[-1]] if len(earned) > 1 else earned) + f" of {total[0]}"
    each = [f"{e} of {t}" for e, t in zip(earned, total, strict=True)]
    return ", ".join(each[:-1]) + " and " + each[-1]


def _quality(src: CardSources, c: Citations) -> list[str]:
    """Task scores: each arm's own run-to-run flips first, then each arm against the baseline."""
    an = src.analysis
    if src.bench is None or an is None:
        return []
    q = an.quality
    if q is None:
        return ["- **Task scores**: the benchmark ran no quality suite, so this card claims nothing about task scores."]
    lines = [
        "**Task scores, noise floor first.** Each arm ran the same scenarios more than once against the same "
        "server; a scenario that passes in one run and fails in another of the same arm is noise, and a difference "
        "between arms is claimed only beyond it.",
        "",
    ]
    for a in q.arms:
        f = f"analysis.quality.arms[{a.arm}]"
        head = f"- {markdown_code(a.arm)} on {c.text(a.suite, B, f + '.suite')}: passed {_scores(c, a, f)} scenarios"
        if a.floor_measured:
            lines.append(
                f"{head} in its {c.num(str(len(a.runs)), B, f + '.runs')} runs; "
                f"{c.num(str(len(a.flips)), B, f + '.flips')} scenarios flip between its own runs, and "
                f"{c.num(str(len(a.moved)), B, f + '.moved')} of {c.num(str(len(a.categories)), B, f + '.categories')}"
                " categories moved."
            )
        else:
            lines.append(f"{head} in its one run; what moves between two of its own runs was not measured.")
    for cmp in q.comparisons:
        f = f"analysis.quality.comparisons[{cmp.arm}]"
        head = f"- {markdown_code(cmp.arm)} against {markdown_code(cmp.baseline)}, task scores:"
        if cmp.verdict == qv.NOT_COMPARED:
            lines.append(f"{head} not compared ({c.text(cmp.reason, B, f + '.reason')}).")
            continue
        p = "no test" if cmp.p is None else "p = " + c.num(format(cmp.p, ".3g"), B, f + ".p")
        figures = f"{c.num(str(cmp.discordant), B, f + '.discordant')} scenarios they did not pass equally often"
        if cmp.floor is not None:  # both arms ran more than once: their own flips are known
            figures += (
                f", {c.num(str(len(cmp.also_flip)), B, f + '.also_flip')} of them also flip between an arm's own runs"
            )
        figures += f"; sign test {p}"
        if cmp.verdict == qv.SHOWN:
            lines.append(
                f"{head} {figures}: a difference shown, {markdown_code(cmp.better or '')} passed more scenarios of "
                "this suite, beyond what either arm's own runs moved."
            )
        else:
            lines.append(
                f"{head} **no ordering shown** ({figures}; {c.text(cmp.reason, B, f + '.reason')}). "
                "This run does not rank them on this suite."
            )
    return lines


def _fidelity(src: CardSources, c: Citations) -> list[str]:
    ev = src.eval
    if ev is None:
        return ["- **Fidelity**: no `weightsmith eval` was given, so this card claims nothing about how close the "
                "quantized model is to its original."]  # fmt: skip
    lines = [
        "- **Fidelity**: the weight error is the distance from the original weights, not accuracy on any task; "
        "a task score needs its own evaluation."
    ]
    lines.append(_rounded(ev, c))
    lg = ev["logits"]
    if lg["status"] == "ok":
        lines.append(
            f"- KL, top-1 agreement and perplexity come from {c.num(str(lg['tokens']), E, 'logits.tokens')} tokens of "
            f"one text ({c.text(lg['text_source'], E, 'logits.text_source')}): they compare the two models on that "
            "text only."
        )
    else:
        lines.append(
            f"- **No teacher could be run**: the original and quantized models were not run side by side "
            f"({c.text(lg['status'], E, 'logits.status')}), so nothing here says how their outputs differ."
        )
    return lines


#: Share of sampled blocks on a 4-bit grid from which the card says the original was already rounded
#: (trained 16- or 32-bit weights give about none; weights dequantized from a Q4 format give all).
ROUNDED_SHARE = 0.9


def _rounded(ev: dict[str, Any], c: Citations) -> str:
    """Whether the original the error is measured against was itself already rounded to 4 bits."""
    grid = ev["weights"].get("original_grid")
    if not grid or not grid["blocks"]:
        return (
            "- Whether the original was itself already rounded (a checkpoint dequantized from a 4-bit format) was "
            f"not measured: {E} predates that check."
        )
    on = c.num(f"{grid['on_4bit_grid']:,}", E, "weights.original_grid.on_4bit_grid")
    blocks = c.num(f"{grid['blocks']:,}", E, "weights.original_grid.blocks")
    if grid["on_4bit_grid"] >= ROUNDED_SHARE * grid["blocks"]:
        return (
            f"- **The original was already rounded**: {on} of {blocks} sampled blocks of 32 of its quantized weights "
            "hold at most 16 distinct values, as weights dequantized from a 4-bit format do. Every error above is "
            "measured against those rounded weights, not the trained ones."
        )
    return (
        f"- The original looks unrounded: {on} of {blocks} sampled blocks of 32 of its quantized weights hold at most "
        "16 distinct values (a weight dequantized from a 4-bit format would fill every block)."
    )
