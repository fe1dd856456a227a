"""`weightsmith calibrate SRC --out stats.safetensors`: activation maxima from a layer-streamed run; and
`weightsmith calibrate-kv QUANT`: FP8 KV-cache scales measured and added to a checkpoint (`calibration.kv`).

Exit status 0 when the statistics are written, 2 for bad input (one line from `cli.main`, nothing
written). The file is written whole or not at all (`stats_file.write`).

`calibrate` runs as one rank of several when torchrun started it (`engine.distributed.joined`), or
starts `--processes P` ranks of itself on this machine (`engine.launch`), which then reports for
them: rank 0's lines, or one line naming the rank that failed (status 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from weightsmith.core.terminal import markup_safe
from weightsmith.engine import distributed
from weightsmith.io.texts import BUILTINS, CALIBRATION_SEQ_LEN, CALIBRATION_TOKENS, MAX_TOKENS, TEXT_HELP, tokens_option

err_console = Console(stderr=True, highlight=False)


def calibrate_command(
    src: Annotated[Path, typer.Argument(help="The checkpoint folder to run (original, FP8 or quantized).")],
    out: Annotated[Path, typer.Option("--out", help="The statistics file to write (.safetensors).")],
    text: Annotated[Path | None, typer.Option("--text", help=f"UTF-8 calibration text ({TEXT_HELP}).")] = None,
    builtin: Annotated[
        str | None, typer.Option("--builtin", help=f"Built-in text: {', '.join(BUILTINS)} (default code).")
    ] = None,
    tokens: Annotated[
        int,
        typer.Option(
            "--tokens",
            parser=tokens_option(),
            help=f"Calibration tokens, at most (at most {MAX_TOKENS:,}).",
        ),
    ] = CALIBRATION_TOKENS,
    seq_len: Annotated[
        int, typer.Option("--seq-len", min=1, max=MAX_TOKENS, help="Tokens per sequence.")
    ] = CALIBRATION_SEQ_LEN,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Run the checkpoint's own model code (it runs on this machine).")
    ] = False,
    all_experts: Annotated[
        bool,
        typer.Option(
            "--all-experts",
            help="On an MoE: each expert's input maxima from every token, not only those routed to it (the outputs "
            "stay routed as the model routes), so that every expert has one.",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing statistics file.")] = False,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            min=1,
            max=1024,
            help="Run as this many ranks on this machine, each on its share of the sequences (under torchrun: "
            "leave out).",
        ),
    ] = 1,
    peer_timeout: Annotated[
        float,
        typer.Option(
            "--peer-timeout",
            min=1,
            max=7 * 24 * 3600,
            help="Seconds a rank waits for the others (to join, and to exchange maxima) before the run ends.",
        ),
    ] = distributed.DEFAULT_TIMEOUT,
) -> None:
    """Measure K/V maxima (as the KV cache receives them) and every Linear's input maximum, layer by layer."""
    from weightsmith.calibration.run import check_out  # here: `calibrate --help` starts without the run's modules
    from weightsmith.engine import launch

    if launch.launching(processes):
        check_out(src, out, force)  # here, once, rather than as the same error from every rank
        launch.relay(processes)
        return
    with distributed.joined(peer_timeout, processes, launch.job("calibrate", src, out)) as world:
        _calibrate(src, out, text, builtin, tokens, seq_len, trust_remote_code, all_experts, force, world)


def _calibrate(
    src: Path,
    out: Path,
    text: Path | None,
    builtin: str | None,
    tokens: int,
    seq_len: int,
    trust_remote_code: bool,
    all_experts: bool,
    force: bool,
    world: distributed.World,
) -> None:
    """The run of one rank (of one, or of a world); rank 0 reports it."""
    from weightsmith.calibration.run import calibrate

    show = err_console.is_terminal
    result = calibrate(
        src,
        out,
        text=text,
        builtin=builtin,
        tokens=tokens,
        seq_len=seq_len,
        force=force,
        trust_remote_code=trust_remote_code,
        all_experts=all_experts,
        progress=(lambda line: err_console.print(f"calibrate: {markup_safe(line)}", end="\r")) if show else None,
        warn=lambda line: err_console.print(f"[yellow]warning:[/] {markup_safe(line)}", soft_wrap=True),
        world=world,
    )
    if not world.leader:
        return
    stats, count, seconds = result.stats, result.tokens, result.seconds
    err_console.print(
        f"{markup_safe(out)}: {len(stats.kv)} attention modules, {len(stats.inputs)} Linear inputs; {count} tokens in "
        f"{seconds:.1f} s ({count / seconds:.1f} tokens/s), activations {stats.provenance.activations}",
        soft_wrap=True,
    )


def _show(line: str) -> None:
    err_console.print(markup_safe(line), end="\r")


def calibrate_kv_command(
    quant: Path = typer.Argument(..., help="Quantized checkpoint folder to add k_scale/v_scale to (in place)."),
    source: Path | None = typer.Option(
        None,
        "--from",
        help="Measure on this original checkpoint's activations (default: on QUANT's own, dequantized).",
    ),
    text: str | None = typer.Option(
        None, "--text", help=f"Calibration text file ({TEXT_HELP}; default: --builtin code)."
    ),
    builtin: str | None = typer.Option(None, "--builtin", help="Built-in calibration text: code or prose."),
    tokens: int = typer.Option(
        CALIBRATION_TOKENS,
        "--tokens",
        parser=tokens_option(),
        help=f"Calibration tokens to run (at most {MAX_TOKENS:,}).",
    ),
    seq_len: int = typer.Option(CALIBRATION_SEQ_LEN, "--seq-len", min=1, max=MAX_TOKENS, help="Tokens per sequence."),
    out: Path | None = typer.Option(None, "--out", help="Write the result here instead of replacing QUANT."),
    force: bool = typer.Option(False, "--force", help="Replace KV-cache scales QUANT already has."),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="Let transformers run the checkpoint's own modelling code."
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
) -> None:
    """Measure FP8 KV-cache scales (k_scale, v_scale) on calibration text and add them to a checkpoint."""
    from weightsmith.calibration import kv  # here: `calibrate-kv --help` starts without its modules

    output, entry = kv.calibrate_kv(
        quant,
        source,
        text=text,
        builtin=builtin,
        tokens=tokens,
        seq_len=seq_len,
        force=force,
        out=out,
        trust_remote_code=trust_remote_code,
        progress=None if json_out or not err_console.is_terminal else _show,
    )
    if json_out:
        print(json.dumps({"output": str(output), "calibration": entry}, indent=2))
        return
    Console(highlight=False, soft_wrap=True).print(
        f"[bold green]wrote[/] {entry['kv_scales']} KV-cache scales into {markup_safe(output / kv.SHARD)}, measured on "
        f"{entry['tokens']:,} tokens of {markup_safe(entry['text'])} ({entry['activations']} activations)"
    )


def register(app: typer.Typer) -> None:
    """Add `calibrate` and `calibrate-kv` to the project's command line."""
    app.command("calibrate")(calibrate_command)
    app.command("calibrate-kv")(calibrate_kv_command)
