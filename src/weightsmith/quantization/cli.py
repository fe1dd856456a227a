"""`weightsmith quantize` and `weightsmith demo`."""

from __future__ import annotations

import inspect
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from weightsmith.cli import paused_gc
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import markup_safe
from weightsmith.engine import distributed
from weightsmith.io.texts import MAX_TOKENS, TEXT_HELP, tokens_option
from weightsmith.quantization.budget.candidates import CPU_SERVED, FAMILIES
from weightsmith.quantization.budget.plan import MAX_BITS, MIN_BITS, BudgetOptions
from weightsmith.quantization.prepasses import PRE_PASSES
from weightsmith.quantization.presets import PRESETS
from weightsmith.quantization.recipe import GPTQ_DAMPENING, LLM_COMPRESSOR_DAMPENING, MAX_GROUP_SIZE
from weightsmith.quantization.request import (
    AUTO,
    DEFAULT_SCHEME,
    GPTQ_SEQ_LEN,
    GPTQ_TOKENS,
    MAX_WORKERS,
    GptqOptions,
    QuantizeRequest,
)
from weightsmith.schemes import REGISTRY, SCHEME_NAMES
from weightsmith.searches import SEARCHES

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quantization.pipeline import QuantizeResult
    from weightsmith.quantization.plan import Plan
    from weightsmith.schemes import Scheme

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def plan_table(plan: Plan) -> Table:
    from weightsmith.io.provenance import EVERY_TOKEN, ROUTED

    experts_caption = {  # `Provenance.experts` in the caption
        ROUTED: "; routed experts over the tokens routed to them",
        EVERY_TOKEN: "; routed experts over every token",
    }
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
            f"({prov.activations} activations{experts_caption.get(prov.experts or '', '')})"
        )
    for shard, specs in plan.added.items():
        for spec in specs:
            why = markup_safe(f"{plan.kv_cache} KV-cache scale measured in {stats}, written to {shard}")
            table.add_row(markup_safe(spec.name), spec.dtype, "x".join(map(str, spec.shape)), "add", why)
    return table


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "source": str(plan.source.root),
        "hub": None if plan.hub is None else asdict(plan.hub) | {"path": str(plan.hub.path)},
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
        "budget": None if plan.request is None or plan.request.budget is None else plan.request.budget.to_json(),
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
        done = PRE_PASSES[m.pre_pass.name].SUMMARY.format(changed=len(m.pre_pass.changed))
        console.print(f"  pre-pass  {m.pre_pass.name}: {done}")
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
    reason (it compiles only what it uses, once; `python -m weightsmith.quantization.warm` compiles everything).
    """
    search = f" ({scheme.scale_search} search)" if scheme.scale_search else ""
    err.print(
        f"compiling the {scheme.name}{search} kernels for {dtype.name} weights once, about "
        f"{scheme.COMPILE_SECONDS} s; later runs load them from numba's cache",
        soft_wrap=True,
    )


@paused_gc()  # the run loads numba's kernels: long-lived objects; reference counting frees the rest
def _write(plan: Plan, *, show_progress: bool, world: distributed.World = distributed.World()) -> QuantizeResult | None:
    """`library.write` with the command's progress: a bar over the input bytes for a data-free run on a
    terminal, a line per decoder layer for GPTQ; an interrupt leaves nothing behind and says so."""
    from weightsmith.core.interrupt import terminate_as_interrupt
    from weightsmith.quantization.library import Hooks, write
    from weightsmith.quantization.pipeline import work_bytes

    out = plan.request.output if plan.request is not None else None
    layers = (lambda line: err.print(f"gptq: {markup_safe(line)}", end="\r")) if err.is_terminal else None
    hooks = Hooks(layer=layers, warn=_warn, compiling=compile_notice)
    with terminate_as_interrupt():  # the partial output is removed either way
        try:
            if plan.request is None or plan.request.gptq is not None or not show_progress or world.size > 1:
                return write(plan, hooks, world)
            # imported here: a run without a bar (--json, no terminal) starts without them
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            columns = (TextColumn("quantizing"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                       TimeRemainingColumn())  # fmt: skip
            with Progress(*columns, console=err, transient=True) as bar:
                task = bar.add_task("quantize", total=work_bytes(plan))
                return write(plan, replace(hooks, progress=lambda n: bar.advance(task, n)), world)
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
        "all_experts": opts.all_experts,
    }


def _gptq_line(opts: GptqOptions) -> str:
    """What `--method gptq` would run, for `--dry-run`: the quantized Linears' values chosen by GPTQ."""
    text = opts.calibration_source()[1]
    return (
        f"method: gptq on at most {opts.tokens:,} tokens of {text} in sequences of {opts.seq_len}, one decoder "
        f"layer at a time (actorder {opts.actorder}, dampening {opts.dampening} of each Hessian's mean diagonal"
        f"{'; every token through every MoE expert' if opts.all_experts else ''}); "
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


def _search_help() -> str:
    """`--scale-search`'s help, from the registered searches' own words."""
    searches = ", ".join(f"{name} ({search.HELP})" for name, search in SEARCHES.items())
    return (
        "How each group's scale is chosen: none (plain RTN, byte-identical to llm-compressor model_free_ptq), "
        f"{searches}. Default: {_default_searches()}; none for the other schemes."
    )


def _pre_pass_help() -> str:
    """`--pre-pass`'s help, from the registered pre-passes' own words."""
    passes = " ".join(f"{name}: {p.HELP}." for name, p in PRE_PASSES.items())
    auto = ", ".join(name for name, p in PRE_PASSES.items() if p.AUTO)
    return (
        f"{passes} auto (the default): {auto} where it applies, unless --scale-search none or --kv-cache is "
        "given; the summary says which. none: the weights as the source stores them."
    )


def _family_words() -> str:
    """`--family`'s help: each family with its candidates' labels."""
    return "; ".join(f"{name}: {', '.join(c.label for c in cands)}" for name, cands in FAMILIES.items()) + "."


#: The command's arguments and options, in help order: parameter name -> (type, typer's declaration).
#: The names are `QuantizeRequest`'s and `GptqOptions`' fields where they are one of them (`src`, `out`
#: and `no_hash` are mapped in `_request`), so the command holds no argument list of its own.
_OPTIONS: dict[str, tuple[Any, Any]] = {
    "src": (str, typer.Argument(
        ..., help="Checkpoint folder (config.json plus model.safetensors or shards with an index), "
        "or a Hub id org/name, or org/name@revision, from the local Hub cache (downloaded when the network allows).",
    )),
    "out": (Path, typer.Argument(..., help="Output folder (must not exist unless --force).")),
    "scheme": (str | None, typer.Option(
        None, help=f"One of: {', '.join(SCHEME_NAMES)} (default {DEFAULT_SCHEME})."
    )),
    "recipe": (Path | None, typer.Option(
        None, "--recipe",
        help="TOML file of ordered rules (targets -> scheme), several schemes in one checkpoint; see the README.",
    )),
    "group_size": (int | None, typer.Option(
        None, "--group-size", min=1, max=MAX_GROUP_SIZE,
        help="Input columns per scale (default 128; nvfp4a16 is fixed at 16).",
    )),
    "scale_search": (str | None, typer.Option(None, "--scale-search", help=_search_help())),
    "ignore": (list[str], typer.Option(
        [], "--ignore", help="Module to keep unquantized: exact name or re:REGEX (vLLM matching). Repeatable."
    )),
    "preset": (str | None, typer.Option(None, help=f"Known case: {', '.join(PRESETS)}.")),
    "calibration": (Path | None, typer.Option(
        None, "--calibration",
        help="Statistics file of `weightsmith calibrate` on SRC: needed by nvfp4 and fp8 (static activation "
        "scales) and by --kv-cache.",
    )),
    "kv_cache": (str | None, typer.Option(
        None, "--kv-cache", help="Declare an FP8 KV cache with k_scale/v_scale measured on --calibration: fp8."
    )),
    "pre_pass": (str, typer.Option(AUTO, "--pre-pass", help=_pre_pass_help())),
    "method": (str, typer.Option(
        "rtn", "--method",
        help="rtn (round-to-nearest, data-free) or gptq (GPTQ on calibration text, one decoder layer at a time).",
    )),
    "text": (Path | None, typer.Option(
        None, "--text", help=f"--method gptq and --avg-bits: UTF-8 calibration text ({TEXT_HELP})."
    )),
    "builtin": (str | None, typer.Option(
        None, "--builtin", help="--method gptq and --avg-bits: built-in calibration text, code or prose (default code)."
    )),
    "tokens": (int, typer.Option(
        GPTQ_TOKENS, "--tokens", parser=tokens_option(),
        help=f"--method gptq and --avg-bits: calibration tokens, at most (at most {MAX_TOKENS:,}).",
    )),
    "seq_len": (int, typer.Option(
        GPTQ_SEQ_LEN, "--seq-len", min=1, max=MAX_TOKENS, help="--method gptq and --avg-bits: tokens per sequence."
    )),
    "dampening": (float, typer.Option(
        GPTQ_DAMPENING, "--dampening",
        help="--method gptq: fraction of the Hessian's mean diagonal added to its diagonal, "
        f"0 to under 1 (llm-compressor's: {LLM_COMPRESSOR_DAMPENING}).",
    )),
    "actorder": (str, typer.Option(
        "static", "--actorder",
        help="--method gptq: static (columns in order of decreasing Hessian diagonal, each on its own group's "
        "grid; llm-compressor's default, same stored format) or none (columns in stored order).",
    )),
    "all_experts": (bool, typer.Option(
        False, "--all-experts",
        help="--method gptq on an MoE: each expert's Hessian from every calibration token, not only those "
        "routed to it (the outputs stay routed as the model routes); for experts that see too few tokens.",
    )),
    "trust_remote_code": (bool, typer.Option(
        False, "--trust-remote-code", help="--method gptq: run the checkpoint's own model code."
    )),
    "avg_bits": (float | None, typer.Option(
        None, "--avg-bits", min=MIN_BITS, max=MAX_BITS,
        help="Choose each module's scheme from --family's candidates to spend at most this many bits per weight "
        "(scales and zero points included, as inspect's bits_with_overhead over the Linears) where --measure "
        "says they lower the model's error most; --dry-run shows the choice.",
    )),
    "family": (str, typer.Option(
        "int4", "--family",
        help="--avg-bits: the candidates; " + _family_words(),
    )),
    "candidates": (str | None, typer.Option(
        None, "--candidates",
        help="--avg-bits: only these of the family's candidates, comma-separated "
        f"(vLLM CPU serves {','.join(CPU_SERVED)}).",
    )),
    "measure": (str, typer.Option(
        "fisher", "--measure",
        help="--avg-bits: what the choice minimises: fisher (the KL each module's error adds, from the model's "
        "Fisher on --text), activation (its output error on --text) or weight (data-free squared error).",
    )),
    "sensitivity": (Path | None, typer.Option(
        None, "--sensitivity",
        help="--avg-bits: a sensitivity.json `weightsmith sensitivity --out` measured on SRC (else measured now).",
    )),
    "workers": (int, typer.Option(0, min=0, max=MAX_WORKERS, help="Worker threads (0: one per core).")),
    "dry_run": (bool, typer.Option(False, "--dry-run", help="Print the plan and the predicted size; write nothing.")),
    "json_out": (bool, typer.Option(False, "--json", help="Machine-readable output on stdout.")),
    "force": (bool, typer.Option(False, help="Replace an existing output folder.")),
    "no_hash": (bool, typer.Option(False, "--no-hash", help="Skip sha256 of the source shards in the manifest.")),
    "processes": (int, typer.Option(
        1, "--processes", min=1, max=1024,
        help="--method gptq: run as this many ranks on this machine, each on its turns of the calibration "
        "batches and its share of the solves (under torchrun: leave out).",
    )),
    "peer_timeout": (float, typer.Option(
        distributed.DEFAULT_TIMEOUT, "--peer-timeout", min=1, max=7 * 24 * 3600,
        help="--method gptq across ranks: seconds a rank waits for the others before the run ends.",
    )),
}  # fmt: skip


def _request(options: dict[str, Any]) -> QuantizeRequest:
    """The request the command line's options make (the same object `weightsmith.quantize` takes)."""
    asked = {f.name: options[f.name] for f in fields(QuantizeRequest) if f.name in options and f.name != "workers"}
    only = options["candidates"]
    budget = BudgetOptions(
        options["family"],
        None if only is None else tuple(c.strip() for c in only.split(",") if c.strip()),
        options["measure"],
        options["sensitivity"],
    )
    return QuantizeRequest(
        **asked,
        budget=budget,
        source=options["src"],
        output=options["out"],
        gptq=GptqOptions(**{f.name: options[f.name] for f in fields(GptqOptions)}),
        workers=options["workers"] or None,
        hash_sources=not options["no_hash"],
    )


def _with_options(command: Callable[..., None]) -> Callable[..., None]:
    """`command(**options)` given the signature typer reads its arguments and options from (`_OPTIONS`)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, keyword, default=declared, annotation=tp) for name, (tp, declared) in _OPTIONS.items()]
    )
    command.__annotations__ = {name: tp for name, (tp, _) in _OPTIONS.items()}
    return command


@_with_options
def quantize(**options: Any) -> None:
    """Quantize a checkpoint to a compressed-tensors checkpoint that vLLM loads (one scheme, or a recipe of several)."""
    # imported here: `quantize --help` starts without the flow's modules
    from weightsmith.engine import launch
    from weightsmith.io.hub import resolve_source
    from weightsmith.io.outputdir import check_destination
    from weightsmith.quantization import library
    from weightsmith.quantization.budget.choose import budget_line
    from weightsmith.quantization.library import Hooks
    from weightsmith.quantization.request import resolve

    request = _request(options)
    if options["dry_run"]:
        _dry_run(library.plan(request, Hooks(warn=_warn, downloads=err.is_terminal)), options["json_out"])
        return
    processes = options["processes"]
    if launch.launching(processes):
        resolved = resolve(request)  # refused here, once, rather than as the same error from every rank
        if resolved.gptq is None:
            raise WeightsmithError("--processes: only --method gptq runs across ranks", code="usage")
        source, _ = resolve_source(request.source, progress=err.is_terminal)  # downloaded once, here
        check_destination(source, resolved.output, request.force)
        launch.relay(processes)
        return
    job = launch.job("quantize", Path(request.source), Path(options["out"]))
    with distributed.joined(options["peer_timeout"], processes, job) as world:
        started = time.perf_counter()
        request = replace(request, workers=request.workers or distributed.cores_per_rank(world) or None)
        plan = library.plan(request, Hooks(warn=_warn if world.leader else None, downloads=err.is_terminal))
        result = _write(plan, show_progress=not options["json_out"] and err.is_terminal, world=world)
        seconds = time.perf_counter() - started
    if result is None:
        return
    if options["json_out"]:
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
                    "budget": None
                    if plan.request is None or plan.request.budget is None
                    else plan.request.budget.to_json(),
                },
                indent=2,
            )
        )
    else:
        _summary(result, seconds)
        if plan.request is not None and plan.request.budget is not None:
            console.print(f"  {markup_safe(budget_line(plan.request.budget))}")


def _dry_run(plan: Plan, json_out: bool) -> None:
    """`--dry-run`: the plan, the predicted sizes and what the method would run; nothing is written."""
    from weightsmith.quantization.budget.choose import budget_line

    assert plan.request is not None, "a plan made for a request"
    gptq = plan.request.gptq
    if json_out:
        print(json.dumps(plan_json(plan) | ({"method": _gptq_json(gptq)} if gptq else {}), indent=2))
        return
    console.print(plan_table(plan))
    for table in _breakdown_tables(plan):
        console.print(table)
    console.print(
        f"predicted: {_mib(plan.bytes_in)} -> {_mib(plan.bytes_out)}; "
        f"{plan.count('quantize')} quantized, {plan.count('keep')} kept; "
        f"ignore: {markup_safe(', '.join(plan.ignore) or '(none)')}"
    )
    if plan.request.budget is not None:
        console.print(markup_safe(budget_line(plan.request.budget)))
    if plan.pre_pass is not None:
        console.print(f"pre-pass: {plan.pre_pass}, folding into {len(plan.changed)} norms and biases")
    elif plan.pre_pass_skipped is not None:
        console.print(f"pre-pass: none ({markup_safe(plan.pre_pass_skipped)})")
    if gptq is not None:
        console.print(markup_safe(_gptq_line(gptq)), soft_wrap=True)


#: What `write_demo_checkpoint` writes into the demo's draft folder, and nothing else.
_DEMO_DRAFT_FILES = ("config.json", "model.safetensors")


def _check_demo_folder(folder: Path) -> None:
    """Refuse a `--dir` whose contents the demo would replace but did not provably write.

    The demo replaces its draft folder and its quantized copy. The draft is replaced only when it is
    a real folder (not a link) holding the demo's two files and nothing else, its config.json the
    demo's own; the quantized copy only as `quantize --force` replaces any output (its manifest
    accounts for everything in it). A file or marker in `--dir` proves nothing.
    """
    from weightsmith.core.files import read_regular
    from weightsmith.quantization.demo import DEMO_CONFIG

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
    from weightsmith.quantization import library
    from weightsmith.quantization.demo import write_demo_checkpoint
    from weightsmith.quantization.library import Hooks

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
    request = QuantizeRequest(src, out, scheme="w4a16", preset="dflash-draft", workers=workers or None, force=True)
    started = time.perf_counter()
    plan = library.plan(request, Hooks(warn=_warn))
    kept: dict[str, list[str]] = {}
    for d in plan.decisions:
        if d.action != "quantize" and len(d.shape) == 2:
            kept.setdefault(d.reason, []).append(d.name)
    for reason, tensors in kept.items():
        leaves = ", ".join(sorted({t.split(".")[-2] for t in tensors}))
        console.print(f"   keep {len(tensors)} weights ({leaves}): {reason}")
    console.print(f"   {plan.count('quantize')} Linear weights to quantize, {plan.count('keep')} tensors kept")
    console.print(f"[bold]3. quantizing[/] to {markup_safe(out)}")
    result = _write(plan, show_progress=err.is_terminal)
    assert result is not None, "one process is its own rank 0"
    _summary(result, time.perf_counter() - started)
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
