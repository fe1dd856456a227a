"""Deciding, for every tensor of a checkpoint, what the quantized checkpoint holds in its place.

The rules, in order: quantization partners of FP8 inputs are consumed; 2-D `*.weight` tensors of
Linear-like modules are targets unless they are embeddings, `lm_head`, norms or MoE routers, or
are ignored (exact names or `re:` regexes, matched as vLLM matches them, against module names and
the fused names vLLM loads, such as `qkv_proj`), or their input size does not fit the group size.
Shards of a fused layer (q/k/v, gate/up) are quantized together or kept together, because vLLM
refuses a fused layer whose shards disagree; a layer vLLM would refuse to build under its scheme
(FP8 blocks that a fused shard does not fill) is kept whole, so that the output loads. Every
Linear-like module left unquantized goes into the config's `ignore`, because vLLM expects
`weight_packed` for any targeted Linear it finds; under a preset whose runtime renames the
modules (EAGLE3), by its name within its layer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from weightsmith.calibration import derived
from weightsmith.calibration.derived import Calibration
from weightsmith.core.errors import CheckpointError, WeightsmithError
from weightsmith.core.terminal import echo
from weightsmith.formats.architecture import SHAPE, UNEXPECTED_BIAS, Architecture
from weightsmith.formats.source import SourceFormat, detect_source_format
from weightsmith.formats.targets import LINEAR, Targets
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant.fp8 import Block
from weightsmith.quantization.config_groups import mixed_config
from weightsmith.quantization.presets import PRESETS
from weightsmith.quantization.recipe import Recipe, Rule
from weightsmith.safetensors.dtypes import DENSE_FLOATS, DTYPES, FP8_FLOATS, from_numpy
from weightsmith.safetensors.writer import TensorSpec
from weightsmith.schemes import Scheme

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.io.hub import HubSource
    from weightsmith.quantization.request import Resolved

QUANTIZE, KEEP, DECODE, DROP = "quantize", "keep", "decode", "drop"


@dataclass(slots=True)
class Decision:
    """What becomes of one source tensor (slots: a checkpoint may hold hundreds of thousands)."""

    name: str
    shard: str
    action: str
    reason: str
    dtype: str
    shape: tuple[int, ...]
    outputs: list[TensorSpec] = field(default_factory=list)
    scale: str | None = None  # FP8 inputs: the scale tensor consumed by decoding
    scale_block: Block | None = None  # FP8 inputs: the weight block each scale element covers
    rule: Rule | None = None  # the recipe rule that quantizes it (QUANTIZE only)
    module: str = field(init=False)
    param: str = field(init=False)

    def __post_init__(self) -> None:
        self.module, self.param = names.split(self.name)

    @property
    def nbytes(self) -> int:
        return DTYPES[self.dtype].nbytes(math.prod(self.shape)) or 0


@dataclass
class Plan:
    """Decisions for every tensor, the output shards, and the config's ignore list."""

    source: Checkpoint
    recipe: Recipe
    source_format: SourceFormat
    decisions: list[Decision]
    ignore: list[str]
    preset: str | None = None
    #: The statistics the calibrated values below were derived from, if any.
    calibration: Calibration | None = None
    #: `--kv-cache`: the KV-cache format declared, with scales in `values` (None: not declared).
    kv_cache: str | None = None
    #: Tensors the plan computed itself, by name: static activation scales and KV-cache scales
    #: (small: one value per module). Each is in some decision's outputs or in `added`.
    values: dict[str, np.ndarray] = field(default_factory=dict)
    #: Output shard -> tensors that stand for no source tensor (KV-cache scales).
    added: dict[str, list[TensorSpec]] = field(default_factory=dict)
    #: `--pre-pass`: the transform applied to the weights before quantizing them (`quantization.prepasses`), if any.
    pre_pass: str | None = None
    #: Unquantized tensors whose values the pre-pass changes (written, not copied from the source).
    changed: list[str] = field(default_factory=list)
    #: `--pre-pass auto` that did not apply: why, in words (None where it applied or was not asked).
    pre_pass_skipped: str | None = None
    #: The checked request the plan was made for (`request.open_plan`); what `library.write` carries out.
    request: Resolved | None = None
    #: The Hub repository and commit the source was resolved from, when SRC was a Hub id.
    hub: HubSource | None = None

    def non_finite(self, name: str, row: int, column: int) -> CheckpointError:
        """The refusal of weight `name`, which holds a NaN or Inf at (row, column): one line, the same
        whether the quantizer or the pre-pass, which reads the weights first, comes upon it."""
        return CheckpointError(
            f"has a NaN or Inf at row {row}, column {column}; cannot quantize it",
            file=self.source.path(self.source.tensors[name].shard),
            tensor=name,
            code="values.non-finite",
        )

    def shards(self) -> dict[str, list[TensorSpec]]:
        """Output shard file name -> the tensors it holds (same file names as the source)."""
        out: dict[str, list[TensorSpec]] = {shard: [] for shard in self.source.headers}
        for d in self.decisions:
            out[d.shard].extend(d.outputs)
        for shard, specs in self.added.items():
            out[shard].extend(specs)
        return out

    @property
    def bytes_in(self) -> int:
        return self.source.tensor_bytes

    @property
    def bytes_out(self) -> int:
        return sum(s.nbytes for specs in self.shards().values() for s in specs)

    def count(self, action: str) -> int:
        return sum(d.action == action for d in self.decisions)

    def unmatched_targets(self) -> list[tuple[int, str]]:
        """(rule number from 1, target) for every recipe target that matches no Linear-like weight."""
        modules = [d.module for d in self.decisions if d.param == names.WEIGHT and len(d.shape) == 2]
        out = []
        for i, rule in enumerate(self.recipe.rules):
            for target in rule.targets:
                alone = Rule((target,), rule.scheme)
                if not any(alone.matches(m) for m in modules):
                    out.append((i + 1, target))
        return out

    def breakdown(self) -> dict[str, dict[str, dict[str, int]]]:
        """Predicted bytes in and out and parameters, by recipe rule and by source category.

        Rules are named `rule N: SCHEME` (and `kept` for what no rule quantized); a quantized
        weight's scales and packing count towards its own category.
        """
        by: dict[str, dict[str, dict[str, int]]] = {"rule": {}, "category": {}}
        number = {id(r): i + 1 for i, r in enumerate(self.recipe.rules)}
        for d in self.decisions:
            if d.action == DROP:
                continue
            rule = f"rule {number[id(d.rule)]}: {d.rule.scheme.name}" if d.rule is not None else "kept"
            out = sum(o.nbytes for o in d.outputs)
            for kind, key in (("rule", rule), ("category", names.category(d.name))):
                row = by[kind].setdefault(key, {"tensors": 0, "params": 0, "bytes_in": 0, "bytes_out": 0})
                row["tensors"] += 1
                row["params"] += math.prod(d.shape)
                row["bytes_in"] += d.nbytes
                row["bytes_out"] += out
        rule_order = [f"rule {i + 1}: {r.scheme.name}" for i, r in enumerate(self.recipe.rules)] + ["kept"]
        by["rule"] = {k: by["rule"][k] for k in rule_order if k in by["rule"]}
        by["category"] = {k: by["category"][k] for k in names.CATEGORIES if k in by["category"]}
        return by

    @property
    def scheme(self) -> Scheme:
        """The first rule's scheme: the only one, unless the recipe mixes schemes."""
        return self.recipe.rules[0].scheme

    def schemes(self) -> list[Scheme]:
        """Each rule's scheme, in rule order (one entry per rule)."""
        return [r.scheme for r in self.recipe.rules]

    def quantization_config(self) -> dict[str, Any]:
        if not self.recipe.mixed:
            config = self.scheme.quantization_config(self.ignore)
        else:
            quantized = {d.module: d.rule for d in self.decisions if d.action == QUANTIZE and d.rule is not None}
            config = mixed_config(self.recipe, quantized, self.ignore)
        if self.kv_cache is not None:
            config["kv_cache_scheme"] = derived.kv_cache_scheme(self.kv_cache)
        return config


