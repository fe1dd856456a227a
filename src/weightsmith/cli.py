"""The `weightsmith` command line: one typer app, one sub-command per job.

Every command reports input problems as one line on stderr and a non-zero exit status; `--json`
prints machine-readable results on stdout instead of tables.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from weightsmith import __version__
from weightsmith.errors import WeightsmithError

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


# Sub-command registration: each job lives in its own module and registers itself here.
# --- commands ---
from weightsmith.cli_quantize import demo, quantize  # noqa: E402

app.command()(quantize)
app.command()(demo)
# --- end commands ---


def main() -> None:
    """Entry point: run the app, turning user-facing errors into one line and an exit status."""
    try:
        app(standalone_mode=False)
    except WeightsmithError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]: nothing was left behind that looks finished")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
