"""The `weightsmith` command line: one typer app, one sub-command per job.

Every command reports input problems as one line on stderr and a non-zero exit status; `--json`
prints machine-readable results on stdout instead of tables.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from weightsmith import __version__
from weightsmith.audit.commands import register as register_audit
from weightsmith.bench.cli import bench_app
from weightsmith.card.cli import register as register_card
from weightsmith.cli_quantize import demo, quantize
from weightsmith.errors import WeightsmithError
from weightsmith.fidelity.cli import register as register_eval

app = typer.Typer(
    name="weightsmith",
    help="Serving-ready LLM checkpoints from raw safetensors, and the evidence for them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True, highlight=False)


def _version_callback(value: bool) -> None:
    if value:
        print(f"weightsmith {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """Serving-ready LLM checkpoints from raw safetensors, and the evidence for them."""


# Sub-commands: each job lives in its own module.
app.command()(quantize)
app.command()(demo)
register_audit(app)
app.add_typer(bench_app, name="bench")
register_eval(app)
register_card(app)


def main() -> None:
    """Entry point: usage errors, --help, exit codes and Ctrl-C are click's; ours become one line."""
    try:
        app()
    except WeightsmithError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