def _fp8_weights(ckpt: Checkpoint, fmt: SourceFormat) -> dict[str, Block | None]:
    """FP8 `*.weight` tensors -> the block their scale covers (None: no values, nothing to decode).

    Every one is checked from the headers before anything is planned: a dense source has no scale
    to decode one with, a weight that is not `[out, in]` has no decoder, and its scale must be
    usable (`SourceFormat.scale_block`).
    """
    found: dict[str, Block | None] = {}
    for name, ref in ckpt.tensors.items():
        info = ref.info
        module, param = names.split(name)
        if param != names.WEIGHT or info.dtype.code not in FP8_FLOATS:
            continue
        where: dict[str, Any] = {"file": ckpt.path(ref.shard), "tensor": name, "code": "source.fp8-weight"}
        if fmt.kind == "dense":
            raise CheckpointError(
                "is FP8 but config.json declares no FP8 quantization, so there is no scale to decode it", **where
            )
        if not module:
            raise CheckpointError("is FP8 but has no module name, so it has no scale to decode it", **where)
        if info.numel == 0:
            found[name] = None
            continue
        if len(info.shape) != 2:
            raise CheckpointError(
                f"is a {len(info.shape)}-D FP8 weight {list(info.shape)}; only (out, in) FP8 weights can be decoded",
                **where,
            )
        found[name] = fmt.scale_block(ckpt, name)
    return found


