"""`weightsmith quantize` and `weightsmith demo`."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from weightsmith.calibration.stats_file import MAX_TOKENS, tokens_option
from weightsmith.cli import paused_gc
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import read_regular
from weightsmith.core.interrupt import terminate_as_interrupt
from weightsmith.core.terminal import markup_safe
from weightsmith.engine import distributed, launch
from weightsmith.io.outputdir import check_destination
from weightsmith.io.texts import TEXT_HELP
from weightsmith.quantize.demo import DEMO_CONFIG, write_demo_checkpoint
from weightsmith.quantize.library import write
from weightsmith.quantize.pipeline import MAX_WORKERS, QuantizeResult, default_workers, work_bytes
from weightsmith.quantize.plan import Plan
from weightsmith.quantize.presets import PRESETS
from weightsmith.quantize.recipe import GPTQ_DAMPENING, LLM_COMPRESSOR_DAMPENING, MAX_GROUP_SIZE, Recipe
from weightsmith.quantize.request import (
    AUTO,
    DEFAULT_SCHEME,
    GPTQ_SEQ_LEN,
    GPTQ_TOKENS,
    GptqOptions,
    open_plan,
    plan_warnings,
    pre_pass_option,
    resolve,
    rules_for,
)
from weightsmith.schemes import REGISTRY, SCHEME_NAMES, Scheme

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def plan_table(plan: Plan) -> Table:
    what = (
        f"recipe {markup_safe(plan.recipe.file)}, {len(plan.recipe.rules)} rules"
        if plan.recipe.mixed
        else f"{plan.scheme.name}, group {plan.scheme.group_size}"
    )
    table = Table(title=f"plan: {markup_safe(plan.source.root)} ({what})")
    for col in ("tensor", "dtype", "shape", "action", "why"):
        table.add_column(col, overflow="fold")
    for d in plan.decisions:
        table.add_row(
            markup_safe(d.name), d.dtype, "x".join(map(str, d.shape)) or "scalar", d.action, markup_safe(d.reason)
        )
    stats = plan.calibration.path if plan.calibration else None
    if plan.calibration is not None:
        prov = plan.calibration.stats.provenance
        table.caption = (
            f"static scales from {markup_safe(stats)}: {prov.tokens:,} tokens measured on "
            f"{markup_safe(plan.calibration.measured_on)} "
            f"({prov.activations} activations)"
        )
    for shard, specs in plan.added.items():
        for spec in specs:
            why = markup_safe(f"{plan.kv_cache} KV-cache scale measured in {stats}, written to {shard}")
            table.add_row(markup_safe(spec.name), spec.dtype, "x".join(map(str, spec.shape)), "add", why)
    return table


def _warn_plan(plan: Plan) -> None:
    """Recipe targets that match nothing, a statistics file measured on too few tokens (`plan_warnings`)."""
    for message in plan_warnings(plan):
        err.print(f"[yellow]warning:[/] {markup_safe(message)}", soft_wrap=True)  # one line, as errors are


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "source": str(plan.source.root),
        "scheme": plan.scheme.name,
        "group_size": plan.scheme.group_size,
        "preset": plan.preset,
        "rules": [{"targets": list(r.targets), "scheme": r.scheme.name} for r in plan.recipe.rules],
        "unmatched_targets": [{"rule": n, "target": t} for n, t in plan.unmatched_targets()],
        "predicted": plan.breakdown(),
        "ignore": plan.ignore,
        "bytes_in": plan.bytes_in,
        "bytes_out_predicted": plan.bytes_out,
        "calibration": str(plan.calibration.path) if plan.calibration else None,
        "calibration_measured_on": plan.calibration.measured_on if plan.calibration else None,
        "kv_cache": plan.kv_cache,
        "pre_pass": plan.pre_pass,
        "pre_pass_skipped": plan.pre_pass_skipped,
        "changed_by_pre_pass": plan.changed,
        "added": [
            {"name": s.name, "dtype": s.dtype, "shape": list(s.shape), "shard": shard}
            for shard, specs in plan.added.items()
            for s in specs
        ],
        "tensors": [
            {
                "name": d.name,
                "dtype": d.dtype,
                "shape": list(d.shape),
                "action": d.action,
                "reason": d.reason,
                "outputs": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in d.outputs],
            }
            for d in plan.decisions
        ],
    }


def _summary(result: QuantizeResult, seconds: float) -> None:
    m = result.manifest
    s, t = m.sizes, m.tensors
    for note in result.notes:
        console.print(f"[yellow]note:[/] {markup_safe(note)}")
    console.print(f"[bold green]wrote[/] {markup_safe(result.output)}")
    console.print(
        f"  tensors   {t.quantize} quantized, {t.keep} kept, {t.decode} FP8 decoded to BF16, {t.drop} scales consumed"
    )
    console.print(
        f"  size      {_mib(s.bytes_before)} -> {_mib(s.bytes_after)} "
        f"(saved {s.gib_saved:.3f} GiB); "
        f"bits/param {s.bits_per_parameter_before:.2f} -> {s.bits_per_parameter_after:.2f}"
    )
    console.print(f"  ignore    {markup_safe(', '.join(m.recipe.ignore) or '(none)')}")
    if m.pre_pass is not None:
        console.print(
            f"  pre-pass  {m.pre_pass.name}: weights balanced, column scales folded into {len(m.pre_pass.changed)} "
            "norms and biases and the v/up_proj rows (same function; --pre-pass none keeps the source's)"
        )
    elif result.pre_pass_skipped is not None:
        console.print(f"  pre-pass  none: {markup_safe(result.pre_pass_skipped)}")
    if m.calibration is not None:
        cal = m.calibration
        console.print(
            f"  measured  scales from {cal.tokens:,} calibration tokens of {markup_safe(cal.text)} "
            f"({cal.activations} activations)"
        )
    console.print("  verified  headers re-read strictly, file sizes exact, index resolves both ways")
    for rel, why in result.skipped_files.items():
        console.print(f"  [yellow]skipped[/]   {markup_safe(rel)}: {markup_safe(why)} (not copied)")
    rate = s.bytes_before / seconds / 2**20 if seconds > 0 else 0.0
    console.print(f"  time      {seconds:.2f} s ({rate:,.0f} MiB/s of input)")


def _breakdown_tables(plan: Plan) -> list[Table]:
    """Predicted bytes and bits per parameter by rule and by category (the dry run's summary)."""
    tables = []
    for kind, rows in plan.breakdown().items():
        table = Table(title=f"predicted by {kind}")
        for col in (kind, "tensors", "params", "bytes in", "bytes out", "bits/param"):
            table.add_column(col, justify="left" if col == kind else "right")
        for key, row in rows.items():
            bits = f"{row['bytes_out'] * 8 / row['params']:.3f}" if row["params"] else "-"
            table.add_row(
                markup_safe(key),
                f"{row['tensors']:,}",
                f"{row['params']:,}",
                _mib(row["bytes_in"]),
                _mib(row["bytes_out"]),
                bits,
            )
        tables.append(table)
    return tables


def compile_notice(scheme: Scheme, dtype: np.dtype) -> None:
    """Say, before numba compiles kernels that are not in its cache yet, which and for about how long.

    The pipeline calls it at most once per scheme and dtype, and only for a compile: a run whose
    kernels are cached says nothing. Without it a first run is slower than later ones for no stated
    reason (it compiles only what it uses, once; `python -m weightsmith.quantize.warm` compiles everything).
    """
    search = f" ({scheme.scale_search} search)" if scheme.scale_search else ""
    err.print(
        f"compiling the {scheme.name}{search} kernels for {dtype.name} weights once, about "
        f"{scheme.COMPILE_SECONDS} s; later runs load them from numba's cache",
        soft_wrap=True,
    )


@paused_gc()  # the run loads numba's kernels: long-lived objects; reference counting frees the rest
def run_quantize(
    src: Path,
    out: Path,
    *,
    scheme: str | None,
    group_size: int | None,
    ignore: list[str],
    preset: str | None,
    workers: int,
    force: bool,
    show_progress: bool,
    hash_sources: bool = True,
    scale_search: str | None = None,
    recipe: Path | Recipe | None = None,
    calibration: Path | None = None,
    kv_cache: str | None = None,
    gptq: GptqOptions | None = None,
    pre_pass: str | None = None,
    world: distributed.World = distributed.World(),
) -> tuple[QuantizeResult | None, float]:
    """Open, plan and execute; returns the result (None on a rank other than 0 of a `world`) and wall
    seconds. `recipe` a file, or the rules `request.resolve` gave (then `scheme`, `group_size` and
    `scale_search` are None)."""
    started = time.perf_counter()
    plan = open_plan(
        src,
        rules_for(scheme, group_size, scale_search, recipe, gptq=gptq is not None),
        ignore=ignore,
        preset=preset,
        calibration=calibration,
        kv_cache=kv_cache,
        pre_pass=pre_pass,
    )
    if world.leader:
        _warn_plan(plan)
    with terminate_as_interrupt():  # the partial output is removed either way
        try:
            if gptq is not None or not show_progress or world.size > 1:
                layers = (lambda line: err.print(f"gptq: {markup_safe(line)}", end="\r")) if err.is_terminal else None
                result = write(
                    plan,
                    out,
                    gptq,
                    workers=workers,
                    force=force,
                    hash_sources=hash_sources,
                    gptq_progress=layers,
                    warn=_warn,
                    on_compile=compile_notice,
                    world=world,
                )
                return result, time.perf_counter() - started
            # imported here: a run without a bar (--json, no terminal) starts without them
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            columns = (
                TextColumn("quantizing"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
            )
            with Progress(*columns, console=err, transient=True) as bar:
                task = bar.add_task("quantize", total=work_bytes(plan))
                result = write(
                    plan,
                    out,
                    None,
                    workers=workers,
                    force=force,
                    hash_sources=hash_sources,
                    progress=lambda n: bar.advance(task, n),
                    on_compile=compile_notice,
                )
            return result, time.perf_counter() - started
        except KeyboardInterrupt:
            err.print(
                f"[bold red]interrupted[/]: {markup_safe(out)} was not written and no partial output was left behind"
            )
            raise typer.Exit(130) from None


def _gptq_json(opts: GptqOptions) -> dict[str, object]:
    """What `--method gptq` would run, for `--dry-run --json`."""
    return {
        "name": "gptq",
        "text": opts.calibration_source()[0],
        "tokens_at_most": opts.tokens,
        "seq_len": opts.seq_len,
        "actorder": opts.actorder,
        "dampening": opts.dampening,
    }


def _gptq_line(opts: GptqOptions) -> str:
    """What `--method gptq` would run, for `--dry-run`: the quantized Linears' values chosen by GPTQ."""
    text = opts.calibration_source()[1]
    return (
        f"method: gptq on at most {opts.tokens:,} tokens of {text} in sequences of {opts.seq_len}, one decoder "
        f"layer at a time (actorder {opts.actorder}, dampening {opts.dampening} of each Hessian's mean diagonal); "
        "the grid and the files are the plan's, only the integer values differ"
    )


def _warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {markup_safe(message)}", soft_wrap=True)


def _default_searches() -> str:
    """The schemes' default searches in the help's words, e.g. `wmse for w4a16, w4a16-asym`."""
    by_search: dict[str, list[str]] = {}
    for name, cls in REGISTRY.items():
        if cls.DEFAULT_SEARCH is not None:
            by_search.setdefault(cls.DEFAULT_SEARCH, []).append(name)
    return "; ".join(f"{search} for {', '.join(names)}" for search, names in by_search.items())


def quantize(
    src: Path = typer.Argument(
        ..., help="Checkpoint folder: config.json plus model.safetensors or shards with an index."
    ),
    out: Path = typer.Argument(..., help="Output folder (must not exist unless --force)."),
    scheme: str | None = typer.Option(None, help=f"One of: {', '.join(SCHEME_NAMES)} (default {DEFAULT_SCHEME})."),
    recipe: Path | None = typer.Option(
        None,
        "--recipe",
        help="TOML file of ordered rules (targets -> scheme), several schemes in one checkpoint; see the README.",
    ),
    group_size: int | None = typer.Option(
        None,
        "--group-size",
        min=1,
        max=MAX_GROUP_SIZE,
        help="Input columns per scale (default 128; nvfp4a16 is fixed at 16).",
    ),
    scale_search: str | None = typer.Option(
        None,
        "--scale-search",
        help="How each group's scale is chosen: none (plain RTN, byte-identical to llm-compressor model_free_ptq), "
        "wmse (clipping or widening by magnitude-weighted error: lower KL than RTN on two real models, "
        "docs/scale-search-study.md), mse (the same, unweighted), noclip (symmetric: largest weight on the grid's "
        "end), memoryless_mse (llm-compressor's symmetric observer, exactly), hqq (half-quadratic quantization: "
        "each group's integer zero point and scale for the lowest lp error) or qkx2 (llama.cpp's k-quant "
        f"weighted scale and offset search, integer zero points). Default: {_default_searches()}; "
        "none for the other schemes.",
    ),
    ignore: list[str] = typer.Option(
        [], "--ignore", help="Module to keep unquantized: exact name or re:REGEX (vLLM matching). Repeatable."
    ),
    preset: str | None = typer.Option(None, help=f"Known case: {', '.join(PRESETS)}."),
    calibration: Path | None = typer.Option(
        None,
        "--calibration",
        help="Statistics file of `weightsmith calibrate` on SRC: needed by nvfp4 and fp8 (static activation "
        "scales) and by --kv-cache.",
    ),
    kv_cache: str | None = typer.Option(
        None, "--kv-cache", help="Declare an FP8 KV cache with k_scale/v_scale measured on --calibration: fp8."
    ),
    pre_pass: str = typer.Option(
        AUTO,
        "--pre-pass",
        help="sinq: balance each weight's columns first (SINQ's Sinkhorn column scales, found from the weights "
        "alone) and fold the scales into the norms and the v/up_proj rows, so the model computes the same "
        "function and the checkpoint keeps the usual format. Llama, Mistral and Qwen2 under w4a16[-asym], "
        "--method rtn only. auto (the default): sinq where it applies, unless --scale-search none or "
        "--kv-cache is given; the summary says which. none: the weights as the source stores them.",
    ),
    method: str = typer.Option(
        "rtn",
        "--method",
        help="rtn (round-to-nearest, data-free) or gptq (GPTQ on calibration text, one decoder layer at a time).",
    ),
    text: Path | None = typer.Option(None, "--text", help=f"--method gptq: UTF-8 calibration text ({TEXT_HELP})."),
    builtin: str | None = typer.Option(
        None, "--builtin", help="--method gptq: built-in calibration text, code or prose (default code)."
    ),
    tokens: int = typer.Option(
        GPTQ_TOKENS,
        "--tokens",
        parser=tokens_option(),
        help=f"--method gptq: calibration tokens, at most (at most {MAX_TOKENS:,}).",
    ),
    seq_len: int = typer.Option(
        GPTQ_SEQ_LEN, "--seq-len", min=1, max=MAX_TOKENS, help="--method gptq: tokens per sequence."
    ),
    dampening: float = typer.Option(
        GPTQ_DAMPENING,
        "--dampening",
        help="--method gptq: fraction of the Hessian's mean diagonal added to its diagonal, "
        f"0 to under 1 (llm-compressor's: {LLM_COMPRESSOR_DAMPENING}).",
    ),
    actorder: str = typer.Option(
        "static",
        "--actorder",
        help="--method gptq: static (columns in order of decreasing Hessian diagonal, each on its own group's "
        "grid; llm-compressor's default, same stored format) or none (columns in stored order).",
    ),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="--method gptq: run the checkpoint's own model code."
    ),
    workers: int = typer.Option(0, min=0, max=MAX_WORKERS, help="Worker threads (0: one per core)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the predicted size; write nothing."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
    force: bool = typer.Option(False, help="Replace an existing output folder."),
    no_hash: bool = typer.Option(False, "--no-hash", help="Skip sha256 of the source shards in the manifest."),
    processes: int = typer.Option(
        1,
        "--processes",
        min=1,
        max=1024,
        help="--method gptq: run as this many ranks on this machine, each on its turns of the calibration "
        "batches and its share of the solves (under torchrun: leave out).",
    ),
    peer_timeout: float = typer.Option(
        distributed.DEFAULT_TIMEOUT,
        "--peer-timeout",
        min=1,
        max=7 * 24 * 3600,
        help="--method gptq across ranks: seconds a rank waits for the others before the run ends.",
    ),
) -> None:
    """Quantize a checkpoint to a compressed-tensors checkpoint that vLLM loads (one scheme, or a recipe of several)."""
    rules, gptq = resolve(
        scheme=scheme,
        group_size=group_size,
        scale_search=scale_search,
        recipe=recipe,
        method=method,
        text=text,
        builtin=builtin,
        tokens=tokens,
        seq_len=seq_len,
        dampening=dampening,
        actorder=actorder,
        trust_remote_code=trust_remote_code,
    )
    pre_pass_choice = pre_pass_option(pre_pass, gptq=gptq is not None)
    if dry_run:
        plan = open_plan(
            src, rules, ignore=ignore, preset=preset, calibration=calibration, kv_cache=kv_cache,
            pre_pass=pre_pass_choice,
        )  # fmt: skip
        _warn_plan(plan)
        if json_out:
            print(json.dumps(plan_json(plan) | ({"method": _gptq_json(gptq)} if gptq else {}), indent=2))
        else:
            console.print(plan_table(plan))
            for table in _breakdown_tables(plan):
                console.print(table)
            console.print(
                f"predicted: {_mib(plan.bytes_in)} -> {_mib(plan.bytes_out)}; "
                f"{plan.count('quantize')} quantized, {plan.count('keep')} kept; "
                f"ignore: {markup_safe(', '.join(plan.ignore) or '(none)')}"
            )
            if plan.pre_pass is not None:
                console.print(f"pre-pass: {plan.pre_pass}, folding into {len(plan.changed)} norms and biases")
            elif plan.pre_pass_skipped is not None:
                console.print(f"pre-pass: none ({markup_safe(plan.pre_pass_skipped)})")
            if gptq is not None:
                console.print(markup_safe(_gptq_line(gptq)), soft_wrap=True)
        return
    if launch.launching(processes):
        if gptq is None:
            raise WeightsmithError("--processes: only --method gptq runs across ranks", code="usage")
        check_destination(src, out, force)  # here, once, rather than as the same error from every rank
        launch.relay(processes)
        return
    with distributed.joined(peer_timeout, processes, launch.job("quantize", src, out)) as world:
        result, seconds = run_quantize(
            src,
            out,
            scheme=None,
            group_size=None,
            ignore=ignore,
            preset=preset,
            workers=workers or distributed.cores_per_rank(world) or default_workers(),
            force=force,
            show_progress=not json_out and err.is_terminal,
            hash_sources=not no_hash,
            recipe=rules,
            calibration=calibration,
            kv_cache=kv_cache,
            gptq=gptq,
            pre_pass=pre_pass_choice,
            world=world,
        )
    if result is None:
        return
    if json_out:
        print(
            json.dumps(
                {
                    "output": str(result.output),
                    "seconds": round(seconds, 3),
                    "time_split": result.timing.to_json(),
                    "engine_split": {phase: round(t, 3) for phase, t in result.engine.items()},
                    "notes": result.notes,
                    "pre_pass_skipped": result.pre_pass_skipped,
                    "manifest": result.manifest.to_json(),
                },
                indent=2,
            )
        )
    else:
        _summary(result, seconds)


#: What `write_demo_checkpoint` writes into the demo's draft folder, and nothing else.
_DEMO_DRAFT_FILES = ("config.json", "model.safetensors")


def _check_demo_folder(folder: Path) -> None:
    """Refuse a `--dir` whose contents the demo would replace but did not provably write.

    The demo replaces its draft folder and its quantized copy. The draft is replaced only when it is
    a real folder (not a link) holding the demo's two files and nothing else, its config.json the
    demo's own; the quantized copy only as `quantize --force` replaces any output (its manifest
    accounts for everything in it). A file or marker in `--dir` proves nothing.
    """
    if not os.path.lexists(folder):
        return
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise WeightsmithError("is not a folder; choose another --dir", file=folder, code="usage")
    draft = folder / "draft-bf16"
    if not os.path.lexists(draft):
        return
    try:
        ours = (
            stat.S_ISDIR(os.lstat(draft).st_mode)
            and sorted(os.listdir(draft)) == sorted(_DEMO_DRAFT_FILES)
            and all(stat.S_ISREG(os.lstat(draft / name).st_mode) for name in _DEMO_DRAFT_FILES)
            and json.loads(read_regular(draft / "config.json", 1 << 20)) == DEMO_CONFIG
        )
    except (OSError, ValueError, RecursionError):
        ours = False
    if not ours:
        raise WeightsmithError(
            "holds files the demo did not write (it holds only config.json and model.safetensors, not a link); "
            "choose another --dir",
            file=draft,
            code="usage",
        )


def demo(
    folder: Path = typer.Option(
        Path("weightsmith-demo"), "--dir", help="Where the demo draft and its quantized copy go."
    ),
    workers: int = typer.Option(0, min=0, max=MAX_WORKERS, help="Worker threads (0: one per core)."),
) -> None:
    """Make a DFlash-like draft, quantize it with the dflash-draft preset, verify it, print sizes."""
    from weightsmith.audit.verify import verify  # here: `quantize` starts without the audit modules

    src, out = folder / "draft-bf16", folder / "draft-w4a16"
    _check_demo_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        console.print(f"[bold]1. generating[/] a DFlash-like BF16 draft in {markup_safe(src)}")
        write_demo_checkpoint(Path(tmp) / "draft")
        if os.path.lexists(src):  # the demo's own draft (`_check_demo_folder`): its two files
            for name in _DEMO_DRAFT_FILES:
                os.unlink(src / name)
            os.rmdir(src)
        (Path(tmp) / "draft").rename(src)
    console.print("[bold]2. plan[/] with preset dflash-draft:")
    plan = open_plan(src, rules_for("w4a16", None, None, None), preset="dflash-draft")
    kept: dict[str, list[str]] = {}
    for d in plan.decisions:
        if d.action != "quantize" and len(d.shape) == 2:
            kept.setdefault(d.reason, []).append(d.name)
    for reason, tensors in kept.items():
        leaves = ", ".join(sorted({t.split(".")[-2] for t in tensors}))
        console.print(f"   keep {len(tensors)} weights ({leaves}): {reason}")
    console.print(f"   {plan.count('quantize')} Linear weights to quantize, {plan.count('keep')} tensors kept")
    console.print(f"[bold]3. quantizing[/] to {markup_safe(out)}")
    result, seconds = run_quantize(
        src,
        out,
        scheme="w4a16",
        group_size=128,
        ignore=[],
        preset="dflash-draft",
        workers=workers or default_workers(),
        force=True,
        show_progress=err.is_terminal,
    )
    assert result is not None, "one process is its own rank 0"
    _summary(result, seconds)
    console.print(
        f"[bold]4. verify[/] (the checks `weightsmith verify` runs, values scanned too) on {markup_safe(out)}"
    )
    report = verify(out, scan=True)
    for check in report.checks:
        status = "FAIL" if check.errors else "ok  " if check.ran else "skip"
        console.print(f"   {status} {markup_safe(check.title)}")
    console.print(f"   {markup_safe(report.summary)}")
    if not report.clean:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `quantize` and `demo` to `app`."""
    app.command()(quantize)
    app.command()(demo)
