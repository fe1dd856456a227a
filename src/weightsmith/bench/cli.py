"""`weightsmith bench`: run an A/B serving benchmark, re-render its report, check server logs.

The benchmark's modules (scipy, matplotlib) are imported inside the commands, so that registering
this sub-command costs every other `weightsmith` command nothing at start-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from weightsmith.core.errors import OutputError
from weightsmith.core.terminal import markup_safe, printable

if TYPE_CHECKING:
    from weightsmith.bench.results import BenchResults

bench_app = typer.Typer(
    help="A/B serving benchmarks: arms from a TOML file, counterbalanced, with honest statistics.",
    no_args_is_help=True,
)


@bench_app.command("run")
def run_command(
    arms: Path = typer.Argument(..., help="Arms file (TOML); see docs/bench.md."),
    out: Path = typer.Option(Path("bench-results"), "--out", "-o", help="Output folder."),
    force: bool = typer.Option(False, "--force", help="Replace the results a previous run left in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress display."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
    allow_unsandboxed: bool = typer.Option(
        False,
        "--allow-unsandboxed",
        help="Run a quality suite's python_tests even where the sandbox (namespaces, Landlock) is unavailable.",
    ),
) -> None:
    """Measure every arm, write results.json, report.md and PNG plots into --out.

    Exit status 0 when every arm was measured, 1 when an arm failed or the run was interrupted
    (Ctrl-C or SIGTERM; whatever was measured is still written), 2 for a bad arms file or an --out
    that is not bench's to write (not empty and not written by bench; `--force` does not change that).
    """
    from weightsmith.bench.config import load_config
    from weightsmith.bench.outdir import claim
    from weightsmith.bench.progress import RichProgress
    from weightsmith.bench.quality.runs import prepare
    from weightsmith.bench.report import REPORT_FILE, RESULTS_FILE, write_all, write_results_file
    from weightsmith.bench.results import VISIT_OK
    from weightsmith.bench.runner import QuietObserver, run_bench
    from weightsmith.bench.stats import SHOWN
    from weightsmith.core.interrupt import terminate_as_interrupt

    config = load_config(arms)
    plan = prepare(config, allow_unsandboxed)
    if (out / RESULTS_FILE).exists() and not force:
        raise OutputError(f"{out / RESULTS_FILE} exists; choose another --out or pass --force")
    claim(out, (RESULTS_FILE, REPORT_FILE))
    err = Console(stderr=True, highlight=False)

    def save(results: BenchResults) -> None:
        write_results_file(results, None, out)

    with terminate_as_interrupt():
        if quiet or as_json:
            results = run_bench(config, out, QuietObserver(), save=save, quality_plan=plan)
        else:
            with RichProgress(err) as progress:
                results = run_bench(config, out, progress, save=save, quality_plan=plan)
    analysis, files = write_all(results, out)
    failed = [a.name for a in results.arms if a.status != VISIT_OK]
    verdicts = [
        {
            "arm": c.arm,
            "metric": c.metric,
            "effect": c.effect,
            "ci": [c.ci_low, c.ci_high],
            "verdict": c.verdict,
            "arm_better": c.arm_better,
        }
        for c in analysis.comparisons
    ]
    if as_json:
        summary = {
            "files": {k: str(v) for k, v in files.items()},
            "failed_arms": failed,
            "interrupted": results.interrupted,
            "verdicts": verdicts,
            "quality": [
                {"arm": c.arm, "verdict": c.verdict, "words": c.words}
                for c in (analysis.quality.comparisons if analysis.quality else [])
            ],
        }
        print(json.dumps(summary, indent=1))
    else:
        for c in analysis.comparisons:
            if c.effect is None:
                continue
            word = c.verdict
            if c.verdict == SHOWN:
                word = "better" if c.arm_better else "worse"
            err.print(markup_safe(f"{c.arm} vs {c.baseline}, {c.metric}: {c.effect:+.1%} ({word})"))
        for q in analysis.quality.comparisons if analysis.quality else []:
            err.print(f"quality, {q.words}", markup=False)
        err.print(f"report: {markup_safe(files['report'])}")
        for name in failed:
            err.print(f"[red]arm '{markup_safe(name)}' failed[/]: {markup_safe(results.arm(name).failure)}")
    if failed or results.interrupted:
        raise typer.Exit(1)


@bench_app.command("report")
def report_command(
    results_file: Path = typer.Argument(..., help="results.json from `weightsmith bench run`."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder (default: beside the file)."),
) -> None:
    """Recompute the analysis and rewrite report.md and the plots from a results file.

    The results file itself is never rewritten. The report goes into --out (empty, or a folder bench
    wrote) or beside the file, when that folder is one bench wrote or holds the file alone; a file
    there that bench did not write is never replaced. A results file of schema version 1 holds the
    run's own paths; they are rewritten as `run` now records them (relative to the file's folder,
    else file names), so the report names none either.
    """
    from weightsmith.bench.outdir import claim
    from weightsmith.bench.paths import make_portable
    from weightsmith.bench.report import REPORT_FILE, write_all
    from weightsmith.bench.results import load_results

    results = make_portable(load_results(results_file), None, results_file.resolve().parent)
    target = out or results_file.parent
    claim(target, (REPORT_FILE,), besides=None if out is not None else results_file)
    _, files = write_all(results, target, with_results=False)
    print(printable(f"wrote {files['report']} and {len(files) - 1} plot(s) in {target}"))


@bench_app.command("logcheck")
def logcheck_command(
    logs: list[Path] = typer.Argument(..., help="Server log files."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run the evidence patterns over server logs; exit 1 if an error pattern matched."""
    from weightsmith.bench import logcheck

    found = {}
    for log in logs:
        if not log.is_file():
            raise OutputError(f"{log}: no such log file")
        found[str(log)] = logcheck.scan_log(log)
    if as_json:
        print(json.dumps({k: [vars(e) for e in v] for k, v in found.items()}, indent=1))
    else:
        for shown, evidence in found.items():
            print(f"{shown}:")
            if not evidence:
                print("  nothing matched")
            for e in evidence:
                value = f" [{e.value}]" if e.value else ""
                print(f"  {e.severity:7} {e.pattern}{value} x{e.count}: {e.meaning}")
    if any(e.severity == logcheck.ERROR for v in found.values() for e in v):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the `bench` group to `app`."""
    app.add_typer(bench_app, name="bench")