def _refuse_collisions(ckpt: Checkpoint, decisions: list[Decision], added: dict[str, list[TensorSpec]]) -> None:
    """Refuse a source tensor whose name is one the output writes for a quantized weight.

    A source holding `X.weight` and `X.weight_scale` without declaring a quantization is
    contradictory: quantizing X would overwrite that tensor or write two under one name, and
    keeping both would leave a module `verify` reports as quantized-but-ignored. We do not guess
    which was meant; the line names the tensor, and `--ignore X` keeps X as it is.
    """
    kept = {s.name: d for d in decisions if d.action != QUANTIZE for s in d.outputs}
    for spec in (s for specs in added.values() for s in specs):
        attention = spec.name.rpartition(".")[0]
        other = next((kept[n] for k in ("k", "v") for n in names.kv_scale_names(attention, k) if n in kept), None)
        if other is not None:
            raise CheckpointError(
                "is a KV-cache scale the source already has; --kv-cache would write a second one",
                file=ckpt.path(other.shard),
                tensor=other.name,
                code="source.name-collision",
            )
    for d in decisions:
        if d.action != QUANTIZE:
            continue
        for spec in d.outputs:
            other = kept.get(spec.name)
            if other is not None:
                raise CheckpointError(
                    f"has the name quantizing {d.name} would write; pass --ignore {d.module} to keep both as they are",
                    file=ckpt.path(other.shard),
                    tensor=other.name,
                    code="source.name-collision",
                )


def _keep_reason(name: str, dtype: str, shape: tuple[int, ...]) -> str | None:
    """Why a tensor is not a quantization target by its nature, or None if it is a target."""
    module, param = names.split(name)
    if math.prod(shape) == 0:
        return "no values (a zero-size dimension): nothing to quantize"
    if param == names.WEIGHT and not module:
        return "no module name: quantized tensors are named after their module"
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
    if len(shape) not in (0, 2):  # a 0-d weight a rule claims is refused (`_scalar_target`), not kept quietly
        return f"{len(shape)}-D tensor"
    return None


