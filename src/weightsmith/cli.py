"""The `weightsmith` command line: one typer app, one sub-command per job.

Every command reports input problems as one line on stderr and a non-zero exit status; `--json`
prints machine-readable results on stdout instead of tables.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from weightsmith import __version__
from weightsmith.errors import WeightsmithError

#: The module that adds each top-level command, in help order. Only the module of the command a
#: command line names is imported: `weightsmith inspect` then starts without numba, scipy or httpx,
#: which the other commands need. `--help` and unknown names load them all.
COMMAND_MODULES = {
    "quantize": "weightsmith.cli_quantize",
    "demo": "weightsmith.cli_quantize",
    "inspect": "weightsmith.audit.commands",
    "verify": "weightsmith.audit.commands",
    "transplant": "weightsmith.audit.commands",
    "diff": "weightsmith.audit.commands",
    "bench": "weightsmith.bench.cli",
    "eval": "weightsmith.fidelity.cli",
    "calibrate": "weightsmith.engine.cli",
    "calibrate-kv": "weightsmith.calibrate_kv",
    "card": "weightsmith.card.cli",
    "preflight": "weightsmith.preflight.cli",
}
#: Commands that multiply no matrices. numpy and scipy each load an OpenBLAS that starts a thread
#: per core, which spins for about a tenth of a second looking for work: CPU the quantize workers
#: need (5-10% of a one-second run on two cores). For these commands OpenBLAS starts none.
NO_BLAS_THREADS = ("quantize", "demo")
err_console = Console(stderr=True, highlight=False)


def _version_callback(value: bool) -> None:
    if value:
        print(f"weightsmith {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """Serving-ready LLM checkpoints from raw safetensors, and the evidence for them."""


@contextmanager
def paused_gc() -> Iterator[None]:
    """Keep the cyclic garbage collector off start-up work that allocates what lives on, not garbage.

    Importing a command's modules and loading numba's compiled kernels create over 100,000 objects
    that stay until the process ends; the collector would walk them hundreds of times and free
    nothing (0.1-0.2 s of a one-second quantize). So it is paused meanwhile, and what exists at
    the end is frozen (`gc.freeze`: never walked again) before the previous state is restored.
    Reference counting frees everything else as usual.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def build_app(args: list[str]) -> typer.Typer:
    """The app for the command line `args` (without the program name)."""
    app = typer.Typer(
        name="weightsmith",
        help="Serving-ready LLM checkpoints from raw safetensors, and the evidence for them.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)  # a root callback also keeps a one-command app a group
    named = COMMAND_MODULES.get(args[0]) if args else None
    if args and args[0] in NO_BLAS_THREADS and "numpy" not in sys.modules:  # read once, as numpy loads
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for module in [named] if named else dict.fromkeys(COMMAND_MODULES.values()):
        importlib.import_module(module).register(app)
    return app


def main() -> None:
    """Entry point: usage errors, --help, exit codes and Ctrl-C are click's; ours become one line."""
    try:
        with paused_gc():
            app = build_app(sys.argv[1:])
        app()
    except WeightsmithError as exc:
        # a name like `a[/]b` is text, not markup: unescaped it would be hidden or raise
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True, emoji=False)
        sys.exit(2)


if __name__ == "__main__":
    from weightsmith.__main__ import ending

    try:
        main()
    finally:
        ending()
