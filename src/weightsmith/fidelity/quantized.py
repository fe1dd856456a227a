"""Which modules of a compressed-tensors checkpoint are quantized, and with which format and args.

A module counts as quantized when the checkpoint stores quantization parameters for its weight
(`weight_packed`, or a `weight_scale`); the tensors say which modules, the config says how. Its
config group is the one vLLM loads it with (`targets.Groups`): the first target in config order
that names it, then the class name `Linear` (every module stored quantized is Linear-like),
then a fused layer's shards. `verify` warns where compressed-tensors, which quantized it, would
have picked another group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weightsmith.core.errors import CheckpointError
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats import compressors
from weightsmith.formats.targets import Groups
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE, Checkpoint

#: Parameters of a module that belong to its quantized weight (passed to the dequantizer).
WEIGHT_PARAMS = (
    names.WEIGHT,
    names.WEIGHT_PACKED,
    names.WEIGHT_SCALE,
    names.WEIGHT_SHAPE,
    names.WEIGHT_ZERO_POINT,
    names.WEIGHT_GLOBAL_SCALE,
)
#: Any of these on disk marks a module's weight as quantized.
MARKERS = (names.WEIGHT_PACKED, names.WEIGHT_SCALE)


@dataclass(frozen=True)
class QuantizedModule:
    """One quantized module: its config group and the tensors that hold its weight."""

    module: str
    group: str
    format: str | None
    weights: dict[str, Any]
    #: parameter name (`weight_packed`, ...) -> full tensor name in the checkpoint
    params: dict[str, str]

    @property
    def category(self) -> str:
        return names.category(f"{self.module}.{names.WEIGHT}")


def _groups(ckpt: Checkpoint) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The quantization config and its config groups that quantize weights, or a one-line error."""
    cfg = ckpt.root / CONFIG_FILE
    qc = ckpt.quantization_config
    if qc is None:
        raise CheckpointError(
            "has no quantization_config: QUANT must be a quantized compressed-tensors checkpoint",
            file=cfg,
            code="eval.not-quantized",
        )
    method = qc.get("quant_method")
    if method != ct.QUANT_METHOD:
        raise CheckpointError(
            f"quant_method is {method!r}: QUANT must be a {ct.QUANT_METHOD} checkpoint",
            file=cfg,
            code="eval.not-compressed-tensors",
        )
    groups = qc.get("config_groups")
    weight_groups = {
        name: g
        for name, g in (groups.items() if isinstance(groups, dict) else ())
        if isinstance(g, dict) and isinstance(g.get("weights"), dict)
    }
    if not weight_groups:
        raise CheckpointError(
            "quantization_config has no config group with weights args: nothing in QUANT is quantized",
            file=cfg,
            code="eval.not-quantized",
        )
    return qc, weight_groups


def _required_params(fmt: str | None, weights: dict[str, Any]) -> list[str]:
    """The weight's tensors in its format's layout (activation scales are not needed to dequantize)."""
    layout = compressors.of_group(fmt, weights)
    return list(layout.dtypes(inputs=False)) if layout is not None else []


def quantized_modules(ckpt: Checkpoint) -> list[QuantizedModule]:
    """Every quantized module of `ckpt`, in the order its tensors appear on disk.

    Raises `CheckpointError` when the checkpoint is not compressed-tensors, quantizes nothing, has
    a quantized module no config group targets, or lacks a parameter its format needs.
    """
    qc, groups = _groups(ckpt)
    targets = {g: [str(t) for t in gr["targets"]] for g, gr in groups.items() if isinstance(gr.get("targets"), list)}
    resolver = Groups(targets, ckpt.root / CONFIG_FILE)  # a bad regex is a line naming it, not a traceback mid-match

    params: dict[str, dict[str, str]] = {}
    for name in ckpt.tensors:
        module, param = names.split(name)
        if param in WEIGHT_PARAMS:
            params.setdefault(module, {})[param] = name

    found: list[QuantizedModule] = []
    for module, held in params.items():
        if not any(m in held for m in MARKERS):
            continue
        marker = held.get(names.WEIGHT_PACKED) or held[names.WEIGHT_SCALE]
        # only Linear-like weights carry these parameters, so the class target covers lm_head too
        # (verify reports a quantized lm_head vLLM would not load quantized)
        group_name = resolver.group(module, lm_head=False)
        if group_name is None:
            raise CheckpointError(
                f"is stored quantized but no config group in {CONFIG_FILE} targets {module}",
                file=ckpt.file_of(marker),
                tensor=marker,
                code="eval.untargeted",
            )
        group = groups[group_name]
        fmt = group.get("format") or qc.get("format")
        for param in _required_params(fmt, group["weights"]):
            if param not in held:
                raise CheckpointError(
                    f"is missing: {fmt} needs it to dequantize {module}",
                    file=ckpt.file_of(marker),
                    tensor=f"{module}.{param}",
                    code="eval.missing-param",
                )
        found.append(QuantizedModule(module, group_name, fmt, group["weights"], held))
    if not found:
        raise CheckpointError(
            "declares quantization but no tensor holds a quantized weight (no *.weight_packed or *.weight_scale)",
            file=ckpt.root,
            code="eval.not-quantized",
        )
    return found