def _rule_words(recipe: Recipe, rule: Rule) -> str:
    """How a message names `rule`: by its number (its place, not the first equal rule's), and as
    `--scheme` where it is that option's one rule."""
    number = next(i for i, r in enumerate(recipe.rules, 1) if r is rule)
    if recipe.file is None and len(recipe.rules) == 1 and rule.targets == (LINEAR,):
        return f"--scheme {rule.scheme.name} (rule {number}: every Linear weight)"
    return f"rule {number}"


def _scalar_target(ckpt: Checkpoint, shard: str, name: str, recipe: Recipe, rule: Rule) -> CheckpointError:
    """The refusal of a 0-d `*.weight` that `rule` claims: a scalar has no rows or columns to quantize,
    and kept unlisted it would leave vLLM expecting a quantized weight for its module."""
    module = names.split(name)[0]
    return CheckpointError(
        f"is a 0-d tensor (a scalar), but {_rule_words(recipe, rule)} names it as a Linear weight to quantize: only "
        f"2-D weights can be; pass --ignore {module} to keep it as it is",
        file=ckpt.path(shard),
        tensor=name,
        code="source.scalar-target",
    )


def shape_refusal(ckpt: Checkpoint, arch: Architecture, d: Decision) -> CheckpointError | None:
    """The refusal of `d`'s tensor where config.json contradicts its shape, or where it is a bias the
    architecture does not build (`verify`'s `arch.shape` and `arch.unexpected-bias`); None where neither."""
    want = arch.expected(d.name)
    if want is not None and d.shape != want.shape:
        why, code = f"shape {list(d.shape)}, expected {list(want.shape)} ({want.why} in config.json)", SHAPE
    elif (unbuilt := arch.unbuilt_bias(d.name)) is not None:
        why, code = unbuilt, UNEXPECTED_BIAS
    else:
        return None
    return CheckpointError(why, file=ckpt.path(d.shard), tensor=d.name, code=code)


def _refuse_contradicted_shapes(ckpt: Checkpoint, decisions: list[Decision]) -> None:
    """Refuse, for an architecture `formats.architecture` knows, a norm or bias whose shape config.json
    contradicts, or a bias the architecture does not build: vLLM would refuse the output, or skip the
    bias and serve another model, and the pre-pass would fold its scales into tensors of the wrong size.

    Weights are carried or quantized as they are (`verify` reports a shape config.json contradicts);
    the pre-pass checks those it folds (`PrePass.check`).
    """
    arch = Architecture.of(ckpt.config)
    if arch is None:
        return
    for d in decisions:
        if d.param == names.BIAS or names.is_norm(d.module):
            refusal = shape_refusal(ckpt, arch, d)
            if refusal is not None:
                raise refusal


#: The most rules, and targets of each, a refusal of a recipe that matches nothing lists.
_LISTED = 3


def _refuse_idle_recipe(plan: Plan) -> None:
    """Refuse a plan that quantizes nothing: the output would be a "quantized" checkpoint with nothing
    quantized (which `eval` and vLLM then refuse). Either no target of the recipe matches a Linear-like
    weight, or every weight one matches is kept (a group size that divides none of their input widths,
    say). A target that matches nothing beside one that does is a warning (`request.plan_warnings`);
    a plan that decodes FP8 weights or adds KV-cache scales writes something and is not refused here."""
    if plan.count(QUANTIZE) or plan.count(DECODE) or plan.added:
        return
    unmatched = plan.unmatched_targets()
    if len(unmatched) < sum(len(rule.targets) for rule in plan.recipe.rules):
        refused = (  # a Linear weight its rule's scheme cannot take
            d
            for d in plan.decisions
            if d.param == names.WEIGHT
            and _keep_reason(d.name, d.dtype, d.shape) is None
            and (rule := plan.recipe.rule_for(d.module)) is not None
            and rule.scheme.unsupported(d.shape) is not None
        )
        first = next(refused, None)
        example = f" (the first: {first.module}, {first.reason})" if first is not None else ""
        raise WeightsmithError(
            f"keeps every Linear-like weight the recipe targets{example}, so nothing would be quantized",
            file=plan.recipe.file or plan.source.root,
            code="recipe.nothing-quantized",
        )
    rules = plan.recipe.rules
    listed = []
    for rule in rules[:_LISTED]:
        shown = ", ".join(echo(t) for t in rule.targets[:_LISTED])
        more = f" and {len(rule.targets) - _LISTED:,} more" if len(rule.targets) > _LISTED else ""
        listed.append(f"{_rule_words(plan.recipe, rule)} (targets {shown}{more})")
    if len(rules) > _LISTED:
        listed.append(f"{len(rules) - _LISTED:,} more rules")
    verb = "matches" if len(rules) == 1 else "match"
    raise WeightsmithError(
        f"{'; '.join(listed)} {verb} no Linear-like weight in {plan.source.root}, so nothing would be quantized",
        file=plan.recipe.file or plan.source.root,
        code="recipe.unmatched",
    )


