"""Where calibration numbers came from: the model's fingerprint, the tokens and text, and whose activations.

A statistics file (`calibration.stats_file`) carries this record as its metadata, and a quantized
checkpoint's manifest (`io.manifest`) copies it, so both name the model they were measured on the same way.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from weightsmith.io.checkpoint import Checkpoint
from weightsmith.safetensors.reader import ShardReader

#: Where activations were taken: on the original model, or on the quantized model as it is served.
ACTIVATIONS = ("original", "quantized")
#: Over which tokens a routed expert's statistics were taken (`Provenance.experts`).
ROUTED, EVERY_TOKEN = "routed", "every token"
EXPERT_TOKENS = (ROUTED, EVERY_TOKEN)
#: Bytes read from each end of each shard's data for the fingerprint (beside its whole header).
FINGERPRINT_SAMPLE = 1 << 20


@dataclass(frozen=True)
class Provenance:
    """Where the numbers came from; written as `__metadata__` strings and checked on read."""

    model_fingerprint: str  # `fingerprint()` of the checkpoint whose activations were measured
    tokens: int  # calibration tokens run through the model
    sequences: int
    seq_len: int
    text: str  # what the text was: a file name or a built-in corpus name
    text_sha256: str
    activations: str  # one of ACTIVATIONS
    #: `fingerprint()` of the original model: for a checkpoint weightsmith quantized, the source its
    #: manifest records; for an original, model_fingerprint itself (None when unknown, and in files
    #: written before this field). Lets `quantize SRC` take statistics measured on a quantization
    #: of SRC, i.e. on the activations of the model as served.
    source_fingerprint: str | None = None
    #: `textchunks.record` of the text the tokens came from: what `eval` compares its own text with, to
    #: tell when a model is scored on text it was calibrated on (None in records written before it).
    text_chunks: str | None = None
    #: Which tokens each routed expert's input maxima were taken over: one of EXPERT_TOKENS ("routed":
    #: those the model routed to it; "every token": `--all-experts`). None for a model without routed
    #: experts, and in records written before it.
    experts: str | None = None

    @classmethod
    def of_run(
        cls,
        model_fingerprint: str,
        sequences: list[list[int]],
        text: str,
        text_sha256: str,
        activations: str,
        source_fingerprint: str | None = None,
        text_chunks: str | None = None,
        experts: str | None = None,
    ) -> Provenance:
        """The record of one run over `sequences` (token ids): the counts follow from them."""
        return cls(
            model_fingerprint=model_fingerprint,
            tokens=sum(map(len, sequences)),
            sequences=len(sequences),
            seq_len=max(map(len, sequences)),
            text=text,
            text_sha256=text_sha256,
            activations=activations,
            source_fingerprint=source_fingerprint,
            text_chunks=text_chunks,
            experts=experts,
        )


def fingerprint(ckpt: Checkpoint) -> str:
    """A digest that tells one model's files from another's without reading them whole.

    Each shard's header (names, dtypes, shapes, offsets) and up to 1 MiB from each end of its
    data: two fine-tunes of one architecture share headers but not bytes, and hashing a 200 GB
    checkpoint in full would cost what a calibration run does.
    """
    digest = hashlib.sha256()
    for shard in sorted(ckpt.headers):
        path = ckpt.path(shard)
        header = ckpt.headers[shard]
        with ShardReader(path, header) as reader:
            start = header.data_start
            size = header.file_size - start
            spans = [(0, min(size, FINGERPRINT_SAMPLE))]
            if size > FINGERPRINT_SAMPLE:
                tail = max(FINGERPRINT_SAMPLE, size - FINGERPRINT_SAMPLE)
                spans.append((tail, size - tail))
            digest.update(shard.encode() + b"\0" + os.pread(reader.fd, start, 0))
            for offset, n in spans:
                digest.update(os.pread(reader.fd, n, start + offset))
    return "sha256:" + digest.hexdigest()
