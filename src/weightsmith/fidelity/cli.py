"""`weightsmith eval ORIG QUANT`: weight error streamed from disk, then logits where the model runs.

Exit status: 0 when measured (logits may be unavailable on this machine, which the output says),
1 when QUANT fails to load in transformers, 2 for bad input (one line from `cli.main`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from weightsmith.core.terminal import markup_safe
from weightsmith.fidelity import logits as logits_mod
from weightsmith.io.texts import MAX_TOKENS, TEXT_HELP, tokens_option

if TYPE_CHECKING:
    from weightsmith.fidelity.weights import WeightReport

err_console = Console(stderr=True, highlight=False)


#: The most per-layer rows `--layers` may ask for (more than any model's layers).
MAX_LAYERS = 100_000


def _weights_with_progress(orig: Path, quant: Path) -> WeightReport:
    """The weight pass with a byte progress bar on stderr."""
    from weightsmith.fidelity.weights import weight_error

    columns = (TextColumn("weight error"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("weights", total=None)
        return weight_error(
            orig,
            quant,
            progress=lambda n: bar.advance(task, n),
            on_start=lambda total: bar.update(task, total=total),
        )


def eval_command(
    orig: Annotated[Path, typer.Argument(help="The original checkpoint folder (BF16, FP16, FP32 or FP8).")],
    quant: Annotated[Path, typer.Argument(help="The quantized compressed-tensors checkpoint folder.")],
    text: Annotated[
        Path | None,
        typer.Option(
            "--text",
            help=f"UTF-8 text the models read ({TEXT_HELP}; default: Python's json/encoder.py source, "
            "which no built-in calibration text holds).",
        ),
    ] = None,
    tokens: Annotated[
        int,
        typer.Option(
            "--tokens", parser=tokens_option(least=2), help=f"Tokens of the text used, at most (2 to {MAX_TOKENS:,})."
        ),
    ] = logits_mod.DEFAULT_TOKENS,
    layers: Annotated[
        int,
        typer.Option("--layers", min=0, max=MAX_LAYERS, help="Per-layer rows in the table, worst first (0: all)."),
    ] = 20,
    no_logits: Annotated[
        bool, typer.Option("--no-logits", help="Weight error only; do not run the models in transformers.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results object as JSON.")] = False,
    stream: Annotated[
        bool,
        typer.Option("--stream", help="Run both models one decoder layer at a time (for models larger than memory)."),
    ] = False,
    trust_remote_code: Annotated[
        bool,
        typer.Option("--trust-remote-code", help="Let transformers run the checkpoints' own code (on this machine)."),
    ] = False,
) -> None:
    """How much quantization costs: weight error per layer and category, then KL, top-1 and perplexity."""
    # imported here: `eval --help` starts without the evaluation's modules
    from weightsmith.fidelity import calibrated_on
    from weightsmith.fidelity.evaluate import evaluate
    from weightsmith.fidelity.report import print_report, to_json
    from weightsmith.fidelity.weights import weight_error

    report = evaluate(
        orig,
        quant,
        text=text,
        tokens=tokens,
        logits=not no_logits,
        stream=stream,
        trust_remote_code=trust_remote_code,
        weigh=_weights_with_progress if not as_json and err_console.is_terminal else weight_error,
    )
    if as_json:
        print(to_json(report))
    else:
        print_report(report, layers)
    if report.weights_caveat:
        err_console.print(f"[yellow]note:[/] {markup_safe(report.weights_caveat)}", soft_wrap=True)
    for found in report.calibration_overlap or []:
        if found.status == calibrated_on.OVERLAP:
            err_console.print(f"[yellow]warning:[/] {markup_safe(calibrated_on.warning(found))}", soft_wrap=True)
    if report.logits.status == logits_mod.FAILED:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `eval` to the project's command line."""
    app.command("eval")(eval_command)
