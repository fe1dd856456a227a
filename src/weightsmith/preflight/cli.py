"""`weightsmith preflight TARGET [--draft DRAFT --method M --k N] [--vllm PATH] [--json]`.

Findings grouped by what the user would see (will not load / serves wrong numbers / slower than it
could / could not check / note), each with vLLM's own line as evidence and the fix, then the suggested `vllm serve`
command. Exit 1 when anything would fail or silently degrade, or could not be checked against this
vLLM's source; 2 when an input cannot be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from weightsmith.core.terminal import markup_safe

if TYPE_CHECKING:
    from weightsmith.preflight.report import Preflight

#: The most speculative tokens `--k` may name: no draft proposes more per step than this.
MAX_K = 1024


def print_preflight(result: Preflight, console: Console | None = None) -> None:
    from weightsmith.preflight.report import IMPACTS, NOTE, SLOW, UNCHECKED
    from weightsmith.preflight.source import UNKNOWN

    console = console or Console(highlight=False, soft_wrap=True)
    pair = f"{result.target}" + (f" + draft {result.draft} ({result.method})" if result.draft else "")
    build = {"cpu": ", CPU build", UNKNOWN: ""}.get(result.vllm_platform, f", {result.vllm_platform.upper()} build")
    against = f"vLLM {result.vllm_version} ({result.vllm}{build})"
    console.print(f"[bold]preflight[/] {markup_safe(pair)} against {markup_safe(against)}")
    for impact in IMPACTS:
        items = [i for i in result.items if i.impact == impact]
        if not items:
            continue
        style = "dim" if impact == NOTE else "bold yellow" if impact in (SLOW, UNCHECKED) else "bold red"
        console.print(f"\n[{style}]{impact.capitalize()}[/] ({len(items)})")
        for item in items:
            console.print(markup_safe(f"- [{item.check}] ") + markup_safe(item.line()))
            for ev in item.evidence:
                console.print("    " + markup_safe(ev.show()))
            if item.fix:
                console.print("    fix: " + markup_safe(item.fix))
    console.print("\n[bold]Suggested command[/]")
    console.print(markup_safe(result.serve))
    verdict = "OK"
    if result.failed:
        could_not = " (or could not be checked)" if any(i.impact == UNCHECKED for i in result.items) else ""
        verdict = f"FAIL: something would not load or would silently degrade{could_not}"
    console.print(f"\n{verdict}")


def _preflight(
    target: Annotated[Path, typer.Argument(help="The target checkpoint folder.")],
    draft: Annotated[Path | None, typer.Option("--draft", help="A speculative draft checkpoint folder.")] = None,
    method: Annotated[
        str | None,
        typer.Option("--method", help="Speculative method (dflash, eagle3, ...); read from the draft if omitted."),
    ] = None,
    k: Annotated[
        int | None,
        typer.Option("--k", min=1, max=MAX_K, help="num_speculative_tokens for the serve line."),
    ] = None,
    vllm: Annotated[
        Path | None,
        typer.Option("--vllm", help="A vLLM wheel or site-packages folder (default: the vllm installed here)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON (docs/preflight.md).")] = False,
) -> None:
    """Will this vLLM load and serve this pair correctly? Read from its source and the checkpoints, no GPU."""
    from weightsmith.preflight.checks import preflight  # here: `preflight --help` starts without the checks

    result = preflight(target, vllm=vllm, draft=draft, method=method, k=k)
    if as_json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print_preflight(result)
    if result.failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("preflight")(_preflight)
