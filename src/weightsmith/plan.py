"""Deciding, for every tensor of a checkpoint, what the quantized checkpoint holds in its place.

The rules, in order: quantization partners of FP8 inputs are consumed; 2-D `*.weight` tensors of
Linear-like modules are targets unless they are embeddings, `lm_head`, norms or MoE routers, or
are ignored (exact names or `re:` regexes, matched as vLLM matches them, against module names and
the fused names vLLM loads, such as `qkv_proj`), or their input size does not fit the group size.
Shards of a fused layer (q/k/v, gate/up) are quantized together or kept together, because vLLM
refuses a fused layer whose shards disagree. Every Linear-like module left unquantized goes into
the config's `ignore`, because vLLM expects `weight_packed` for any targeted Linear it finds.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from weightsmith import names
from weightsmith.checkpoint import Checkpoint
from weightsmith.dtypes import DENSE_FLOATS, DTYPES, FP8_FLOATS
from weightsmith.errors import CheckpointError, WeightsmithError
from weightsmith.formats import compressed_tensors as ct
from weightsmith.safetensors.writer import TensorSpec
from weightsmith.schemes import Scheme

QUANTIZE, KEEP, DECODE, DROP = "quantize", "keep", "decode", "drop"


@dataclass(frozen=True)
class Preset:
    """A named ignore list for a known case, with the reason shown in the plan."""

    ignore: tuple[str, ...]
    why: str


PRESETS: dict[str, Preset] = {
    "dflash-draft": Preset(
        ("re:.*\\.(q|k|v|qkv)_proj$", "re:.*\\.g_proj$"),
        "vLLM's DFlash proposer reads qkv_proj.weight directly; the g_proj gate stays BF16",
    ),
}


@dataclass(frozen=True)
class SourceFormat:
    """How the input checkpoint stores its weights."""

    kind: str  # "dense", "ct-fp8" or "hf-fp8"
    scale_param: str | None = None  # the FP8 scale parameter name
    block: tuple[int, int] = (128, 128)


def detect_source_format(ckpt: Checkpoint) -> SourceFormat:
    """Dense, or one of the FP8 styles we can decode; anything else already quantized is refused."""
    qc = ckpt.quantization_config
    cfg_path = ckpt.root / "config.json"
    if qc is None:
        return SourceFormat("dense")
    method = qc.get("quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size") or (128, 128)
        return SourceFormat("hf-fp8", names.WEIGHT_SCALE_INV, (int(block[0]), int(block[1])))
    if method == ct.QUANT_METHOD:
        groups = qc.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values()]
        formats = {g.get("format") or qc.get("format") for g in groups.values()}
        if (
            weights
            and all(w.get("type") == "float" and w.get("num_bits") == 8 for w in weights)
            and formats
            <= {
                ct.FLOAT_QUANTIZED,
                ct.NAIVE_QUANTIZED,
            }
        ):
            block = next((w.get("block_structure") for w in weights if w.get("block_structure")), None) or (128, 128)
            return SourceFormat("ct-fp8", names.WEIGHT_SCALE, (int(block[0]), int(block[1])))
        raise CheckpointError(
            f"is already quantized (compressed-tensors format {', '.join(sorted(map(str, formats)))}); "
            "quantize from the unquantized or FP8 checkpoint",
            file=cfg_path,
            code="source.already-quantized",
        )
    raise CheckpointError(
        f"is already quantized (quant_method {method!r}); quantize from the unquantized or FP8 checkpoint",
        file=cfg_path,
        code="source.already-quantized",
    )


#: What `re.compile` raises for a pattern it cannot build, not only `re.error`.
REGEX_ERRORS = (re.error, OverflowError, RecursionError)


def entry_regex(entry: str, origin: str, file: str | Path | None = None) -> re.Pattern[str]:
    """The compiled pattern of a `re:` entry, or one line naming the entry and where it came from.

    Every `re:` pattern a user or a checkpoint supplies is compiled here, so a bad one (`re:([`,
    a repeat count too large, nesting too deep) is never a traceback. `origin` says where it was
    given: `--ignore`, `--select`, `quantization_config targets`.
    """
    try:
        return re.compile(entry[3:])
    except REGEX_ERRORS as exc:
        raise WeightsmithError(
            f"{origin} {entry!r} is not a valid regular expression ({exc})", file=file, code="usage"
        ) from None


def matches(entry: str, module: str) -> bool:
    """vLLM's rule: `re:` entries with `re.match` (anchored at the start only), others exactly."""
    if entry.startswith("re:"):
        return entry_regex(entry, "pattern").match(module) is not None
    return entry == module


