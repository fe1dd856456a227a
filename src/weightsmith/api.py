"""The library entry points: everything the command line does, callable from code with typed results.

`quantize` / `plan_quantize`, `calibrate` / `calibrate_kv`, `verify` and `evaluate` (the `eval` command;
named so as not to shadow the builtin). Each runs the same library code its command runs, checks its
arguments with the same functions (the same refusals, in the same one-line `WeightsmithError`), and
returns what the command prints, as objects: nothing here prints. Warnings go to `warn` when given,
else to Python's `warnings` (a `UserWarning`); progress lines to `progress`, when given.

`import weightsmith` does not import this module: `weightsmith.quantize(...)` and the others load it
on first use, so that the command line starts without numpy (see `weightsmith/__init__.py`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.calibration.measure import DEFAULT_SEQ_LEN, DEFAULT_TOKENS
from weightsmith.core.errors import WeightsmithError
from weightsmith.fidelity.logits import DEFAULT_TOKENS as EVAL_TOKENS
from weightsmith.quantize.pipeline import MAX_WORKERS, Progress, QuantizeResult, default_workers, execute
from weightsmith.quantize.plan import Plan
from weightsmith.quantize.recipe import GPTQ_DAMPENING, Recipe
from weightsmith.quantize.request import GPTQ_SEQ_LEN, GPTQ_TOKENS, open_plan, plan_warnings, resolve

if TYPE_CHECKING:  # the results of the commands that need more than the quantize flow, imported when they run
    from weightsmith.audit.verify import VerifyReport
    from weightsmith.calibration.kv import KvCalibration
    from weightsmith.calibration.run import CalibrateResult
    from weightsmith.fidelity.report import EvalReport

__all__ = [
    "calibrate",
    "calibrate_kv",
    "evaluate",
    "plan_quantize",
    "quantize",
    "verify",
]

#: A line for the person running it: a warning, or a progress line (one per decoder layer).
Say = Callable[[str], None]


def _warner(warn: Say | None) -> Say:
    """`warn`, or Python's warnings: a library call must not write to a terminal it does not own."""
    if warn is not None:
        return warn
    return lambda message: warnings.warn(message, UserWarning, stacklevel=4)


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
    warn: Say | None = None,
) -> Plan:
    """What `quantize` would do to every tensor of `src`, and the predicted sizes; nothing is written.

    This is `quantize --dry-run`: it refuses what that refuses, so a plan that passes here is one
    `quantize` will carry out. `scheme` defaults to w4a16; a `recipe` (a TOML file or a `Recipe`)
    says every rule's scheme itself, so passing `scheme`, `group_size` or `scale_search` beside it is
    refused rather than silently dropped. `scale_search` None takes the scheme's default (`wmse` for
    w4a16 and w4a16-asym); `"none"` is plain round-to-nearest, byte-identical to llm-compressor's
    `model_free_ptq`. `method="gptq"` refuses the searches GPTQ cannot start from (memoryless_mse).
    `calibration` is a statistics file of `calibrate` measured on `src`: calibrated schemes (nvfp4,
    fp8) and `kv_cache="fp8"` (KV-cache scales) need one. `warn` is told of recipe targets that
    match nothing and of a statistics file measured on too few tokens.
    """
    rules, _ = resolve(scheme=scheme, group_size=group_size, scale_search=scale_search, recipe=recipe, method=method)
    return _plan(src, rules, ignore, preset, calibration, kv_cache, warn)


def _plan(
    src: str | os.PathLike[str],
    rules: Recipe,
    ignore: list[str] | None,
    preset: str | None,
    calibration: str | os.PathLike[str] | None,
    kv_cache: str | None,
    warn: Say | None,
) -> Plan:
    plan = open_plan(src, rules, ignore=ignore, preset=preset, calibration=calibration, kv_cache=kv_cache)
    say = _warner(warn)
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

    The scheme arguments are `plan_quantize`'s. `method="gptq"` chooses the quantized Linears' integer
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
    the_plan = _plan(src, rules, ignore, preset, calibration, kv_cache, warn)
    if gptq is not None:
        from weightsmith.quantize.gptq import run

        return run(
            the_plan,
            Path(out),
            gptq,
            workers=workers or default_workers(),
            force=force,
            hash_sources=hash_sources,
            progress=gptq_progress,
            warn=_warner(warn),
        )
    return execute(
        the_plan,
        Path(out),
        workers=workers or default_workers(),
        force=force,
        progress=progress,
        hash_sources=hash_sources,
    )


