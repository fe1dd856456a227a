"""Calibration statistics from a layer-streamed run: what `weightsmith calibrate` writes.

`measure` runs the checkpoint one decoder layer at a time (`stream`) and records, per attention
module, |K| max and |V| max as the KV cache receives them, and per Linear the largest |input|
(`recorders`; per MoE expert, whose weights transformers merges into 3-D parameters: `experts`).
Activations are those of the checkpoint given: an original's, or a quantized checkpoint's as
served (its layers dequantized as they are read).

Across processes (`engine.distributed`), each rank runs its share of the sequences and the ranks
combine their maxima with MAX: the result is the one process's bit for bit, since each sequence runs
alone (a batch of one) through the same kernels on every rank and max is exact and order-free. Torch's
thread count did not change a sequence's values either (SmolLM2-135M, 512 tokens in sequences of
256, on a 2-core machine: every maximum equal at 1, 2, 3, 8 and 16 intra-op threads), so ranks keep
the thread count they are given (torchrun's, or `launch`'s share of the cores) rather than one fixed
for all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from weightsmith.calibration import recorders
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import echo
from weightsmith.engine.distributed import World
from weightsmith.engine.experts import LinearExperts
from weightsmith.engine.loading import opened
from weightsmith.engine.stream import layer_arguments, run_layers
from weightsmith.fidelity.logits import first_tokens, load_tokenizer
from weightsmith.io import textchunks
from weightsmith.io.texts import calibration_text

Progress = Callable[[str], None]


class CalibrationTokens(NamedTuple):
    """The tokens a calibration run reads, and what its provenance says of their text."""

    sequences: list[list[int]]
    label: str  # the text's name: a file's path, or a built-in's label
    sha256: str  # of the whole text
    chunks: str  # `textchunks.record` of the part the tokens cover: what `eval` compares its text with


def measure(
    ckpt_dir: Path,
    token_ids: list[list[int]],
    *,
    world: World = World(),
    trust_remote_code: bool = False,
    all_experts: bool = False,
    progress: Progress | None = None,
) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """(kv maxima per attention module, input maxima per Linear module) for these sequences, layer by layer.

    In a world of several ranks this rank runs its `share` of the sequences and every rank returns
    the maxima over all of them. `all_experts`: every MoE expert's inputs are those of every token
    (`LinearExperts.routing`), not only of those routed to it.
    """
    if not token_ids or any(len(ids) == 0 for ids in token_ids):
        raise WeightsmithError("no calibration tokens to run", file=ckpt_dir, code="usage")
    mine = [token_ids[s] for s in world.share(len(token_ids))]
    kv, inputs = _measure(Path(ckpt_dir), mine, trust_remote_code, all_experts, progress) if mine else ({}, {})
    flat = {f"x {module}": x for module, x in inputs.items()}
    for module, (k, v) in kv.items():
        flat[f"k {module}"], flat[f"v {module}"] = k, v
    kv, inputs = split_maxima(world.max_reduce(flat))
    return kv, recorders.share_fused(inputs)  # after the reduction: fused partners share the maximum over all ranks


def split_maxima(reduced: dict[str, float]) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """The maxima every rank agreed on, as (key and value maxima per attention module, input maxima per
    module). Names come from every rank: one of another form than `x|k|v MODULE`, or a key maximum
    without its value maximum (or the reverse), was sent by a rank that is not running this job as
    this one does, and is one line rather than a KeyError."""
    kv: dict[str, tuple[float, float]] = {}
    inputs: dict[str, float] = {}
    for name, value in reduced.items():
        kind, _, module = name.partition(" ")
        partner = {"k": "v", "v": "k"}.get(kind)
        if kind not in ("x", "k", "v") or not module.strip():
            raise WeightsmithError(f"a rank sent the maximum {echo(name)}, which names no module's maximum")
        if partner is not None and f"{partner} {module}" not in reduced:
            raise WeightsmithError(f"a rank sent the maximum {echo(name)} without {echo(f'{partner} {module}')}")
        if kind == "x":
            inputs[module] = value
        elif kind == "k":
            kv[module] = (value, reduced[f"v {module}"])
    return kv, inputs


def _measure(
    ckpt_dir: Path, token_ids: list[list[int]], trust_remote_code: bool, all_experts: bool, progress: Progress | None
) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """`measure` of one process: the raw maxima (fused partners not yet shared)."""
    import torch

    with opened(ckpt_dir, trust_remote_code=trust_remote_code) as loader:
        skeleton = loader.skeleton
        cache = recorders.kv_cache(skeleton.config)
        experts = loader.experts
        sequences = [torch.tensor([ids], dtype=torch.long) for ids in token_ids]
        hidden, calls = layer_arguments(loader, sequences, cache)
        inputs: dict[str, float] = {}

        @contextmanager
        def recording(index: int) -> Iterator[None]:
            layer, path = skeleton.layers[index], skeleton.layer_path(index)
            routed = LinearExperts(layer, path, experts)
            with (
                recorders.attention_modules(layer, path, cache, loader.checkpoint_module),
                routed.routing(all_experts),
                recorders.input_maxima(loader.linears(index) | routed.modules, inputs),
            ):
                yield

        def done(index: int, count: int) -> None:
            if progress is not None:
                progress(f"layer {index}/{count}")

        run_layers(loader, hidden, calls, done, recording)
        kv = {module: pair for module, pair in cache.maxima.items() if isinstance(module, str)}
    return kv, inputs


def calibration_tokens(
    ckpt_dir: Path,
    text: str | None,
    builtin: str | None,
    tokens: int,
    seq_len: int,
    *,
    trust_remote_code: bool = False,
) -> CalibrationTokens:
    """The first `tokens` tokens of the text in sequences of `seq_len` (the last one shorter),
    tokenised by the checkpoint's own tokenizer, with the text's label, SHA-256 and chunk record.

    `text` is the path of a UTF-8 file (`--text`), `builtin` a built-in corpus name (`--builtin`);
    neither: the built-in `code`. No special tokens are added: the sequences are cut from one
    stream of text, and a BOS in front of each would be a token the text does not have.
    """
    if tokens < 1 or seq_len < 1:
        raise WeightsmithError(f"--tokens ({tokens}) and --seq-len ({seq_len}) must be positive", code="usage")
    sample = calibration_text(text, builtin, tokens)
    try:
        tokenizer = load_tokenizer(ckpt_dir, trust_remote_code=trust_remote_code)
    except WeightsmithError:
        raise
    except Exception as exc:  # transformers raises many types for a folder without a tokenizer
        raise WeightsmithError(
            f"has no tokenizer transformers can load ({type(exc).__name__})", file=ckpt_dir, code="engine.tokenizer"
        ) from None
    ids, chars = _tokenize(tokenizer, sample.text, tokens)
    sequences = [ids[s : s + seq_len] for s in range(0, len(ids), seq_len)]
    sha = hashlib.sha256(sample.text.encode()).hexdigest()
    return CalibrationTokens(sequences, sample.source, sha, textchunks.record(sample.text[:chars]))


def _tokenize(tokenizer: Any, text: str, tokens: int) -> tuple[list[int], int]:
    """The first `tokens` tokens of `text` and the characters they cover, tokenising only as much of
    the text as that takes."""
    chars = tokens * 16
    while True:
        ids, covered, more = first_tokens(tokenizer, text[:chars], tokens, special=False)
        if more or chars >= len(text):
            return ids, covered
        chars *= 4