def build_plan(
    ckpt: Checkpoint,
    scheme: Scheme | Recipe,
    ignore: list[str] | None = None,
    preset: str | None = None,
    calibration: Calibration | None = None,
    kv_cache: str | None = None,
) -> Plan:
    """Decide every tensor's fate under one scheme or a recipe of several.

    `calibration` (statistics already checked against `ckpt`) gives calibrated schemes their static
    activation scales and `kv_cache` ("fp8") its KV-cache scales. Raises `WeightsmithError` for an
    unknown preset, a bad regex, a recipe that splits what vLLM loads as one layer or matches nothing at
    all, a rule claiming a 0-d weight, a norm or bias config.json contradicts (`_refuse_contradicted_shapes`),
    or missing statistics.
    """
    recipe = scheme if isinstance(scheme, Recipe) else Recipe.single(scheme)
    user_ignore = list(ignore or [])
    preset_entries: tuple[str, ...] = ()
    if preset is not None:
        if preset not in PRESETS:
            raise WeightsmithError(f"unknown preset {echo(preset)} (choose from {', '.join(PRESETS)})", code="usage")
        preset_entries = PRESETS[preset].ignore
    # every entry compiled up front: a malformed regex is refused before anything is planned
    keepers = _Keepers(
        Targets(user_ignore, "--ignore"),
        Targets(recipe.ignore, "ignore", recipe.file),
        Targets(preset_entries, f"preset {preset}"),
        preset,
    )
    fmt = detect_source_format(ckpt)
    fp8_weights = _fp8_weights(ckpt, fmt)
    consumed = {f"{names.split(w)[0]}.{fmt.scale_param}": w for w in fp8_weights}  # scale -> its weight

    decisions: list[Decision] = []
    for name, ref in ckpt.tensors.items():
        info = ref.info
        d = Decision(name, ref.shard, KEEP, "", info.dtype.code, info.shape)
        module, param = d.module, d.param
        if name in consumed:
            d.action, d.reason = DROP, f"FP8 scale of {consumed[name]}, consumed by decoding"
        elif fmt.kind != "dense" and param == names.INPUT_SCALE:
            d.action, d.reason = DROP, "FP8 activation scale; the output quantizes weights only"
        else:
            why = _keep_reason(name, info.dtype.code, info.shape)
            if why is not None and preset is not None and names.category(name) in PRESETS[preset].requires_kept:
                why += f"; preset {preset}: {PRESETS[preset].why}"
            if why is None:
                why = keepers.reason(module)
            rule = recipe.rule_for(module) if why is None else None
            if why is None and rule is None:
                why = "no recipe rule targets it"
            if why is None and rule is not None and not info.shape:
                raise _scalar_target(ckpt, ref.shard, name, recipe, rule)
            if why is None and rule is not None:
                why = rule.scheme.unsupported(info.shape)
            if why is None and rule is not None:
                d.action, d.reason, d.rule = QUANTIZE, f"Linear weight -> {rule.scheme.describe()}", rule
            else:
                d.reason = why or ""
        if name in fp8_weights:
            d.scale, d.scale_block = f"{module}.{fmt.scale_param}", fp8_weights[name]
        decisions.append(d)

    _enforce_fused_agreement(decisions)
    _keep_refused_layers(decisions)
    # The preset whose kept Linears are listed by their name within the layer, if any.
    by_suffix = PRESETS[preset] if preset is not None and PRESETS[preset].ignore_by_suffix else None
    if by_suffix is not None:
        _keep_by_suffix(decisions)
    _refuse_split_layers(decisions)
    _refuse_contradicted_shapes(ckpt, decisions)

    ignore_out = list(dict.fromkeys([*user_ignore, *recipe.ignore, *preset_entries]))
    # Kept modules are added as exact names, so only the given entries need matching: checking each
    # module against the growing list made a checkpoint of many kept Linears quadratic to plan.
    # Under a preset that lists them by suffix, a given entry may match the name on disk but not
    # the runtime's, so the suffix entry is always added.
    given, listed = Targets(ignore_out, "ignore"), set(ignore_out)
    for d in decisions:
        if d.action == QUANTIZE:
            out, inp = d.shape
            src_dtype = "BF16" if d.scale else d.dtype
            assert d.rule is not None
            d.outputs = d.rule.scheme.outputs(d.module, (out, inp), src_dtype)
        elif d.action == KEEP:
            if d.scale:
                d.action, d.reason = DECODE, d.reason + "; FP8 decoded to BF16"
                d.outputs = [TensorSpec(d.name, "BF16", d.shape)]
            else:
                d.outputs = [TensorSpec(d.name, d.dtype, d.shape)]
            if not _is_linear_like_weight(d):
                continue
            if by_suffix is not None:
                entry = names.suffix_entry(d.module)
                d.reason += f"; listed in ignore as {entry}, because {by_suffix.runtime_names}"
            elif given.matches(d.module):
                continue
            else:
                entry = d.module
            if entry not in listed:
                ignore_out.append(entry)
                listed.add(entry)
    values = _input_params(decisions, calibration)
    added = _kv_scales(ckpt, decisions, calibration, kv_cache, values)
    if calibration is not None and not values:
        raise WeightsmithError(
            "is used by calibrated schemes (a static activation scale) and --kv-cache; this run has neither",
            file=calibration.path,
            code="usage",
        )
    _refuse_collisions(ckpt, decisions, added)
    # HF builds lm_head as an nn.Linear (even when tied), so a "Linear" target would claim it.
    has_head = any(names.is_lm_head(d.module) for d in decisions) or ckpt.config.get("tie_word_embeddings")
    if has_head and not Targets(ignore_out, "ignore").matches("lm_head"):
        ignore_out.append("lm_head")
    plan = Plan(ckpt, recipe, fmt, decisions, ignore_out, preset, calibration, kv_cache, values, added)
    _refuse_idle_recipe(plan)
    return plan


