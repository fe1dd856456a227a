"""Whether the text `eval` read overlaps what QUANT was calibrated on: scores on it flatter the model.

GPTQ chooses its values to fit the calibration activations, and static scales are the maxima of
them, so KL and perplexity on the same text understate what quantization costs elsewhere. QUANT's
manifest keeps each calibration run's record (`io.provenance`): the GPTQ run's, that of the
statistics file `quantize --calibration` read, and `calibrate-kv`'s. A record keeps hashes of its
text's chunks (`io.textchunks`); the text the models read is cut the same way, and the characters
in chunks both have are what overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weightsmith.io import textchunks
from weightsmith.io.manifest import MANIFEST_FILE, Manifest, load_manifest
from weightsmith.io.provenance import Provenance

#: `CalibrationOverlap.status`: passages of the text are in the calibration text; none are; the
#: record keeps no chunk hashes to tell by (written before they were kept).
OVERLAP, DISJOINT, UNKNOWN = "overlap", "disjoint", "unknown"


@dataclass
class CalibrationOverlap:
    """The text `eval` read against one calibration record of QUANT's manifest."""

    record: str  # the manifest's field: "calibration" or "kv_calibration"
    status: str  # OVERLAP, DISJOINT or UNKNOWN
    eval_text: str  # what the models read, as the logits report names it
    calibration_text: str  # as the record names it
    calibration_tokens: int
    #: characters of the text read (those its tokens cover) in chunks the calibration text also has: a
    #: lower bound, since the chunk the token limit cuts off, or one where a shared passage starts
    #: after other text, is not the calibration text's chunk even when its lines are
    shared_chars: int = 0
    eval_chars: int = 0  # characters of the text read, blank lines and trailing spaces left out
    shared_fraction: float = 0.0
    reason: str | None = None  # why the status is UNKNOWN


def quant_manifest(quant: Path) -> Manifest | None:
    """QUANT's manifest, or None when it has none (not written by `weightsmith quantize`).

    Read before the weight pass, so that a broken one is one line at the start, not after the work."""
    path = quant / MANIFEST_FILE
    return load_manifest(path) if path.is_file() else None


def check(manifest: Manifest | None, text: str, source: str) -> list[CalibrationOverlap]:
    """`text` (what the models read, named `source`) against each calibration record of `manifest`;
    an empty list when it records no calibration (a data-free quantization, or no manifest)."""
    if manifest is None:
        return []
    records: list[tuple[str, Provenance]] = []
    if manifest.calibration is not None:
        records.append(("calibration", manifest.calibration))
    if manifest.kv_calibration is not None and manifest.kv_calibration != manifest.calibration:
        records.append(("kv_calibration", manifest.kv_calibration))
    return [_against(field, record, text, source) for field, record in records]


def _against(field: str, record: Provenance, text: str, source: str) -> CalibrationOverlap:
    found = CalibrationOverlap(field, UNKNOWN, source, record.text, record.tokens)
    digests = textchunks.read_record(record.text_chunks) if record.text_chunks is not None else None
    if digests is None:
        kept = "no chunk hashes" if record.text_chunks is None else "chunk hashes in a form not read here"
        found.reason = f"the manifest's {field} keeps {kept} of its text, so whether the texts overlap cannot be told"
        return found
    shared = textchunks.shared(text, digests)
    found.status = OVERLAP if shared.chunks else DISJOINT
    found.shared_chars, found.eval_chars, found.shared_fraction = shared.chars, shared.total, shared.fraction
    return found


def warning(found: CalibrationOverlap) -> str:
    """The command line's warning for an OVERLAP: both texts, and how much of the one read is shared."""
    return (
        f"the evaluation text overlaps QUANT's calibration text: at least {found.shared_chars:,} of "
        f"{found.eval_chars:,} characters ({100 * found.shared_fraction:.1f} %) of {found.eval_text} are also in "
        f"{found.calibration_text} "
        f"({found.calibration_tokens:,} tokens, weightsmith.json {found.record}); scores on text a model was "
        "calibrated on understate what quantization costs: pass --text with other text"
    )
