"""`weightsmith calibrate SRC --out stats.safetensors`: activation maxima from a layer-streamed run.

Exit status 0 when the statistics are written, 2 for bad input (one line from `cli.main`, nothing
written). The file is written whole or not at all (`calibration.write`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from weightsmith import calibration
from weightsmith.checkpoint import Checkpoint
from weightsmith.engine.texts import BUILTINS
from weightsmith.errors import OutputError, WeightsmithError
from weightsmith.files import check_file_name
from weightsmith.manifest import measured_activations, source_fingerprint
from weightsmith.outputdir import refuse_inside
from weightsmith.terminal import markup_safe

err_console = Console(stderr=True, highlight=False)
DEFAULT_TOKENS = 65536
DEFAULT_SEQ_LEN = 2048


def _check_out(src: Path, out: Path, force: bool) -> None:
    """Refuse an output the run could not or must not write, before the run: it may take hours."""
    check_file_name(out)  # before anything stats it: a name too long is ENAMETOOLONG there
    refuse_inside(out, src)
    if out.is_dir():
        raise OutputError("is a folder; --out names the statistics file", file=out, code="output.folder")
    calibration.check_replaceable(out, force)
    if not out.parent.is_dir():
        raise OutputError("is in a folder that does not exist", file=out, code="output.parent")


def calibrate_command(
    src: Annotated[Path, typer.Argument(help="The checkpoint folder to run (original, FP8 or quantized).")],
    out: Annotated[Path, typer.Option("--out", help="The statistics file to write (.safetensors).")],
    text: Annotated[
        Path | None, typer.Option("--text", help=f"UTF-8 calibration text ({calibration.TEXT_HELP}).")
    ] = None,
    builtin: Annotated[
        str | None, typer.Option("--builtin", help=f"Built-in text: {', '.join(BUILTINS)} (default code).")
    ] = None,
    tokens: Annotated[
        int,
        typer.Option(
            "--tokens",
            parser=calibration.tokens_option(),
            help=f"Calibration tokens, at most (at most {calibration.MAX_TOKENS:,}).",
        ),
    ] = DEFAULT_TOKENS,
    seq_len: Annotated[
        int, typer.Option("--seq-len", min=1, max=calibration.MAX_TOKENS, help="Tokens per sequence.")
    ] = DEFAULT_SEQ_LEN,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Run the checkpoint's own model code (it runs on this machine).")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing statistics file.")] = False,
) -> None:
    """Measure K/V maxima (as the KV cache receives them) and every Linear's input maximum, layer by layer."""
    from weightsmith.fidelity.logits import missing_library

    _check_out(src, out, force)
    ckpt = Checkpoint.open(src)
    missing = missing_library()
    if missing is not None:
        raise WeightsmithError(missing, code="engine.libraries")
    from weightsmith.engine.calibrate import calibration_tokens, measure
    from weightsmith.engine.loading import opened

    with opened(src, trust_remote_code=trust_remote_code) as loader:  # a model the engine cannot run fails now
        activations = loader.source.activations
    model = calibration.fingerprint(ckpt)
    source = source_fingerprint(ckpt, model, activations)  # a bad manifest fails now, not after the run
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sequences, label, sha = calibration_tokens(
        src, str(text) if text else None, builtin, tokens, seq_len, trust_remote_code=trust_remote_code
    )
    count = sum(map(len, sequences))
    if count < calibration.MIN_TOKENS:
        err_console.print(
            f"[yellow]warning:[/] {count} calibration tokens, fewer than {calibration.MIN_TOKENS}: "
            "a maximum over so few is not stable",
            soft_wrap=True,
        )
    started = time.perf_counter()
    show = err_console.is_terminal
    kv, inputs = measure(
        src,
        sequences,
        trust_remote_code=trust_remote_code,
        progress=(lambda line: err_console.print(f"calibrate: {markup_safe(line)}", end="\r")) if show else None,
    )
    seconds = time.perf_counter() - started
    provenance = calibration.Provenance.of_run(
        model, sequences, label, sha, measured_activations(activations, model, source), source
    )
    calibration.write(out, calibration.CalibrationStats(provenance, kv, inputs), replace=force)
    err_console.print(
        f"{markup_safe(out)}: {len(kv)} attention modules, {len(inputs)} Linear inputs; {count} tokens in "
        f"{seconds:.1f} s ({count / seconds:.1f} tokens/s), activations {provenance.activations}",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add `calibrate` to the project's command line."""
    app.command("calibrate")(calibrate_command)
