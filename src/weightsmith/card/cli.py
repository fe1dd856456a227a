"""`weightsmith card OUT`: write OUT/README.md from what was measured, or check an existing one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from weightsmith.core.errors import OutputError, WeightsmithError
from weightsmith.core.terminal import printable
from weightsmith.io.serving import CARD_FILE


def refuse_foreign_card(card: Path) -> None:
    """Stop before replacing a README.md that `card` did not write (often the upstream model card).

    A link or anything but a plain file counts as foreign too: replacing it is a choice to make with --force.
    """
    from weightsmith.card.check import read_card
    from weightsmith.card.cite import find_cited
    from weightsmith.io.manifest import MANIFEST_FILE

    own_citation = f"{MANIFEST_FILE}: recipe.scheme"  # every card cites the scheme in its first paragraph

    if not card.exists() and not card.is_symlink():
        return
    if card.is_file() and not card.is_symlink():
        text = read_card(card, strict=False)
        if any(c.source == own_citation for c in find_cited(text)):
            return
    raise OutputError(
        "was not written by `weightsmith card` (no cited numbers); use --force to replace it",
        file=card,
        code="card.foreign-readme",
    )


def card_command(
    out: Annotated[Path, typer.Argument(help="A `weightsmith quantize` output folder.")],
    bench: Annotated[
        Path | None, typer.Option("--bench", help="`weightsmith bench` results JSON for the serving section.")
    ] = None,
    eval_json: Annotated[
        Path | None, typer.Option("--eval", help="`weightsmith eval --json` output for the fidelity section.")
    ] = None,
    preflight: Annotated[
        list[Path] | None,
        typer.Option("--preflight", help="`weightsmith preflight --json` output, one per vLLM version; repeatable."),
    ] = None,
    base: Annotated[str | None, typer.Option("--base", help="Hub id of the base model, e.g. org/name.")] = None,
    license_id: Annotated[str | None, typer.Option("--license", help="License id for the front matter.")] = None,
    repo: Annotated[
        str | None,
        typer.Option("--repo", help="Hub id ORG/NAME the card is published at: adds Serving it (download, serve)."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Re-derive every number in OUT/README.md; exit 1 naming any that drifted.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an OUT/README.md that `weightsmith card` did not write.")
    ] = False,
) -> None:
    """A model card with only measured numbers, each citing its file and field. Exit 1 when --check fails."""
    # imported here: `card --help` starts without what reading a benchmark's results needs (httpx, numpy)
    from weightsmith.card.check import check_card
    from weightsmith.card.front import check_repo_id
    from weightsmith.card.render import render_card
    from weightsmith.card.sources import cited_files, gather, keep, written_by_card

    if check:
        if bench is not None or eval_json is not None or repo is not None or preflight:
            raise WeightsmithError(
                "--check reads the copies the card cites in OUT and the repo it names; "
                "drop --bench/--eval/--preflight/--repo",
                code="usage",
            )
        result = check_card(out)
        for line in result.mismatches:
            print(printable(line))
        for line in result.provenance:
            print(f"source {line}")
        verdict = "ok" if result.ok else f"{len(result.mismatches)} mismatch(es)"
        print(f"card --check: {result.checked} cited numbers, {verdict}")
        if not result.ok:
            raise typer.Exit(1)
        return
    for value, option in ((repo, "--repo"), (base, "--base")):
        if value is not None:
            check_repo_id(value, option)
    if not force:
        refuse_foreign_card(out / CARD_FILE)
        for name in cited_files(eval_json is not None, bench is not None, bool(preflight)):
            if os.path.lexists(out / name) and not written_by_card(out / name):
                raise OutputError(
                    "was not written by `weightsmith card`; use --force to replace it",
                    file=out / name,
                    code="card.foreign-file",
                )
    src = gather(out, eval_json, bench, preflight or ())
    markdown, cited = render_card(src, base, license_id, repo)
    keep(src, markdown)
    sections = [
        "serving it" if repo else "",
        "fidelity" if src.eval is not None else "",
        "serving benchmark" if src.bench is not None else "",
    ]
    extra = ", ".join(s for s in sections if s)
    print(
        printable(f"wrote {out / CARD_FILE}: {len(cited.by_source)} distinct cited sources")
        + (f", with {extra}" if extra else "")
    )


def register(app: typer.Typer) -> None:
    """Add `card` to the project's command line."""
    app.command("card")(card_command)
