"""`eval --stream`: KL, top-1 and perplexity with neither model ever whole in memory.

Both checkpoints run layer by layer (`stream`) on the same tokens; only their final hidden states
are kept. Logits are then made a chunk of positions at a time by each model's own final norm and
head: ORIG's chunks go to a temporary file (float32, as the in-memory eval holds them), then each
of QUANT's chunks is compared with ORIG's, with the definitions and float64 sums of
`fidelity.logits` (same chunking), so the figures equal the in-memory eval's.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.loading import TOP, opened
from weightsmith.engine.stream import LayerProgress, final_logits, layer_arguments, run_layers
from weightsmith.fidelity import logits as fl
from weightsmith.fidelity.activations import input_quantizers, served_inputs


def _final_hidden(
    folder: Path, ids: Any, trust_remote_code: bool, progress: LayerProgress | None, served: bool = False
) -> Any:
    """The hidden states of `ids` after the last decoder layer of the checkpoint in `folder`; with
    `served`, its Linears' inputs quantized with their stored scales as a server does (`activations`:
    a static FP8 checkpoint too, whose weights the engine decodes as an FP8 original's)."""
    with opened(folder, trust_remote_code=trust_remote_code) as loader:
        quantizers = input_quantizers(loader.source.ckpt) if served else {}

        def around(index: int) -> AbstractContextManager[int]:
            return served_inputs(loader, quantizers, index)

        hidden, calls = layer_arguments(loader, [ids])
        return run_layers(loader, hidden, calls, progress, around if quantizers else None)[0]


def _chunks(length: int) -> list[tuple[int, int]]:
    step = fl.POSITIONS_PER_CHUNK
    return [(s, min(s + step, length)) for s in range(0, length, step)]


@contextmanager
def _head(folder: Path, trust_remote_code: bool) -> Iterator[Callable[[Any, Any, int, int], Any]]:
    """`logits(ids, final, start, stop)` by the checkpoint's top level (embeddings, final norm, head)."""
    import torch

    with opened(folder, trust_remote_code=trust_remote_code) as loader:
        loader.load(TOP)
        try:
            yield lambda ids, final, start, stop: final_logits(loader, ids, final, torch.arange(start, stop))
        finally:
            loader.free(TOP)


def compare(
    orig_dir: Path,
    quant_dir: Path,
    text: str,
    tokens: int,
    text_source: str,
    *,
    trust_remote_code: bool = False,
    progress: LayerProgress | None = None,
) -> fl.LogitsReport:
    """KL(ORIG || QUANT), top-1 agreement and both perplexities on the first `tokens` tokens of `text`."""
    started = time.perf_counter()
    report = fl.LogitsReport(fl.UNAVAILABLE, text_source=text_source)
    reason = fl.missing_library()
    if reason is not None:
        report.reason, report.seconds = reason, time.perf_counter() - started
        return report
    import torch

    try:
        tokenizer = fl.load_tokenizer(orig_dir, quant_dir, trust_remote_code=trust_remote_code)
    except WeightsmithError:
        raise
    except Exception as exc:  # transformers raises many types for a folder without a tokenizer
        report.reason = f"no tokenizer transformers can load in ORIG or QUANT ({type(exc).__name__})"
        return report
    first, report.text_chars, _ = fl.first_tokens(tokenizer, text, tokens, special=True)
    ids = torch.tensor([first], dtype=torch.long)
    report.tokens = length = len(first)
    if length < 2:
        raise WeightsmithError(f"gives {length} token(s); at least 2 are needed", file=text_source)

    ref_final = _final_hidden(Path(orig_dir), ids, trust_remote_code, progress)
    final = _final_hidden(Path(quant_dir), ids, trust_remote_code, progress, served=True)
    targets = ids[0, 1:]
    kl = nll_orig = nll_quant = 0.0
    agree = 0
    with tempfile.TemporaryFile(dir=os.environ.get("TMPDIR")) as store:
        vocab = 0
        with _head(Path(orig_dir), trust_remote_code) as head:
            for start, stop in _chunks(length):
                chunk = head(ids, ref_final, start, stop).numpy()
                vocab = chunk.shape[-1]
                store.write(np.ascontiguousarray(chunk, dtype=np.float32).tobytes())
        with _head(Path(quant_dir), trust_remote_code) as head:
            for start, stop in _chunks(length):
                logits = head(ids, final, start, stop)
                if logits.shape[-1] != vocab:
                    report.status, report.reason = fl.FAILED, f"QUANT gives {logits.shape[-1]} logits, ORIG {vocab}"
                    return report
                raw = os.pread(store.fileno(), (stop - start) * vocab * 4, start * vocab * 4)
                ref = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).reshape(stop - start, vocab).copy())
                kl += fl.kl_divergence(ref, logits) * (stop - start)
                agree += int((logits.argmax(-1) == ref.argmax(-1)).sum())
                last = min(stop, length - 1)  # position length-1 predicts nothing
                if last > start:
                    nll_orig += _nll(ref[: last - start], targets[start:last])
                    nll_quant += _nll(logits[: last - start], targets[start:last])
    report.kl = kl / length
    report.top1_agreement = agree / length
    report.ppl_orig = math.exp(nll_orig / (length - 1))
    report.ppl_quant = math.exp(nll_quant / (length - 1))
    report.status, report.seconds = fl.OK, time.perf_counter() - started
    return report


def _nll(logits: Any, targets: Any) -> float:
    import torch

    return torch.nn.functional.cross_entropy(logits.double(), targets, reduction="sum").item()
