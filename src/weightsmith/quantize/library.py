"""`weightsmith.quantize(SRC, OUT, ...)` and `weightsmith.plan_quantize(SRC, ...)`: the quantize flow as a library call.

The command (`quantize.cli`) and these functions check the request with the same function
(`quantize.request.resolve`), so they refuse the same contradictions with the same line, and run the
same code: the plan, then the data-free pipeline or the GPTQ run. Nothing here prints: warnings go to
`warn`, else to Python's `warnings`. `weightsmith.api` lists these beside the other entry points; calling
the package `weightsmith.quantize` calls `quantize` here.
"""

from __future__ import annotations

import os
from pathlib import Path

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import Say, warner
from weightsmith.engine.distributed import World
from weightsmith.quantize.pipeline import (
    MAX_WORKERS,
    CompileNotice,
    Progress,
    QuantizeResult,
    default_workers,
    execute,
)
from weightsmith.quantize.plan import Plan
from weightsmith.quantize.recipe import GPTQ_DAMPENING, Recipe
from weightsmith.quantize.request import (
    AUTO,
    GPTQ_SEQ_LEN,
    GPTQ_TOKENS,
    GptqOptions,
    open_plan,
    plan_warnings,
    pre_pass_option,
    resolve,
)


def plan_quantize(
    src: str | os.PathLike[str],
    scheme: str | None = None,
    *,
    method: str = "rtn",
    recipe: str | os.PathLike[str] | Recipe | None = None,
    group_size: int | None = None,
    scale_search: str | None = None,
    ignore: list[str] | None = None,
    preset: str | None = None,
    calibration: str | os.PathLike[str] | None = None,
    kv_cache: str | None = None,
    pre_pass: str | None = AUTO,
    warn: Say | None = None,
) -> Plan:
    """What `quantize` would do to every tensor of `src`, and the predicted sizes; nothing is written.

    This is `quantize --dry-run`: it refuses what that refuses, so a plan that passes here is one
    `quantize` will carry out. `scheme` defaults to w4a16-asym; a `recipe` (a TOML file or a `Recipe`)
    says every rule's scheme itself, so passing `scheme`, `group_size` or `scale_search` beside it is
    refused rather than silently dropped. `scale_search` None takes the scheme's default (`wmse` for
    w4a16 and w4a16-asym); `"none"` is plain round-to-nearest, byte-identical to llm-compressor's
    `model_free_ptq`. `method="gptq"` refuses the searches GPTQ cannot start from (memoryless_mse).
    `calibration` is a statistics file of `calibrate` measured on `src`: calibrated schemes (nvfp4,
    fp8) and `kv_cache="fp8"` (KV-cache scales) need one. `warn` is told of recipe targets that
    match nothing beside others that do (a recipe none of whose targets matches a Linear-like weight is
    refused) and of a statistics file measured on too few tokens. `pre_pass="sinq"` balances the
    weights before quantizing them (SINQ's column scales folded into the norms and v/up_proj rows; Llama,
    Mistral and Qwen2 under w4a16 or w4a16-asym, data-free only), checked here from the headers;
    `"auto"`, the default, does so wherever that check passes, no `--kv-cache` is asked for and the
    search is not `"none"` (the plan's `pre_pass_skipped` says why not); `"none"` or None never does.
    """
    rules, _ = resolve(scheme=scheme, group_size=group_size, scale_search=scale_search, recipe=recipe, method=method)
    pre_pass = pre_pass_option(pre_pass, gptq=method == "gptq")
    return _plan(src, rules, ignore, preset, calibration, kv_cache, pre_pass, warn)


def _plan(
    src: str | os.PathLike[str],
    rules: Recipe,
    ignore: list[str] | None,
    preset: str | None,
    calibration: str | os.PathLike[str] | None,
    kv_cache: str | None,
    pre_pass: str | None,
    warn: Say | None,
) -> Plan:
    plan = open_plan(
        src, rules, ignore=ignore, preset=preset, calibration=calibration, kv_cache=kv_cache, pre_pass=pre_pass
    )
    say = warner(warn)
    for message in plan_warnings(plan):
        say(message)
    return plan


