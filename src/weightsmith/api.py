"""The library entry points: everything the command line does, callable from code with typed results.

`quantize` / `plan_quantize` (of a `QuantizeRequest`, with `GptqOptions` for GPTQ, `BudgetOptions` for a
bit budget and `Hooks` for progress), `calibrate` / `calibrate_kv`, `verify` and `evaluate` (the `eval`
command; named so as not to shadow the builtin). Each runs the same library code its command runs,
checks its arguments with the same functions (the same refusals, in the same one-line
`WeightsmithError`), and returns what the command prints, as objects: nothing here prints. Warnings go
to `warn` when given, else to Python's `warnings`
(a `UserWarning`); progress lines to `progress`, when given.

`import weightsmith` does not import this module: `weightsmith.quantize(...)` and the others load it
on first use, so that the command line starts without numpy (see `weightsmith/__init__.py`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.calibration.run import calibrate
from weightsmith.core.terminal import Say
from weightsmith.fidelity.logits import DEFAULT_TOKENS as EVAL_TOKENS
from weightsmith.io.texts import CALIBRATION_SEQ_LEN, CALIBRATION_TOKENS
from weightsmith.quantization.budget.plan import BudgetOptions
from weightsmith.quantization.library import Hooks, quantize
from weightsmith.quantization.library import plan as plan_quantize
from weightsmith.quantization.request import GptqOptions, QuantizeRequest

if TYPE_CHECKING:  # the results of the commands that need more than the quantize flow, imported when they run
    from weightsmith.audit.verify import VerifyReport
    from weightsmith.calibration.kv import KvCalibration
    from weightsmith.fidelity.report import EvalReport

__all__ = [
    "BudgetOptions",
    "GptqOptions",
    "Hooks",
    "QuantizeRequest",
    "calibrate",
    "calibrate_kv",
    "evaluate",
    "plan_quantize",
    "quantize",
    "verify",
]


def calibrate_kv(
    quant: str | os.PathLike[str],
    source: str | os.PathLike[str] | None = None,
    *,
    text: str | os.PathLike[str] | None = None,
    builtin: str | None = None,
    tokens: int = CALIBRATION_TOKENS,
    seq_len: int = CALIBRATION_SEQ_LEN,
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
    from weightsmith.io.texts import tokens_option

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
    default Python's json/encoder.py source, in no built-in calibration text), cut to `tokens` tokens,
    for KL, top-1 agreement and perplexity (torch and transformers; `stream` runs them one decoder
    layer at a time, for models larger than memory). `report.logits.status` "failed" means `quant` did
    not load in transformers (the command's exit status 1), "unavailable" that this machine cannot run
    the models. `report.calibration_overlap` says how much of the text read is in what `quant` was
    calibrated on, per calibration record of its manifest ("overlap", "disjoint", or "unknown" for a
    record written before records kept chunk hashes of their text)."""
    from weightsmith.fidelity.evaluate import evaluate as run
    from weightsmith.io.texts import tokens_option

    return run(
        orig,
        quant,
        text=text,
        tokens=tokens_option(least=2)(tokens),
        logits=logits,
        stream=stream,
        trust_remote_code=trust_remote_code,
    )
