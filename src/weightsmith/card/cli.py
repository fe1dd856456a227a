"""`weightsmith card OUT`: write OUT/README.md from what was measured, or check an existing one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from weightsmith.card.check import check_card
from weightsmith.card.render import render_card
from weightsmith.card.sources import CARD_FILE, gather
from weightsmith.errors import WeightsmithError


def card_command(
    out: Annotated[Path, typer.Argument(help="A `weightsmith quantize` output folder.")],
    bench: Annotated[
        Path | None, typer.Option("--bench", help="`weightsmith bench` results JSON for the serving section.")
    ] = None,
    eval_json: Annotated[
        Path | None, typer.Option("--eval", help="`weightsmith eval --json` output for the fidelity section.")
    ] = None,
    base: Annotated[str | None, typer.Option("--base", help="Hub id of the base model, e.g. org/name.")] = None,
    license_id: Annotated[str | None, typer.Option("--license", help="License id for the front matter.")] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Re-derive every number in OUT/README.md; exit 1 naming any that drifted.")
    ] = False,
) -> None:
    """A model card with only measured numbers, each citing its file and field. Exit 1 when --check fails."""
    if check:
        if bench is not None or eval_json is not None:
            raise WeightsmithError("--check reads the copies the card cites in OUT; drop --bench/--eval", code="usage")
        result = check_card(out)
        for line in result.mismatches:
            print(line)
        for line in result.provenance:
            print(f"source {line}")
        verdict = "ok" if result.ok else f"{len(result.mismatches)} mismatch(es)"
        print(f"card --check: {result.checked} cited numbers, {verdict}")
        if not result.ok:
            raise typer.Exit(1)
        return
    src = gather(out, eval_json, bench)
    markdown, cited = render_card(src, base, license_id)
    (out / CARD_FILE).write_text(markdown, encoding="utf-8")
    sections = ["fidelity" if src.eval is not None else "", "serving" if src.bench is not None else ""]
    extra = ", ".join(s for s in sections if s)
    print(
        f"wrote {out / CARD_FILE}: {len(cited.by_source)} distinct cited sources" + (f", with {extra}" if extra else "")
    )


def register(app: typer.Typer) -> None:
    """Add `card` to the project's command line."""
    app.command("card")(card_command)
