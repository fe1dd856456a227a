"""The doctor's sub-commands: `inspect`, `verify`, `transplant`, `diff`.

`register(app)` adds them to the project's typer app. Input problems surface as `WeightsmithError`
(one line, exit 2, printed by `cli.main`); `verify` and `diff` exit 1 when they find something.
`verify`, `transplant` and `diff` import their modules when they run, so that `inspect` starts
without what they need to read values (numpy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weightsmith.audit import render
from weightsmith.audit.inspect import VIEWS, inspect
from weightsmith.core.terminal import short_repr
from weightsmith.io.checkpoint import DEFAULT_SHARD


def _inspect(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint folder or one .safetensors file.")],
    by: Annotated[str, typer.Option("--by", help=f"Rows of the table: {', '.join(VIEWS)}.")] = "category",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Where the bytes are: per category, dtype or layer, with bits per parameter. Reads headers only."""
    if by not in VIEWS:
        raise typer.BadParameter(f"{short_repr(by)} is not one of {', '.join(VIEWS)}", param_hint="--by")
    report = inspect(checkpoint, by)
    if as_json:
        print(render.to_json(report))
    else:
        render.print_inspect(report)


def _verify(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint folder or one .safetensors file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    scan_values: Annotated[
        bool, typer.Option("--scan-values", help="Also read every value: NaN/Inf and all-zero tensors.")
    ] = False,
) -> None:
    """Everything that can be wrong on disk. Exit 0 clean, 1 defects found, 2 cannot read at all."""
    from weightsmith.audit.verify import verify

    report = verify(checkpoint, scan=scan_values)
    if as_json:
        print(render.to_json(report))
    else:
        render.print_verify(report)
    if not report.clean:
        raise typer.Exit(1)


def _transplant(
    donor: Annotated[Path, typer.Argument(help="Checkpoint to copy tensors from (only read).")],
    target: Annotated[Path, typer.Argument(help="Checkpoint to add them to (replaced whole, unless --out).")],
    select: Annotated[
        list[str], typer.Option("--select", help="Tensor name, or 're:' regex anchored at the start; repeatable.")
    ],
    shard: Annotated[str, typer.Option("--shard", help="File name of the new shard.")] = DEFAULT_SHARD,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the result here instead of replacing TARGET.")
    ] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite tensors the target already has.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Copy selected tensors (e.g. KV-cache scales) into a new shard of TARGET, re-index and declare."""
    from weightsmith.audit.transplant import transplant
    from weightsmith.core.interrupt import terminate_as_interrupt

    with terminate_as_interrupt():  # the partial output is removed, as on Ctrl-C
        result = transplant(donor, target, select, shard=shard, out=out, replace=replace)
    if as_json:
        print(render.to_json(result))
    else:
        render.print_transplant(result)


def _diff(
    a: Annotated[Path, typer.Argument(help="First checkpoint folder or .safetensors file.")],
    b: Annotated[Path, typer.Argument(help="Second checkpoint folder or .safetensors file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Which tensors are byte-identical (blake2b), which differ and by how much. Exit 1 if any differ."""
    from weightsmith.audit.diff import diff

    report = diff(a, b)
    if as_json:
        print(render.to_json(report))
    else:
        render.print_diff(report)
    if not report.same:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the doctor's commands to `app`."""
    app.command("inspect")(_inspect)
    app.command("verify")(_verify)
    app.command("transplant")(_transplant)
    app.command("diff")(_diff)