def calibrate(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    text: str | os.PathLike[str] | None = None,
    builtin: str | None = None,
    tokens: int = DEFAULT_TOKENS,
    seq_len: int = DEFAULT_SEQ_LEN,
    force: bool = False,
    trust_remote_code: bool = False,
    progress: Say | None = None,
    warn: Say | None = None,
) -> CalibrateResult:
    """Measure the activation maxima of `src` on calibration text into the statistics file `out`.

    What `weightsmith calibrate SRC --out OUT` writes: the file `quantize(calibration=...)` reads for
    static activation scales (nvfp4, fp8) and KV-cache scales. The run streams the model one decoder
    layer at a time (torch and transformers), so everything that could refuse it (the destination,
    the checkpoint, the model code) is checked first. `text` is a file, `builtin` a built-in text
    ("code" by default); `warn` is told when the tokens are too few for a stable maximum."""
    from weightsmith.calibration.run import calibrate as run

    return run(
        src,
        out,
        text=text,
        builtin=builtin,
        tokens=tokens,
        seq_len=seq_len,
        force=force,
        trust_remote_code=trust_remote_code,
        progress=progress,
        warn=_warner(warn),
    )


def calibrate_kv(
    quant: str | os.PathLike[str],
    source: str | os.PathLike[str] | None = None,
    *,
    text: str | os.PathLike[str] | None = None,
    builtin: str | None = None,
    tokens: int = DEFAULT_TOKENS,
    seq_len: int = DEFAULT_SEQ_LEN,
    out: str | os.PathLike[str] | None = None,
    force: bool = False,
    trust_remote_code: bool = False,
    progress: Say | None = None,
) -> KvCalibration:
    """Measure FP8 KV-cache scales and add them to the quantized checkpoint `quant` (`calibrate-kv`).

    Without scales a checkpoint that declares an FP8 KV cache runs at scale 1.0 in vLLM. They are
    measured on `source`'s activations (the original checkpoint) or, without it, on `quant`'s own,
    dequantized; the result replaces `quant` whole, or goes to `out`. Scales `quant` already has are
    replaced only with `force`."""
    from weightsmith.calibration.kv import calibrate_kv as run
    from weightsmith.calibration.stats_file import tokens_option

    return run(
        Path(quant),
        None if source is None else Path(source),
        text=None if text is None else str(text),
        builtin=builtin,
        tokens=tokens_option()(tokens),
        seq_len=seq_len,
        force=force,
        out=None if out is None else Path(out),
        trust_remote_code=trust_remote_code,
        progress=progress,
    )


def verify(path: str | os.PathLike[str], *, scan_values: bool = False) -> VerifyReport:
    """Everything that can be wrong on disk with the checkpoint at `path` (a folder or one .safetensors file).

    `weightsmith verify`'s report: `clean` is its exit status 0 (1 otherwise), `findings` its lines.
    Headers are read strictly; `scan_values` reads every value too (NaN/Inf, all-zero tensors), which
    costs a pass over the whole checkpoint. A checkpoint that cannot be read at all raises
    `WeightsmithError` (the command's exit status 2)."""
    from weightsmith.audit.verify import verify as run

    return run(Path(path), scan=scan_values)


def evaluate(
    orig: str | os.PathLike[str],
    quant: str | os.PathLike[str],
    *,
    text: str | os.PathLike[str] | None = None,
    tokens: int = EVAL_TOKENS,
    logits: bool = True,
    stream: bool = False,
    trust_remote_code: bool = False,
) -> EvalReport:
    """What quantizing `orig` into `quant` cost (`weightsmith eval ORIG QUANT`, the report `--json` prints).

    The weight error is streamed from disk; then, with `logits`, both models read `text` (a file;
    default Python's json/decoder.py source), cut to `tokens` tokens, for KL, top-1 agreement and
    perplexity (torch and transformers; `stream` runs them one decoder layer at a time, for models
    larger than memory). `report.logits.status` "failed" means `quant` did not load in transformers
    (the command's exit status 1), "unavailable" that this machine cannot run the models."""
    from weightsmith.calibration.stats_file import tokens_option
    from weightsmith.fidelity.evaluate import evaluate as run

    return run(
        orig,
        quant,
        text=text,
        tokens=tokens_option(least=2)(tokens),
        logits=logits,
        stream=stream,
        trust_remote_code=trust_remote_code,
    )
