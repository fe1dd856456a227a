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
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer._click import exceptions as click_errors  # typer carries its own copy of click
from typer._click.utils import echo

from weightsmith.core import blas_probe
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import cut_line, markup_safe, short_repr
from weightsmith.core.version import __version__

#: The module that adds each top-level command, in help order. Only the module of the command a
#: command line names is imported: `weightsmith inspect` then starts without numba, scipy or httpx,
#: which the other commands need, and no command's `--help` imports numpy (tests/test_cli.py).
COMMAND_MODULES = {
    "quantize": "weightsmith.quantization.cli",
    "sensitivity": "weightsmith.quantization.budget.cli",
    "demo": "weightsmith.quantization.cli",
    "inspect": "weightsmith.audit.cli",
    "verify": "weightsmith.audit.cli",
    "transplant": "weightsmith.audit.cli",
    "diff": "weightsmith.audit.cli",
    "eval": "weightsmith.fidelity.cli",
    "calibrate": "weightsmith.calibration.cli",
    "calibrate-kv": "weightsmith.calibration.cli",
    "card": "weightsmith.card.cli",
    "preflight": "weightsmith.preflight.cli",
    "bench": "weightsmith.bench.cli",
}
#: Each command's line in `weightsmith --help`: the first paragraph of its own help. The list is
#: shown from here, so that `--help` (and a mistyped name) imports none of the command modules,
#: which take a second to load between them; tests/test_cli.py holds each line to its command's.
SUMMARIES = {
    "quantize": "Quantize a checkpoint to a compressed-tensors checkpoint that vLLM loads (one scheme, or a recipe "
    "of several).",
    "sensitivity": "Measure what each candidate scheme costs each Linear (data-free and on calibration text) and "
    "write a report.",
    "demo": "Make a DFlash-like draft, quantize it with the dflash-draft preset, verify it, print sizes.",
    "inspect": "Where the bytes are: per category, dtype or layer, with bits per parameter. Reads headers only.",
    "verify": "Everything that can be wrong on disk. Exit 0 clean, 1 defects found, 2 cannot read at all.",
    "transplant": "Copy selected tensors (e.g. KV-cache scales) into a new shard of TARGET, re-index and declare.",
    "diff": "Which tensors are byte-identical (blake2b), which differ and by how much. Exit 1 if any differ.",
    "eval": "How much quantization costs: weight error per layer and category, then KL, top-1 and perplexity.",
    "calibrate": "Measure K/V maxima (as the KV cache receives them) and every Linear's input maximum, layer by layer.",
    "calibrate-kv": "Measure FP8 KV-cache scales (k_scale, v_scale) on calibration text and add them to a checkpoint.",
    "card": "A model card with only measured numbers, each citing its file and field. Exit 1 when --check fails.",
    "preflight": "Will this vLLM load and serve this pair correctly? Read from its source and the checkpoints, no GPU.",
    "bench": "A/B serving benchmarks: arms from a TOML file, counterbalanced, with honest statistics.",
}
#: Commands that multiply no matrices. numpy and scipy each load an OpenBLAS that starts a thread
#: per core, which spins for about a tenth of a second looking for work: CPU the quantize workers
#: need (5-10% of a one-second run on two cores). For these commands OpenBLAS starts none, and
#: numba's BLAS probe is answered without importing scipy.linalg (`blas_probe`).
NO_BLAS_THREADS = ("quantize", "demo")
err_console = Console(stderr=True, highlight=False)


def _version_callback(value: bool) -> None:
    if value:
        print(f"weightsmith {__version__}")
        raise typer.Exit()


