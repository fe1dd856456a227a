"""What we can and cannot claim: the noise floor first, then each verdict in words that cannot be misquoted.

A comparison inside the noise floor, or one whose interval includes no change, is written as "no
ordering shown" and never as better or worse; a difference that survived every test is written as
what was measured (faster, slower, sooner) against the named baseline, on this workload and host.
Fidelity caveats say what the eval did not measure: task accuracy, and outputs when no teacher ran.
"""

from __future__ import annotations

from typing import Any

from weightsmith.bench.analysis import METRICS
from weightsmith.bench.stats import NOT_SHOWN, SHOWN, PairedComparison
from weightsmith.card.cite import Citations
from weightsmith.card.sources import BENCH_FILE, EVAL_FILE, CardSources

B, E = BENCH_FILE, EVAL_FILE
_LABEL = {m.key: m.label for m in METRICS}
#: What a shown difference means, by metric and sign of the effect (arm against baseline).
_SHOWN_WORDS = {
    "decode_tok_s": ("decoded faster than", "decoded slower than"),
    "ttft_s": ("took longer to the first token than", "reached the first token sooner than"),
    "e2e_s": ("took longer end to end than", "finished sooner end to end than"),
}


def claims(src: CardSources, c: Citations) -> list[str]:
    """Speed claims (noise floor first) when a benchmark was given, then fidelity claims."""
    return [*_speed(src, c), "", *_fidelity(src, c)]


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
                f"- `{s.param}` for `{s.base}`: {s.best_note}; **no ordering shown** between those values, and the "
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
    head = f"- `{cmp.arm}` against `{cmp.baseline}`, {_LABEL[cmp.metric]}:"
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