def quantize(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    scheme: str | None = None,
    *,
    method: str = "rtn",
    recipe: str | os.PathLike[str] | Recipe | None = None,
    group_size: int | None = None,
    scale_search: str | None = None,
    ignore: list[str] | None = None,
    preset: str | None = None,
    calibration: str | os.PathLike[str] | None = None,
    kv_cache: str | None = None,
    pre_pass: str | None = AUTO,
    text: str | os.PathLike[str] | None = None,
    builtin: str | None = None,
    tokens: int = GPTQ_TOKENS,
    seq_len: int = GPTQ_SEQ_LEN,
    dampening: float = GPTQ_DAMPENING,
    actorder: str = "static",
    trust_remote_code: bool = False,
    workers: int | None = None,
    force: bool = False,
    hash_sources: bool = True,
    progress: Progress | None = None,
    gptq_progress: Say | None = None,
    warn: Say | None = None,
) -> QuantizeResult:
    """Quantize the checkpoint folder `src` into `out`: `weightsmith quantize`, byte for byte.

    The scheme arguments and `pre_pass` are `plan_quantize`'s. `method="gptq"` chooses the quantized Linears' integer
    values with GPTQ on calibration text (`text`, a file, or `builtin`, "code" by default), at most
    `tokens` tokens in sequences of `seq_len`, running the model one decoder layer at a time (it needs
    torch and transformers); the grid and the files are the plan's, only the values differ. Its
    `dampening` and `actorder` are the command's `--dampening` and `--actorder`; `text` and `builtin`
    with the data-free "rtn" are refused, as the command refuses them. `workers` None: one per core.
    `progress` gets the input bytes done (the data-free write); `gptq_progress` a line per decoder
    layer; `warn` each warning the command would print.

    Raises a `WeightsmithError` (one line naming the file and tensor) for anything wrong with the
    input or the destination; `KeyboardInterrupt` leaves nothing behind.
    """
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
    if workers is not None and (type(workers) is not int or not 0 <= workers <= MAX_WORKERS):
        raise WeightsmithError(f"--workers {workers!r}: give a whole number from 0 to {MAX_WORKERS}", code="usage")
    pre_pass = pre_pass_option(pre_pass, gptq=gptq is not None)
    the_plan = _plan(src, rules, ignore, preset, calibration, kv_cache, pre_pass, warn)
    result = write(
        the_plan,
        Path(out),
        gptq,
        workers=workers or default_workers(),
        force=force,
        hash_sources=hash_sources,
        progress=progress,
        gptq_progress=gptq_progress,
        warn=warner(warn),
    )
    assert result is not None, "one process is its own rank 0"
    return result


def write(
    plan: Plan,
    out: Path,
    gptq: GptqOptions | None,
    *,
    workers: int,
    force: bool,
    hash_sources: bool,
    progress: Progress | None = None,
    gptq_progress: Say | None = None,
    warn: Say | None = None,
    on_compile: CompileNotice | None = None,
    world: World = World(),
) -> QuantizeResult | None:
    """The plan written to `out`: by the GPTQ run when `gptq` is given, else by the data-free pipeline.

    The one place the command and the library call decide it. `progress` gets the input bytes done
    (the data-free write), `gptq_progress` a line per decoder layer, `warn` the GPTQ run's warnings,
    `on_compile` the notice before a kernel compiles (the data-free write). In a `world` of several
    ranks only GPTQ runs (it has work to share), and only rank 0 returns a result."""
    if gptq is not None:
        pre_pass_option(plan.pre_pass, gptq=True)
        from weightsmith.quantize.gptq import run

        return run(
            plan, out, gptq, workers=workers, force=force, hash_sources=hash_sources, progress=gptq_progress, warn=warn,
            world=world,
        )  # fmt: skip
    if world.size > 1:
        raise WeightsmithError(
            f"{world.size} ranks, but only --method gptq runs across ranks (round-to-nearest has no calibration "
            "run to share): run it as one process",
            code="usage",
        )
    return execute(
        plan, out, workers=workers, force=force, progress=progress, hash_sources=hash_sources, on_compile=on_compile
    )