def _help_callback(ctx: typer.Context, value: bool) -> None:
    """Print the help page and exit, as typer's own help option does."""
    if value and not ctx.resilient_parsing:
        echo(ctx.get_help(), color=ctx.color)
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
    # The root's own help flag, in place of the one typer adds: typer gives its flag no value when it is
    # not given, and builds a pydantic validator to coerce that absence (importing pydantic: 0.07 s of
    # every `weightsmith X --help`); a flag whose default is False is not coerced.
    show_help: bool = typer.Option(
        False, "--help", callback=_help_callback, is_eager=True, expose_value=False, help="Show this message and exit."
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
    if named is None:  # `--help`, `--version`, no command or a mistyped one: the list, from the table
        for name, summary in SUMMARIES.items():
            app.command(name, help=summary)(_listed_only)
        return app
    if args[0] in NO_BLAS_THREADS:
        if "numpy" not in sys.modules:  # read once, as numpy loads
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        blas_probe.skip()
    importlib.import_module(named).register(app)
    return app


def _listed_only() -> None:
    """Stands for a command in the list `--help` prints; `build_app` adds the real one before it can run."""
    raise AssertionError("a listed-only command ran")


def main() -> None:
    """Entry point: --help, exit codes and Ctrl-C are click's; usage errors and ours become one line.

    click runs in non-standalone mode so that a usage error (an unknown option, a missing argument,
    a value its type or range refuses) reaches `usage_line` instead of typer's usage box of five or
    six lines; `typer.Exit` then comes back as its exit status.
    """
    targets = sys.modules.get("weightsmith.formats.targets")
    if targets is not None:  # a run in a process that ran one before (tests): its own matching budget
        targets.reset_budget()
    try:
        with paused_gc():
            app = build_app(sys.argv[1:])
        status = typer.main.get_command(app).main(args=sys.argv[1:], standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:  # a bare group: typer printed its help making this
        sys.exit(exc.exit_code)
    except click_errors.ClickException as exc:
        err_console.print(f"[bold red]error:[/] {markup_safe(usage_line(exc))}", soft_wrap=True, emoji=False)
        sys.exit(exc.exit_code)
    except typer.Abort:  # end of input at a prompt
        err_console.print("[bold red]error:[/] aborted", soft_wrap=True, emoji=False)
        sys.exit(1)
    except WeightsmithError as exc:
        _refused(exc)
    except OSError as exc:  # a path the system refuses (too long, a loop of links): a line, not a traceback
        _refused(WeightsmithError(exc.strerror or str(exc), file=exc.filename))
    except MemoryError:  # an input read whole past what this machine holds: a line, not a traceback
        sys.stderr.write("error: ran out of memory; an input is larger than this machine can hold\n")
        sys.exit(2)
    # commands return None; an int is the status of a `typer.Exit` (or click's own, for --help)
    if isinstance(status, int) and status:
        sys.exit(status)


def _refused(exc: WeightsmithError) -> NoReturn:
    """Print `exc` as the one error line (cut to `LINE_LIMIT`) and exit 2."""
    # a name like `a[/]b` is text, not markup: unescaped it would be hidden or raise
    err_console.print(f"[bold red]error:[/] {escape(cut_line(str(exc)))}", soft_wrap=True, emoji=False)
    sys.exit(2)


#: The longest usage error shown: the message quotes what was typed, which may be any length.
USAGE_LINE_LIMIT = 300


def usage_line(exc: click_errors.ClickException) -> str:
    """click's message for a usage error as one line that names the value it refused.

    click's own types quote the value they refuse, but typer's (pydantic) validation says only what
    was wrong with it; the value is then taken from the validation error and added. The message may
    quote a stranger's bytes of any length: it is cut, and the caller makes it printable.
    """
    message = " ".join(exc.format_message().split())
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if isinstance(exc, click_errors.BadParameter) and callable(errors):
        found = errors()
        if found and "input" in found[0]:
            message += f" (got {short_repr(found[0]['input'])})"
    if len(message) > USAGE_LINE_LIMIT:
        message = message[: USAGE_LINE_LIMIT - 3] + "..."
    return message


if __name__ == "__main__":
    from weightsmith.__main__ import ending

    try:
        main()
    finally:
        ending()
