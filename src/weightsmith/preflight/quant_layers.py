"""Quantization config against the tensors, sorted by what vLLM's loader does with each mismatch.

`verify`'s quantization family finds them (`audit.check_quant`); this module says which of them stop
vLLM and which load silently wrong, as vLLM 0.32 CPU was seen to do on SmolLM2
(tests/vllm_truth/test_vllm_predictions.py):

- a module stored quantized that no config group targets, or that `ignore` names, gets a dense
  layer; the load stops at its first quantization tensor ("There is no module or parameter named
  '...weight_scale'");
- a module stored dense that a config group targets gets that group's quantized parameters; the
  dense weight is cast into them, the scale is never written, and vLLM starts without a word and
  serves numbers made from uninitialised memory.
"""

from __future__ import annotations

from weightsmith.audit.check_quant import check_quantization
from weightsmith.audit.values import SmallReads
from weightsmith.preflight.report import LOAD, WRONG, Item, Side

#: verify's check id -> (impact, what vLLM does, the fix).
OUTCOMES: dict[str, tuple[str, str, str]] = {
    "quant.not-targeted": (
        LOAD,
        "vLLM builds a dense layer for them and stops loading at their first quantization tensor "
        "(ValueError: There is no module or parameter named '...weight_scale')",
        "add them to a config group's targets with the scheme they are stored in",
    ),
    "quant.ignored-but-quantized": (
        LOAD,
        "vLLM builds a dense layer for them and stops loading at their first quantization tensor "
        "(ValueError: There is no module or parameter named '...weight_scale')",
        "take them out of ignore",
    ),
    "quant.not-quantized": (
        WRONG,
        "vLLM builds the group's quantized layer, casts the dense weight into it and never writes its "
        "scale: it starts without an error and computes with uninitialised memory",
        "quantize them, or add them to ignore",
    ),
}


def check_quant_layers(side: Side) -> list[Item]:
    """One item per kind of mismatch between `side`'s quantization config and its tensors."""
    if side.decl is None:
        return []
    with SmallReads(side.found.root, side.found.headers) as reads:
        found, _ = check_quantization(side.decl, side.modules, reads)
    items = []
    for check, (impact, what, fix) in OUTCOMES.items():
        hits = [f for f in found if f.check == check]
        if not hits:
            continue
        first = hits[0]
        items.append(
            Item(
                check,
                impact,
                f"{len(hits)} module(s) stored otherwise than the quantization config says; {what}. "
                f"First: {first.message}",
                fix,
                file=side.where(first.file),
                tensor=first.tensor,
            )
        )
    return items
