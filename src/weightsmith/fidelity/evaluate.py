"""`weightsmith eval` as a library call: the weight error streamed from disk, then the logits where the
models run, in one `EvalReport` (what `eval --json` prints).

The checks that can fail fast come first (the text is read, QUANT's manifest is read, model code a
checkpoint ships is refused) so that a bad argument is not found after the weight pass. The text the
models read is then compared with what QUANT was calibrated on (`calibrated_on`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from weightsmith.fidelity import calibrated_on
from weightsmith.fidelity import logits as logits_mod
from weightsmith.fidelity.report import EvalReport
from weightsmith.fidelity.weights import WeightReport, weight_error
from weightsmith.io import texts
from weightsmith.io.checkpoint import refuse_remote_code
from weightsmith.io.manifest import Manifest

#: How the weight pass is run: `weight_error`, or the command line's, which draws a progress bar around it.
WeighPass = Callable[[Path, Path], WeightReport]


def evaluate(
    orig: str | os.PathLike[str],
    quant: str | os.PathLike[str],
    *,
    text: str | os.PathLike[str] | None = None,
    tokens: int = logits_mod.DEFAULT_TOKENS,
    logits: bool = True,
    stream: bool = False,
    trust_remote_code: bool = False,
    weigh: WeighPass = weight_error,
) -> EvalReport:
    """How much quantizing `orig` into `quant` cost: the weight error, then KL, top-1 and perplexity.

    `text` (a file; default Python's json/encoder.py source, in no built-in calibration text) is what
    the models read, cut to `tokens` tokens. `logits=False` measures the weights only. `stream` runs
    both models one decoder layer at a time, for models larger than memory. A report whose
    `logits.status` is "failed" means `quant` did not load as served (`logits.served_logits`; the
    command exits 1 for it); "unavailable" that this machine cannot run it. When the models ran, `calibration_overlap`
    says, per calibration record of QUANT's manifest, how much of the text read is in its calibration
    text ("unknown" for a record written before records kept chunk hashes)."""
    orig, quant = Path(orig), Path(quant)
    sample = texts.read_text(Path(text)) if text is not None else None  # a bad text fails before any work
    manifest = calibrated_on.quant_manifest(quant)
    if logits:  # as early: code a checkpoint ships is refused before the weight pass, not after
        for folder in (orig, quant):
            refuse_remote_code(folder, trust_remote_code)
    weights = weigh(orig, quant)
    if not logits:
        measured = logits_mod.LogitsReport(logits_mod.SKIPPED, reason="--no-logits")
    else:
        os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' and compressed-tensors' bars and warnings
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if sample is None:
            sample = texts.default_text()
        if stream:
            from weightsmith.fidelity import streamed

            measured = streamed.compare(
                orig, quant, sample.text, tokens, sample.source, trust_remote_code=trust_remote_code
            )
        else:
            measured = logits_mod.compare(
                orig, quant, sample.text, tokens, text_source=sample.source, trust_remote_code=trust_remote_code
            )
    overlap = None
    if measured.status == logits_mod.OK and sample is not None:
        overlap = calibrated_on.check(manifest, sample.text[: measured.text_chars], sample.source)
    return EvalReport(str(orig), str(quant), weights, measured, overlap, _weights_caveat(manifest))


def _weights_caveat(manifest: Manifest | None) -> str | None:
    """Why QUANT's weight error is not quantization's alone: a pre-pass changed its weights, on
    purpose and without changing the model's function, before they were quantized."""
    if manifest is None or manifest.pre_pass is None:
        return None
    return (
        f"QUANT's weights were rebalanced by --pre-pass {manifest.pre_pass.name} before quantizing (the model's "
        f"function is unchanged, {len(manifest.pre_pass.changed)} other tensors changed with them): their error "
        "against ORIG measures the rebalancing too; compare KL, top-1 and perplexity instead"
    )