def _input_params(decisions: list[Decision], cal: Calibration | None) -> dict[str, np.ndarray]:
    """Each calibrated scheme's static activation parameters: the values of tensors its outputs declare."""
    values: dict[str, np.ndarray] = {}
    quantized = {d.module for d in decisions if d.action == QUANTIZE}
    for d in decisions:
        if d.action != QUANTIZE or d.rule is None or not d.rule.scheme.NEEDS_CALIBRATION:
            continue
        scheme = d.rule.scheme
        found = derived.require(cal, f"scheme {scheme.name}")
        absmax = derived.input_absmax(found, d.module, quantized)
        declared = {s.name: s for s in d.outputs}  # the scheme's layout declares its activation scales
        for param, value in scheme.input_params(absmax, "BF16" if d.scale else d.dtype):
            name = f"{d.module}.{param}"
            spec = declared[name]
            assert (spec.dtype, tuple(spec.shape)) == (from_numpy(value.dtype).code, value.shape), (spec, value)
            values[name] = value
    return values


def _kv_scales(
    ckpt: Checkpoint,
    decisions: list[Decision],
    cal: Calibration | None,
    kv_cache: str | None,
    values: dict[str, np.ndarray],
) -> dict[str, list[TensorSpec]]:
    """`--kv-cache`: a k and a v scale per attention layer, in the shard of its K projection."""
    if kv_cache is None:
        return {}
    if kv_cache not in derived.KV_CACHE_FORMATS:
        raise WeightsmithError(
            f"unknown --kv-cache {echo(kv_cache)} (choose from {', '.join(derived.KV_CACHE_FORMATS)})", code="usage"
        )
    found = derived.require(cal, f"--kv-cache {kv_cache}")
    attention = derived.attention_modules([d.name for d in decisions])
    if not attention:
        raise CheckpointError(
            "has no k_proj or qkv_proj weight (no attention, or another kind: DeepSeek's latent attention "
            "caches one compressed vector, not K and V), so --kv-cache has nothing to scale",
            file=ckpt.root,
            code="usage",
        )
    home: dict[str, str] = {}  # attention module -> the shard of its K projection
    for d in decisions:
        if d.param == names.WEIGHT and names.leaf(d.module) in names.ATTENTION_KEY_PROJECTIONS:
            home.setdefault(d.module.rpartition(".")[0], d.shard)
    added: dict[str, list[TensorSpec]] = defaultdict(list)
    for name, value in derived.kv_scales(found.stats.kv, attention, found.path).items():
        added[home[name.rpartition(".")[0]]].append(TensorSpec(name, "F32", value.shape))
        values[name] = value
    return dict(added)


