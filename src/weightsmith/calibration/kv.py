"""`weightsmith calibrate-kv QUANT [--from SRC]`: measure FP8 KV-cache scales and add them to a checkpoint.

A checkpoint that declares an FP8 KV cache without `k_scale`/`v_scale` runs at scale 1.0 in vLLM;
one quantized without a KV-cache scheme has none to declare. This runs calibration tokens through
a model one decoder layer at a time (the engine's `measure`): the original `--from SRC`, or the
quantized checkpoint itself, its layers dequantized as they are read (the activations it will be
served with). The provenance says which. Each scale is `max / 448` (calibrated.py) and goes into a
new shard with the index re-resolved and `kv_cache_scheme` declared if the config lacks it, staged
and verified beside the checkpoint and renamed into place whole (audit/transplant.py), so an
interrupted run leaves the checkpoint as it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console

from weightsmith.audit.transplant import add_tensors, check_kv_target
from weightsmith.calibration import derived
from weightsmith.core.errors import CheckpointError, WeightsmithError
from weightsmith.core.severity import ERROR
from weightsmith.io import names, provenance
from weightsmith.io.checkpoint import DEFAULT_SHARD, Checkpoint, read_json
from weightsmith.io.manifest import MANIFEST_FILE, Manifest, measured_activations, source_fingerprint
from weightsmith.io.outputdir import CHOOSE_ANOTHER, check_destination, remove_stale
from weightsmith.io.texts import CALIBRATION_SEQ_LEN, CALIBRATION_TOKENS, MIN_TOKENS

KV_CACHE = "fp8"
#: The verify family whose findings on the target this command mends (missing or unusable KV scales).
KV_FAMILY = "kv-cache"
SHARD = DEFAULT_SHARD
err = Console(stderr=True, highlight=False)


def existing_scales(ckpt: Checkpoint, attention: list[str]) -> list[str]:
    """KV-cache scales the checkpoint already holds for these attention layers, under any accepted name."""
    return [n for a in attention for k in ("k", "v") for n in names.kv_scale_names(a, k) if n in ckpt.tensors]


class KvCalibration(NamedTuple):
    """What `calibrate_kv` wrote: the checkpoint folder (QUANT, or `out`) and the calibration entry
    recorded in the new shard's metadata (`measured_on`, the provenance, `kv_cache`, `kv_scales`)."""

    output: Path
    calibration: dict[str, Any]