def compile_ignore(entries: list[str]) -> None:
    """Reject malformed regexes up front, naming the entry."""
    for e in entries:
        if e.startswith("re:"):
            entry_regex(e, "--ignore")


@dataclass
class Decision:
    """What becomes of one source tensor."""

    name: str
    shard: str
    action: str
    reason: str
    dtype: str
    shape: tuple[int, ...]
    outputs: list[TensorSpec] = field(default_factory=list)
    scale: str | None = None  # FP8 inputs: the scale tensor consumed by decoding

    @property
    def module(self) -> str:
        return names.split(self.name)[0]

    @property
    def nbytes(self) -> int:
        return DTYPES[self.dtype].nbytes(math.prod(self.shape)) or 0


@dataclass
class Plan:
    """Decisions for every tensor, the output shards, and the config's ignore list."""

    source: Checkpoint
    scheme: Scheme
    source_format: SourceFormat
    decisions: list[Decision]
    ignore: list[str]
    preset: str | None = None

    def shards(self) -> dict[str, list[TensorSpec]]:
        """Output shard file name -> the tensors it holds (same file names as the source)."""
        out: dict[str, list[TensorSpec]] = {shard: [] for shard in self.source.headers}
        for d in self.decisions:
            out[d.shard].extend(d.outputs)
        return out

    @property
    def bytes_in(self) -> int:
        return self.source.tensor_bytes

    @property
    def bytes_out(self) -> int:
        return sum(s.nbytes for d in self.decisions for s in d.outputs)

    def count(self, action: str) -> int:
        return sum(d.action == action for d in self.decisions)

    def quantization_config(self) -> dict:
        return self.scheme.quantization_config(self.ignore)


def _keep_reason(name: str, dtype: str, shape: tuple[int, ...]) -> str | None:
    """Why a tensor is not a quantization target by its nature, or None if it is a target."""
    module, param = names.split(name)
    if len(shape) == 3 and dtype in DENSE_FLOATS + FP8_FLOATS and names.category(name) == names.ROUTED_EXPERTS:
        return "3-D fused expert tensor: no per-expert layout that vLLM loads is known for it"
    if param != names.WEIGHT:
        return "not a weight"
    if dtype not in DENSE_FLOATS + FP8_FLOATS:
        return f"{dtype} tensor"
    if len(shape) == 1:
        return "1-D tensor"
    if names.is_norm(module):
        return "norm"
    if names.is_embedding(module):
        return "embedding"
    if names.is_lm_head(module):
        return "lm_head (vLLM's ParallelLMHead is not a Linear target)"
    if names.is_router(module):
        return "MoE router (ReplicatedLinear; vLLM would expect it quantized)"
    if len(shape) != 2:
        return f"{len(shape)}-D tensor"
    return None


