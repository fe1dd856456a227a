"""`weightsmith calibrate` as a library call: activation maxima measured layer by layer and written to a
statistics file, the file `quantize --calibration` (static scales, KV-cache scales) reads.

`calibrate` checks everything it can before the run (the destination, the checkpoint, the libraries,
the model code, the manifest), since the run may take hours; the file is written whole or not at
all (`stats_file.write`). The command (`calibration.cli`) prints what it returns.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from weightsmith.calibration import stats_file
from weightsmith.core.errors import OutputError, WeightsmithError
from weightsmith.core.files import check_file_name
from weightsmith.core.terminal import Say, short_repr, warner
from weightsmith.engine.distributed import World
from weightsmith.families import require_family
from weightsmith.io import provenance
from weightsmith.io.checkpoint import CONFIG_FILE, Checkpoint
from weightsmith.io.manifest import measured_activations, source_fingerprint
from weightsmith.io.outputdir import refuse_inside
from weightsmith.io.texts import CALIBRATION_SEQ_LEN, CALIBRATION_TOKENS, MAX_TOKENS, MIN_TOKENS, tokens_option


@dataclass(frozen=True)
class CalibrateResult:
    """The statistics file written and what went into it."""

    path: Path
    stats: stats_file.CalibrationStats
    #: Calibration tokens run (the text's, up to `tokens`).
    tokens: int
    #: Wall seconds of the measurement itself (not the tokenizing or the checks before it).
    seconds: float


def check_out(src: Path, out: Path, force: bool) -> None:
    """Refuse an output the run could not or must not write, before the run: it may take hours."""
    check_file_name(out)  # before anything stats it: a name too long is ENAMETOOLONG there
    refuse_inside(out, src)
    if out.is_dir():
        raise OutputError("is a folder; --out names the statistics file", file=out, code="output.folder")
    stats_file.check_replaceable(out, force)
    if not out.parent.is_dir():
        raise OutputError("is in a folder that does not exist", file=out, code="output.parent")


def calibrate(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    text: str | os.PathLike[str] | None = None,
    builtin: str | None = None,
    tokens: int = CALIBRATION_TOKENS,
    seq_len: int = CALIBRATION_SEQ_LEN,
    force: bool = False,
    trust_remote_code: bool = False,
    all_experts: bool = False,
    progress: Say | None = None,
    warn: Say | None = None,
    world: World = World(),
) -> CalibrateResult:
    """Measure K/V maxima and every Linear's input maximum of `src` on calibration text; write them to `out`.

    What `weightsmith calibrate SRC --out OUT` writes: the file `quantize(calibration=...)` reads for
    static activation scales (nvfp4, fp8) and KV-cache scales. The run streams the model one decoder
    layer at a time (torch and transformers), so everything that could refuse it (the destination,
    the checkpoint, the model code) is checked first. `text` is a file, `builtin` a built-in text
    ("code" by default); `progress` gets a line per decoder layer; `warn` (else Python's `warnings`) is
    told when the tokens are too few for a stable maximum, and of MoE experts no token was routed to (which
    have no input maximum: `all_experts` sends every token through every expert for the statistics, the
    outputs still routed as the model routes). The ranges of `tokens` and `seq_len` are the command line's.

    In a `world` of several ranks (`engine.distributed.joined`), every rank reads the same checkpoint
    and text and runs its share of the sequences; all end with the same statistics, which rank 0 alone
    checks the destination for, writes and reports (`progress`, `warn`), while the others wait for it
    at a barrier, so that no rank ends before the file exists and all end with an error if rank 0
    fails to write it. The returned `path` is written only on rank 0."""
    from weightsmith.fidelity.logits import missing_library

    tokens = tokens_option()(tokens)
    if type(seq_len) is not int or not 1 <= seq_len <= MAX_TOKENS:
        raise WeightsmithError(
            f"--seq-len {short_repr(seq_len)}: give a whole number from 1 to {MAX_TOKENS:,}", code="usage"
        )
    src, out = Path(src), Path(out)
    if world.leader:  # only rank 0 writes: the others' node may not even see the folder
        check_out(src, out, force)
    ckpt = Checkpoint.open(src)
    missing = missing_library()
    if missing is not None:
        raise WeightsmithError(missing, code="engine.libraries")
    from weightsmith.calibration.measure import calibration_tokens, measure
    from weightsmith.engine.experts import expert_modules
    from weightsmith.engine.loading import opened

    with opened(src, trust_remote_code=trust_remote_code) as loader:  # a model the engine cannot run fails now
        activations = loader.source.activations
        experts = expert_modules(loader.experts)
    require_family(ckpt.config, "calibrate", src / CONFIG_FILE)
    model = provenance.fingerprint(ckpt)
    source = source_fingerprint(ckpt, model, activations)  # a bad manifest fails now, not after the run
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    read = calibration_tokens(
        src, str(text) if text else None, builtin, tokens, seq_len, trust_remote_code=trust_remote_code
    )
    sequences = read.sequences
    count = sum(map(len, sequences))
    if count < MIN_TOKENS and world.leader:
        few = f"{count} calibration tokens, fewer than {MIN_TOKENS}: a maximum over so few is not stable"
        warner(warn, depth=1)(few)
    started = time.perf_counter()
    progress = progress if world.leader else None
    kv, inputs = measure(
        src, sequences, world=world, trust_remote_code=trust_remote_code, all_experts=all_experts, progress=progress
    )
    unreached = sorted(experts - set(inputs))
    if unreached and world.leader:
        warner(warn, depth=1)(
            f"{len(unreached):,} MoE expert modules (the first: {unreached[0]}) were routed no calibration token and "
            "have no input maximum: a scheme with static activation scales refuses them; --all-experts measures "
            "every expert on every token"
        )
    seconds = time.perf_counter() - started
    record = provenance.Provenance.of_run(
        model,
        sequences,
        read.label,
        read.sha256,
        measured_activations(activations, model, source),
        source,
        text_chunks=read.chunks,
        experts=(provenance.EVERY_TOKEN if all_experts else provenance.ROUTED) if experts else None,
    )
    stats = stats_file.CalibrationStats(record, kv, inputs)
    if world.leader:
        stats_file.write(out, stats, replace=force)
    world.barrier()
    return CalibrateResult(out, stats, count, seconds)