def calibrate_kv(
    quant: Path,
    source: Path | None = None,
    *,
    text: str | None = None,
    builtin: str | None = None,
    tokens: int = CALIBRATION_TOKENS,
    seq_len: int = CALIBRATION_SEQ_LEN,
    force: bool = False,
    out: Path | None = None,
    trust_remote_code: bool = False,
    progress: Callable[[str], None] | None = None,
) -> KvCalibration:
    """Measure and add the KV-cache scales of `quant` (in place, or into `out`); returns (output, calibration entry)."""
    from weightsmith.calibration.measure import calibration_tokens, measure
    from weightsmith.fidelity.logits import missing_library

    sources = (quant,) if source is None else (quant, source)
    remove_stale(out if out is not None else quant, keep=sources)
    if out is not None:  # before the measurement, which may take an hour
        check_destination(quant, out, False, *sources, remedy=CHOOSE_ANOTHER)
    target = Checkpoint.open(quant)
    refuse_unverified(target.root, KV_FAMILY)
    attention = derived.attention_modules(list(target.tensors))
    if not attention:
        raise CheckpointError(
            "has no k_proj or qkv_proj weight (no attention, or another kind: DeepSeek's latent attention "
            "caches one compressed vector, not K and V), so there are no KV-cache scales to measure",
            file=target.root,
            code="kv.no-attention",
        )
    check_kv_target(target)
    found = existing_scales(target, attention)
    if found and not force:
        raise CheckpointError(
            f"already has KV-cache scales ({len(found)}); pass --force to measure and replace them",
            file=target.file_of(found[0]),
            tensor=found[0],
            code="kv.exists",
        )
    missing = missing_library()
    if missing is not None:
        raise WeightsmithError(missing, code="engine.libraries")
    measured_on = source if source is not None else quant
    ckpt = Checkpoint.open(measured_on) if source is not None else target
    if source is not None:
        refuse_unverified(ckpt.root)
        _same_architecture(ckpt, target)
    read = calibration_tokens(measured_on, text, builtin, tokens, seq_len, trust_remote_code=trust_remote_code)
    sequences = read.sequences
    if sum(map(len, sequences)) < MIN_TOKENS:
        err.print(
            f"[yellow]warning:[/] {sum(map(len, sequences)):,} calibration tokens; a maximum over fewer than "
            f"{MIN_TOKENS:,} is not stable"
        )
    model = provenance.fingerprint(ckpt)
    activations = "original" if source is not None else "quantized"
    origin = source_fingerprint(ckpt, model, activations)  # a bad manifest fails now, not after the run
    kv, _ = measure(measured_on, sequences, trust_remote_code=trust_remote_code, progress=progress)
    values = derived.kv_scales(kv, attention, measured_on)
    prov = provenance.Provenance.of_run(
        model,
        sequences,
        read.label,
        read.sha256,
        measured_activations(activations, model, origin),
        origin,
        text_chunks=read.chunks,
    )
    entry = {"measured_on": str(measured_on), **asdict(prov), "kv_cache": KV_CACHE, "kv_scales": len(values)}
    documents = {}
    manifest_path = target.root / MANIFEST_FILE
    if manifest_path.is_file():  # a weightsmith checkpoint: its card reads where measured scales came from
        manifest = Manifest.from_json(read_json(manifest_path, MANIFEST_FILE, finite=False), manifest_path)
        # a record already there is the quantize run's (its activation scales, or an earlier
        # calibrate-kv's): it stays, and these scales' provenance is their own record
        if manifest.calibration is None:
            manifest.calibration = prov
        manifest.kv_calibration = prov
        documents[MANIFEST_FILE] = manifest.to_json()
    metadata = {"calibration": json.dumps(entry, sort_keys=True)}
    result = add_tensors(
        target.root,
        values,
        metadata,
        kv_scheme=derived.kv_cache_scheme(KV_CACHE),
        shard=SHARD,
        out=out,
        replace=force,
        documents=documents,
        sources=() if source is None else (source,),
    )
    return KvCalibration(result.output, entry)


def refuse_unverified(folder: Path, *tolerated: str) -> None:
    """Refuse a checkpoint `verify` finds errors in, naming the first: scales measured on it, or added
    to it, would ship beside them, and the output would fail `verify` too.

    Findings of the `tolerated` families are left out: in the target, missing or unusable KV-cache
    scales are what this command measures and writes.
    """
    from weightsmith.audit.verify import FAMILIES, verify

    skip = [fam for fam in FAMILIES if fam.id in tolerated]
    report = verify(folder)
    errors = [f for f in report.findings if f.severity == ERROR and not any(fam.owns(f.check) for fam in skip)]
    if errors:
        more = f" (and {len(errors) - 1:,} more)" if len(errors) > 1 else ""
        raise CheckpointError(
            f"fails verify: {errors[0].line()}{more}; fix it first (`weightsmith verify {folder}` lists them)",
            file=folder,
            code="kv.source-invalid",
        )


def _same_architecture(src: Checkpoint, target: Checkpoint) -> None:
    """Refuse a `--from` model that is not the quantized checkpoint's base: its scales would be another's."""
    for key in ("model_type", "num_hidden_layers", "num_key_value_heads", "head_dim", "hidden_size"):
        a, b = src.config.get(key), target.config.get(key)
        if a != b:
            raise CheckpointError(
                f"config.json {key} is {a!r} but {target.root}'s is {b!r}: not the model it was quantized from",
                file=src.root / "config.json",
                code="kv.other-model",
            )