@dataclass(frozen=True)
class _Keepers:
    """The ignore lists a plan honours, in the order their reasons are given: `--ignore`, the recipe's, the preset's."""

    user: Targets
    recipe: Targets
    preset_entries: Targets
    preset: str | None

    def reason(self, module: str) -> str | None:
        """The entry that keeps `module` (directly or through its fused name), as a reason."""
        fused = names.fused_partners(module)
        candidates = (module, fused[0]) if fused is not None else (module,)
        if (entry := self.user.first(*candidates)) is not None:
            return f"--ignore {entry}"
        if (entry := self.recipe.first(*candidates)) is not None:
            return f"recipe ignore {entry}"
        if self.preset is not None and self.preset_entries.matches(*candidates):
            return f"preset {self.preset}: {PRESETS[self.preset].why}"
        return None


def _enforce_fused_agreement(decisions: list[Decision]) -> None:
    """Keep every shard of a fused layer if any shard present is kept: q/k/v and gate/up, and every
    projection of a layer's routed experts, which vLLM builds as one FusedMoE layer and refuses to build
    from projections of two schemes (a down_proj too narrow for the group size, say)."""
    by_module = {d.module: d for d in decisions if d.param == names.WEIGHT}
    groups: dict[tuple[str, str], list[Decision]] = defaultdict(list)  # (layer, why it is one) -> members
    for module, d in by_module.items():
        fused = names.fused_partners(module)
        if fused is not None:
            groups[(fused[0], f"vLLM loads {names.leaf(fused[0])} as one layer")].append(d)
        experts = names.expert_layer(module)
        if experts is not None:
            why = f"vLLM builds {experts} as one FusedMoE layer, every expert's projections under one scheme"
            groups[(experts, why)].append(d)
    for (_, why), members in groups.items():
        kept = [d for d in members if d.action != QUANTIZE]
        if kept and len(kept) < len(members):
            first = kept[0]
            for d in members:
                if d.action == QUANTIZE:
                    d.action, d.rule = KEEP, None
                    d.reason = f"kept with {names.leaf(first.module)} ({first.reason}): {why}"


