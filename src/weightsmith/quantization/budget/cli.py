"""`weightsmith sensitivity`: what each candidate scheme costs each module, measured, with the plan a budget buys."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from weightsmith.core.terminal import markup_safe
from weightsmith.io.texts import MAX_TOKENS, TEXT_HELP, tokens_option
from weightsmith.quantization.budget.candidates import CPU_SERVED, FAMILIES
from weightsmith.quantization.budget.choose import budget_line, groups_of, spend
from weightsmith.quantization.budget.plan import MAX_BITS, MIN_BITS, BudgetOptions, check_options, table_for
from weightsmith.quantization.budget.report import write_report
from weightsmith.quantization.budget.sensitivity import MEASURES
from weightsmith.quantization.request import GPTQ_SEQ_LEN, GPTQ_TOKENS, GptqOptions, QuantizeRequest

console = Console()
err = Console(stderr=True)


def sensitivity(
    src: str = typer.Argument(..., help="Checkpoint folder, or a Hub id org/name[@revision] from the local Hub cache."),
    out: Path = typer.Option(
        ..., "--out", help="Report folder: sensitivity.json/.md/.png, and plan.toml with --avg-bits."
    ),
    avg_bits: float | None = typer.Option(
        None, "--avg-bits", min=MIN_BITS, max=MAX_BITS, help="Also choose the plan this many bits per weight buy."
    ),
    family: str = typer.Option("int4", "--family", help=f"Candidates: {', '.join(FAMILIES)}."),
    candidates: str | None = typer.Option(
        None,
        "--candidates",
        help=f"Only these of the family's, comma-separated (vLLM CPU serves {','.join(CPU_SERVED)}).",
    ),
    measure: str = typer.Option(
        "fisher", "--measure", help=f"What the plan and the heat map show: {', '.join(MEASURES)}."
    ),
    text: Path | None = typer.Option(None, "--text", help=f"UTF-8 calibration text ({TEXT_HELP})."),
    builtin: str | None = typer.Option(
        None, "--builtin", help="Built-in calibration text, code or prose (default code)."
    ),
    tokens: int = typer.Option(
        GPTQ_TOKENS, "--tokens", parser=tokens_option(), help=f"Calibration tokens (at most {MAX_TOKENS:,})."
    ),
    seq_len: int = typer.Option(GPTQ_SEQ_LEN, "--seq-len", min=1, max=MAX_TOKENS, help="Tokens per sequence."),
    ignore: list[str] = typer.Option(
        [], "--ignore", help="Module kept out of the budget (exact or re:REGEX). Repeatable."
    ),
    workers: int = typer.Option(0, min=0, max=256, help="Worker threads (0: one per core)."),
    force: bool = typer.Option(False, help="Replace an existing report folder."),
    json_out: bool = typer.Option(False, "--json", help="The plan (with --avg-bits) as JSON on stdout."),
) -> None:
    """Measure what each candidate scheme costs each Linear (data-free and on calibration text) and write a report."""
    only = None if candidates is None else tuple(c.strip() for c in candidates.split(",") if c.strip())
    opts = BudgetOptions(family, only, measure)
    cands = check_options(avg_bits if avg_bits is not None else MIN_BITS, opts)
    request = QuantizeRequest(
        src, None, ignore=tuple(ignore), gptq=GptqOptions(text=text, builtin=builtin, tokens=tokens, seq_len=seq_len),
        workers=workers or None,
    )  # fmt: skip
    measures = ("weight",) if measure == "weight" else MEASURES
    table = table_for(request, opts, cands, measures=measures, say=lambda line: err.print(markup_safe(line)))
    choice = None
    if avg_bits is not None:
        choice = spend(groups_of(table, measure, cands), avg_bits, measure)
    written = write_report(out, table, cands, measure, choice, tuple(ignore), force)
    if json_out:
        print(json.dumps({"report": [str(p) for p in written], "plan": choice.to_json() if choice else None}, indent=2))
        return
    for path in written:
        console.print(f"wrote {markup_safe(path)}")
    if choice is not None:
        console.print(markup_safe(budget_line(choice)))
        console.print(
            f"quantize with: weightsmith quantize {markup_safe(src)} OUT --recipe {markup_safe(out / 'plan.toml')}"
        )


def register(app: typer.Typer) -> None:
    app.command()(sensitivity)