def build_plan(ckpt: Checkpoint, scheme: Scheme, ignore: list[str] | None = None, preset: str | None = None) -> Plan:
    """Decide every tensor's fate. Raises `WeightsmithError` for an unknown preset or bad regex."""
    user_ignore = list(ignore or [])
    compile_ignore(user_ignore)
    preset_entries: tuple[str, ...] = ()
    if preset is not None:
        if preset not in PRESETS:
            raise WeightsmithError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})", code="usage")
        preset_entries = PRESETS[preset].ignore
    fmt = detect_source_format(ckpt)

    consumed: dict[str, str] = {}  # FP8 scale tensor -> the weight it belongs to
    if fmt.kind != "dense":
        for name, ref in ckpt.tensors.items():
            if ref.info.dtype.code in FP8_FLOATS and name.endswith("." + names.WEIGHT):
                module = names.split(name)[0]
                scale = f"{module}.{fmt.scale_param}"
                if scale not in ckpt.tensors:
                    raise CheckpointError(
                        f"is FP8 but its scale {scale} is missing",
                        file=ckpt.path(ref.shard),
                        tensor=name,
                        code="source.fp8-scale",
                    )
                consumed[scale] = name

    decisions: list[Decision] = []
    for name, ref in ckpt.tensors.items():
        info = ref.info
        d = Decision(name, ref.shard, KEEP, "", info.dtype.code, info.shape)
        module, param = names.split(name)
        if name in consumed:
            d.action, d.reason = DROP, f"FP8 scale of {consumed[name]}, consumed by decoding"
        elif fmt.kind != "dense" and param == names.INPUT_SCALE:
            d.action, d.reason = DROP, "FP8 activation scale; the output quantizes weights only"
        else:
            why = _keep_reason(name, info.dtype.code, info.shape)
            if why is None:
                why = _ignored_by(module, user_ignore, preset_entries, preset)
            if why is None:
                why = scheme.unsupported(info.shape)
            if why is None:
                search = f", {scheme.scale_search} scale search" if scheme.scale_search else ""
                d.action, d.reason = (
                    QUANTIZE,
                    f"Linear weight -> {scheme.config_group_name} g{scheme.group_size}{search}",
                )
            else:
                d.reason = why
        decisions.append(d)

    _enforce_fused_agreement(decisions)

    ignore_out = list(dict.fromkeys([*user_ignore, *preset_entries]))
    for d in decisions:
        if d.action == QUANTIZE:
            out, inp = d.shape
            src_dtype = "BF16" if d.dtype in FP8_FLOATS else d.dtype
            d.outputs = scheme.outputs(d.module, (out, inp), src_dtype)
            if d.dtype in FP8_FLOATS:
                d.scale = f"{d.module}.{fmt.scale_param}"
        elif d.action == KEEP:
            if d.dtype in FP8_FLOATS and names.split(d.name)[1] == names.WEIGHT:
                d.action, d.reason = DECODE, d.reason + "; FP8 decoded to BF16"
                d.scale = f"{d.module}.{fmt.scale_param}"
                d.outputs = [TensorSpec(d.name, "BF16", d.shape)]
            else:
                d.outputs = [TensorSpec(d.name, d.dtype, d.shape)]
            if _is_linear_like_weight(d) and not any(matches(e, d.module) for e in ignore_out):
                ignore_out.append(d.module)
    # HF builds lm_head as an nn.Linear (even when tied), so a "Linear" target would claim it.
    has_head = any(names.is_lm_head(d.module) for d in decisions) or ckpt.config.get("tie_word_embeddings")
    if has_head and not any(matches(e, "lm_head") for e in ignore_out):
        ignore_out.append("lm_head")
    return Plan(ckpt, scheme, fmt, decisions, ignore_out, preset)


def _ignored_by(module: str, user: list[str], preset_entries: tuple[str, ...], preset: str | None) -> str | None:
    """The ignore entry that keeps `module` (directly or through its fused name), as a reason."""
    candidates = [module]
    fused = names.fused_partners(module)
    if fused is not None:
        candidates.append(fused[0])
    for entry in user:
        if any(matches(entry, c) for c in candidates):
            return f"--ignore {entry}"
    for entry in preset_entries:
        if any(matches(entry, c) for c in candidates):
            assert preset is not None
            return f"preset {preset}: {PRESETS[preset].why}"
    return None


def _enforce_fused_agreement(decisions: list[Decision]) -> None:
    """Keep every shard of a fused layer if any shard present is kept."""
    by_module = {d.module: d for d in decisions if names.split(d.name)[1] == names.WEIGHT}
    groups: dict[str, list[Decision]] = defaultdict(list)
    for module, d in by_module.items():
        fused = names.fused_partners(module)
        if fused is not None:
            groups[fused[0]].append(d)
    for fused_name, members in groups.items():
        kept = [d for d in members if d.action != QUANTIZE]
        if kept and len(kept) < len(members):
            first = names.leaf(kept[0].module)
            for d in members:
                if d.action == QUANTIZE:
                    d.action = KEEP
                    d.reason = f"kept with {first} ({kept[0].reason}): vLLM loads {names.leaf(fused_name)} as one layer"


def _is_linear_like_weight(d: Decision) -> bool:
    """A kept weight that vLLM would build as a Linear layer (so it must be listed in ignore)."""
    module, param = names.split(d.name)
    if len(d.shape) == 3 and names.category(d.name) == names.ROUTED_EXPERTS:
        return True
    if param != names.WEIGHT or len(d.shape) != 2:
        return False
    return not (names.is_norm(module) or names.is_embedding(module) or names.is_lm_head(module))