def _keep_refused_layers(decisions: list[Decision]) -> None:
    """Keep, in the source dtype, every Linear of a layer vLLM would refuse to build under its scheme.

    FP8 blocks are the case: vLLM refuses the whole checkpoint at load when a fused shard other than
    the last (q_proj of qkv_proj, gate_proj of gate_up_proj) is not a whole number of blocks tall,
    so such a layer is kept, every shard together, and listed in ignore. Runs after
    `_enforce_fused_agreement`, so a layer is quantized whole or not at all; a layer whose shards
    name different rules is left for `_refuse_split_layers` to refuse. Routed experts are left out:
    vLLM builds all of a layer's experts into one FusedMoE layer, under a rule of its own.
    """
    layers: dict[str, list[Decision]] = defaultdict(list)
    for d in decisions:
        if d.action == QUANTIZE and d.param == names.WEIGHT and names.expert_layer(d.module) is None:
            layers[names.linear_layer(d.module)[0]].append(d)
    for layer, members in layers.items():
        rules = {id(d.rule): d.rule for d in members}
        if len(rules) != 1 or (rule := next(iter(rules.values()))) is None:
            continue
        order = names.linear_layer(members[0].module)[1]
        shards = sorted(members, key=lambda d: order.index(d.module))
        why = rule.scheme.layer_refusal(layer, [(d.module, d.shape[0]) for d in shards])
        if why is not None:
            for d in members:
                d.action, d.rule, d.reason = KEEP, None, f"kept unquantized, because {why}"


def _keep_by_suffix(decisions: list[Decision]) -> None:
    """Keep every Linear that a kept Linear's suffix entry also matches.

    The entry names a module within its layer, so in a draft of several layers it matches that
    module in each; vLLM would find each one ignored and refuse a quantized weight there.
    """
    kept: dict[str, Decision] = {}
    for d in decisions:
        if d.action == KEEP and _is_linear_like_weight(d):
            kept.setdefault(names.suffix_entry(d.module), d)
    suffixes = Targets(kept, "ignore")
    for d in decisions:
        if d.action != QUANTIZE:
            continue
        entry = suffixes.first(d.module)
        if entry is not None:
            first = kept[entry]
            d.action, d.rule = KEEP, None
            d.reason = f"kept with {first.module} ({first.reason}): one ignore entry lists both"


def _refuse_split_layers(decisions: list[Decision]) -> None:
    """Refuse a recipe that gives two schemes to what vLLM loads as one layer.

    q/k/v and gate/up shards are one fused Linear; the experts of one MoE layer are one FusedMoE
    layer, all projections of all experts together. Each must take one scheme.
    """
    layers: dict[str, dict[Rule, Decision]] = defaultdict(dict)
    for d in decisions:
        if d.action != QUANTIZE or d.rule is None:
            continue
        fused = names.fused_partners(d.module)
        if fused is not None:
            layers[fused[0]].setdefault(d.rule, d)
        expert_layer = names.expert_layer(d.module)
        if expert_layer is not None:
            layers[expert_layer].setdefault(d.rule, d)
    for layer, by_rule in layers.items():
        if len(by_rule) > 1:
            (a, da), (b, db) = list(by_rule.items())[:2]
            raise WeightsmithError(
                f"the recipe gives {da.module} {a.scheme.name} but {db.module} {b.scheme.name}; vLLM loads "
                f"{layer} as one layer, so one rule must cover all of it",
                code="recipe.split-layer",
            )


def _is_linear_like_weight(d: Decision) -> bool:
    """A kept weight that vLLM would build as a Linear layer (so it must be listed in ignore)."""
    if len(d.shape) == 3 and names.category(d.name) == names.ROUTED_EXPERTS:
        return True
    if d.param != names.WEIGHT or len(d.shape) != 2:
        return False
    return not (names.is_norm(d.module) or names.is_embedding(d.module) or names.is_lm_head(d.module))
