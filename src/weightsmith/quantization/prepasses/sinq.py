"""`--pre-pass sinq`: SINQ's column scales folded into the operation before each Linear, then quantized as usual.

SINQ (arXiv 2509.22944) quantizes `W / diag(t)` with a per-input-column scale `t` found from the weight
alone (`quant.sinkhorn`), and multiplies the layer's input by `t`. Stored that way it needs a second
scale tensor no runtime loads, so here `t` is folded into whatever produces the input, which leaves
the model's function unchanged before quantization and the checkpoint in the ordinary one-scale format:

- q/k/v_proj read `input_layernorm`'s output, gate/up_proj `post_attention_layernorm`'s: one joint
  `t` for the projections sharing a norm (balanced on their stacked rows), multiplied into the norm's
  weight (Llama, Mistral and Qwen2 multiply by the weight; "1 + weight" norms such as Gemma's are refused).
  The family is the class vLLM builds, `architectures[0]`; a `model_type` naming another model is refused,
  since transformers would build that one.
- down_proj reads `act(gate) * up`: its `t` multiplies up_proj's rows (and bias).
- o_proj reads the attention output, `softmax . V`: its `t` multiplies v_proj's rows (and bias). Query
  heads that share a KV head read the same V rows, so their o_proj columns share one `t`, balanced on
  their columns stacked as rows.

down's and o's scales are folded first, as in the reference's pre-pass, so that up's and v's new rows
take part in the joint balancing of their own columns. A norm weight is stored in its dtype, so each
column's `t` is taken as the stored norm over the original one: the fold is then exact up to the
balanced weight's own rounding. One decoder layer is read at a time; the pipeline then reads each
weight's rows through `Balance.apply`.

Every shape a fold relies on is the one config.json implies (`formats.architecture`): the plan has
refused a norm or bias that config.json contradicts, `check` refuses a projection it contradicts, and a
config whose sizes it cannot check them against.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from weightsmith.core.errors import CheckpointError, WeightsmithError
from weightsmith.core.terminal import echo
from weightsmith.families.base import NORMS
from weightsmith.formats.architecture import ARCHITECTURES as FAMILIES
from weightsmith.formats.architecture import (
    LAYER,
    PROJECTIONS,
    SHAPE,
    Architecture,
    config_sizes,
    contradiction,
    first_architecture,
)
from weightsmith.formats.source import OriginalWeights
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.quant import sinkhorn
from weightsmith.quantization.plan import QUANTIZE, Plan, shape_refusal
from weightsmith.quantization.prepasses.base import PrePass, register
from weightsmith.schemes.base import Scheme

#: The classes (`architectures[0]`, what vLLM builds) whose decoder layers are pre-norm Llama blocks
#: with norms that multiply by their weight: the families that say the pre-pass may fold into their norms.
ARCHITECTURES = tuple(arch for arch, family in FAMILIES.items() if family.foldable_norms == NORMS)
#: The code of the refusal of a config that contradicts itself.
CONTRADICTION = "config.contradiction"
#: What `--pre-pass auto` refuses rather than skips: where the pre-pass would fold, a config that
#: contradicts itself or a weight whose shape config.json contradicts (`plan.shape_refusal`).
REFUSED_UNDER_AUTO = (CONTRADICTION, SHAPE)
_KNOWN = {f"{m}.{names.WEIGHT}" for m in PROJECTIONS + NORMS} | {f"{m}.{names.BIAS}" for m in PROJECTIONS}


def refusal(where: str, message: str) -> WeightsmithError:
    return WeightsmithError(f"--pre-pass sinq: {where} {message}", code="usage")


@dataclass(frozen=True)
class Heads:
    """How o_proj's input columns map onto v_proj's rows."""

    kv: int
    per_kv: int  # query heads per KV head
    dim: int


def _heads(arch: Architecture) -> Heads:
    heads, kv = arch.sizes["num_attention_heads"], arch.sizes["num_key_value_heads"]
    if heads % kv:
        raise refusal("config.json", f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    return Heads(kv, heads // kv, arch.sizes["head_dim"])


def _architecture(plan: Plan) -> Architecture:
    """The architecture the folds follow: the class vLLM builds (`architectures[0]`), one whose norms
    multiply by their weight, with every size the shapes are checked against; else a one-line refusal."""
    config = plan.source.config
    problem = contradiction(config)
    if problem is not None:
        raise WeightsmithError(
            f"{problem}; the pre-pass folds scales into the norms of the class vLLM builds, so it cannot run on "
            "this config (--pre-pass none quantizes without folding)",
            file=plan.source.root / CONFIG_FILE,
            code=CONTRADICTION,
        )
    name = first_architecture(config)
    if name not in ARCHITECTURES:
        what = f"architectures[0] {echo(name)}" if name is not None else "architectures[0] (none given)"
        raise refusal(
            "config.json",
            f"{what} is not one whose norms are known to multiply by their weight "
            f"(supported: {', '.join(ARCHITECTURES)})",
        )
    sizes, missing = config_sizes(config)
    if missing is not None:
        raise refusal(
            "config.json", f"has no usable {missing}, so the shapes the folds rely on cannot be checked against it"
        )
    return Architecture(name, FAMILIES[name], config, sizes)


def check(plan: Plan) -> list[str]:
    """The decoder layers (`model.layers.N`) the pre-pass folds, from the headers; a one-line refusal
    for an architecture, a tensor or a scheme it cannot fold exactly, or KV-cache scales it would
    invalidate (they are measured on SRC, and the fold rescales v_proj's rows)."""
    return _checked(plan)[0]


def _checked(plan: Plan) -> tuple[list[str], Heads]:
    """`check`'s layers, with how o_proj's columns map onto v_proj's rows (the folds need both)."""
    if plan.kv_cache is not None:
        raise refusal(
            "cannot run with --kv-cache:",
            "KV-cache scales measured on SRC would not fit the v_proj rows the fold rescales; leave out --kv-cache "
            "and run `weightsmith calibrate-kv` on the output (it measures the balanced model), or use --pre-pass none",
        )
    arch = _architecture(plan)
    heads = _heads(arch)  # query heads that do not group evenly over the KV heads are refused here
    layers: dict[str, set[str]] = {}
    for name in plan.source.tensors:
        found = LAYER.match(name)
        if found is None:
            continue
        if found.group(2) not in _KNOWN:
            raise refusal(f"tensor {name}", "has no known fold (only Llama/Qwen2 attention, MLP and norms are)")
        layers.setdefault(f"model.layers.{found.group(1)}", set()).add(found.group(2))
    if not layers:
        raise refusal(str(plan.source.root), "has no decoder layers named model.layers.N")
    decisions = {d.name: d for d in plan.decisions}
    for layer, present in layers.items():
        for part in (f"{m}.{names.WEIGHT}" for m in NORMS + PROJECTIONS):
            if part not in present:
                raise refusal(f"layer {layer}", f"has no {part}, so its scales have nowhere to go")
        for module in PROJECTIONS:
            d = decisions[f"{layer}.{module}.{names.WEIGHT}"]
            if d.action != QUANTIZE or d.rule is None or not takes(d.rule.scheme):
                why = d.reason if d.action != QUANTIZE else f"is quantized as {d.rule.scheme.name if d.rule else '?'}"
                raise refusal(f"tensor {d.name}", f"must be quantized as {' or '.join(_schemes())} ({why})")
            wrong = shape_refusal(plan.source, arch, d)  # (the plan has checked the norms and biases)
            if wrong is not None:
                raise wrong
    return sorted(layers, key=lambda p: int(p.rsplit(".", 1)[1])), heads


def takes(scheme: Scheme) -> bool:
    """A weight-only 4-bit integer scheme with a scale per group: its grid is what the balancing evens out
    (the studies measured it there; quantized activations would see the folded norms' new range)."""
    args = scheme.weight_args()
    return (
        scheme.input_args() is None
        and scheme.num_bits == 4
        and args.get("type") == "int"
        and args.get("strategy") == "group"
    )


def _schemes() -> list[str]:
    """The registered scheme names `takes` accepts, as the refusal lists them."""
    from weightsmith.schemes import REGISTRY, make_scheme

    return [name for name in REGISTRY if takes(make_scheme(name, None, "none"))]


def skipped(plan: Plan) -> str | None:
    """Why `--pre-pass auto` leaves `plan` unbalanced, in words, or None where SINQ applies: what `check`
    refuses, or plain round-to-nearest asked for (`--scale-search none` promises llm-compressor's bytes).

    A config.json that contradicts itself, or a weight to fold whose shape it contradicts, is refused, not
    skipped (`REFUSED_UNDER_AUTO`), unless plain round-to-nearest was asked for: the pre-pass would have
    run, and the output would not be the model config.json describes either way."""
    plain = any(d.rule is not None and d.rule.scheme.scale_search is None for d in plan.decisions if folds(d.name))
    try:
        check(plan)
    except WeightsmithError as exc:
        if exc.code in REFUSED_UNDER_AUTO and not plain:
            raise
        return str(exc).removeprefix("--pre-pass sinq: ")
    if plain:
        return "--scale-search none asks for plain round-to-nearest of the source's weights"
    return None


def folds(name: str) -> bool:
    """Whether `name` is a projection weight of a decoder layer (balanced by the pre-pass)."""
    found = LAYER.match(name)
    return found is not None and found.group(2) in {f"{m}.{names.WEIGHT}" for m in PROJECTIONS}


def changed_tensors(plan: Plan, layers: list[str]) -> list[str]:
    """The unquantized tensors whose values the pre-pass changes: the two norms of every layer, and
    v_proj's and up_proj's biases where there are any (every projection's weight is balanced too)."""
    out = []
    for layer in layers:
        out += [f"{layer}.{n}.{names.WEIGHT}" for n in NORMS]
        out += [f"{layer}.{m}.{names.BIAS}" for m in ("self_attn.v_proj", "mlp.up_proj")]
    return [n for n in out if n in plan.source.tensors]


@dataclass
class Balance:
    """Per weight, the factors its rows are multiplied by and its columns divided by; the new
    values of the unquantized tensors the folds changed, in their own dtype."""

    rows: dict[str, np.ndarray] = field(default_factory=dict)
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)

    def apply(self, name: str, x: np.ndarray, r0: int) -> np.ndarray:
        """Rows [r0, r0 + len(x)) of weight `name` balanced, in `x`'s dtype (the kernels' input dtype)."""
        inv = self.cols.get(name)
        if inv is None:
            return x
        rows = self.rows.get(name)
        return sinkhorn.scale(x, inv, None if rows is None else rows[r0 : r0 + len(x)])


def _scales(rows: list[sinkhorn.Rows], group: int, workers: int) -> np.ndarray:
    """SINQ's column scale of `rows` stacked, tiled by the quantization group (a divisor of the columns)."""
    return sinkhorn.column_scales(rows, math.gcd(group, rows[0].width), workers=workers)


def _finite(plan: Plan, t: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    """`t`, or the quantizer's own one-line refusal of the first weight (by name) holding a NaN or Inf
    that made it non-finite: the error names the weight the source got wrong, not a norm it reached."""
    if np.isfinite(t).all():
        return t
    for name, w in weights.items():
        bad = np.flatnonzero(~np.isfinite(w.astype(np.float32)))
        if len(bad):
            raise plan.non_finite(name, int(bad[0] // w.shape[1]), int(bad[0] % w.shape[1]))
    return t  # finite weights: `balance` names the norm or bias that overflowed


def _o_columns(heads: Heads) -> list[np.ndarray]:
    """Per query head of a KV group, the o_proj columns it reads: column (k, d) of the p-th list is
    query head k * per_kv + p's d-th column, so that the stacked heads of one KV head share a scale."""
    kv, per, dim = heads.kv, heads.per_kv, heads.dim
    base = (np.arange(kv)[:, None] * per * dim + np.arange(dim)[None, :]).reshape(-1)
    return [base + p * dim for p in range(per)]


def _fold_norm(norm: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the norm weight times `t`, stored in its dtype; the `t` it really applies, per column)."""
    g = norm.astype(np.float32)
    stored = (g * t).astype(norm.dtype)
    back = stored.astype(np.float32)
    ok = (g != 0) & (back != 0) & np.isfinite(back)
    return stored, np.where(ok, back / np.where(ok, g, 1), t).astype(np.float32)


def _layer(plan: Plan, heads: Heads, layer: str, workers: int) -> Balance:
    """One decoder layer's folds: its weights read once each in their stored dtype (no float32 copy)."""
    group = {d.module: d.rule.scheme.group_size for d in plan.decisions if d.rule is not None}
    out = Balance()
    with OriginalWeights(plan.source) as reader:

        def weight(module: str) -> np.ndarray:
            return reader.weight(f"{layer}.{module}")

        def tensor(name: str) -> np.ndarray | None:
            full = f"{layer}.{name}"
            return reader.read(full) if full in plan.source.tensors else None

        def gsize(module: str) -> int:
            return int(group[f"{layer}.{module}"])

        # o_proj: columns of query heads sharing a KV head stacked as rows, so they get one scale
        o = weight("self_attn.o_proj")
        t_v = _scales([sinkhorn.Rows(o, columns=c) for c in _o_columns(heads)], gsize("self_attn.o_proj"), workers)
        t_v = _finite(plan, t_v, {f"{layer}.self_attn.o_proj.{names.WEIGHT}": o})
        del o
        t_o = np.repeat(t_v.reshape(heads.kv, 1, heads.dim), heads.per_kv, axis=1).reshape(-1)
        down = weight("mlp.down_proj")
        t_d = _finite(plan, _scales([sinkhorn.Rows(down)], gsize("mlp.down_proj"), workers),
                      {f"{layer}.mlp.down_proj.{names.WEIGHT}": down})  # fmt: skip
        del down
        for module, t in (("self_attn.v_proj", t_v), ("mlp.up_proj", t_d)):
            out.rows[f"{layer}.{module}.{names.WEIGHT}"] = t
            bias = tensor(f"{module}.{names.BIAS}")
            if bias is not None:
                out.values[f"{layer}.{module}.{names.BIAS}"] = (bias.astype(np.float32) * t).astype(bias.dtype)

        def joint(norm: str, modules: tuple[str, ...]) -> None:
            stack = [sinkhorn.Rows(weight(m), out.rows.get(f"{layer}.{m}.{names.WEIGHT}")) for m in modules]
            t = _scales(stack, gsize(modules[0]), workers)
            stored = {f"{layer}.{m}.{names.WEIGHT}": part.weight for m, part in zip(modules, stack, strict=True)}
            t = _finite(plan, t, stored)
            del stack, stored
            norm_weight = tensor(f"{norm}.{names.WEIGHT}")
            assert norm_weight is not None  # `check` found it
            out.values[f"{layer}.{norm}.{names.WEIGHT}"], applied = _fold_norm(norm_weight, t)
            for m in modules:
                out.cols[f"{layer}.{m}.{names.WEIGHT}"] = 1 / applied

        joint("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
        joint("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"))
        out.cols[f"{layer}.self_attn.o_proj.{names.WEIGHT}"] = (1 / t_o).astype(np.float32)
        out.cols[f"{layer}.mlp.down_proj.{names.WEIGHT}"] = (1 / t_d).astype(np.float32)
    return out


def balance(plan: Plan, workers: int) -> Balance:
    """Every layer's folds, `workers` layers at a time (the kernel releases the GIL); where there are
    fewer layers than workers, each layer's tiles are shared among the workers left over."""
    layers, heads = _checked(plan)
    total = Balance()
    workers = max(1, workers)
    at_once = min(workers, len(layers))
    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="ws-sinq") as pool:
        for part in pool.map(lambda layer: _layer(plan, heads, layer, workers // at_once), layers):
            total.rows |= part.rows
            total.cols |= part.cols
            total.values |= part.values
    for name in total.values:
        if not np.isfinite(total.values[name].astype(np.float32)).all():
            raise CheckpointError(
                "would hold a NaN or Inf once balanced by --pre-pass sinq",
                file=plan.source.path(plan.source.tensors[name].shard),
                tensor=name,
                code="values.non-finite",
            )
    return total


@register
class Sinq(PrePass):
    NAME = "sinq"
    AUTO = True
    HELP = (
        "balance each weight's columns first (SINQ's Sinkhorn column scales, found from the weights alone) and "
        "fold the scales into the norms and the v/up_proj rows, so the model computes the same function and "
        "the checkpoint keeps the usual format. Llama, Mistral and Qwen2 under w4a16[-asym], --method rtn only"
    )
    SUMMARY = (
        "weights balanced, column scales folded into {changed} norms and biases and the v/up_proj rows "
        "(same function; --pre-pass none keeps the source's)"
    )
    CARD = (
        "each projection's input columns balanced by SINQ's Sinkhorn column scales (at most {iterations} steps "
        "per group, from the weights alone) before quantizing, the scales folded into the layer norms and the "
        "v_proj/up_proj rows so that the unquantized model computes the same function; the norm weights (and "
        "biases) listed in the manifest's pre_pass.changed differ from the source's by design, so adapters "
        "(LoRA) trained on the source's weights do not fit this checkpoint."
    )

    def takes(self, scheme: Scheme) -> bool:
        return takes(scheme)

    def check(self, plan: Plan) -> list[str]:
        return check(plan)

    def skipped(self, plan: Plan) -> str | None:
        return skipped(plan)

    def changed_tensors(self, plan: Plan, parts: list[str]) -> list[str]:
        return changed_tensors(plan, parts)

    def transforms(self, name: str) -> bool:
        return folds(name)

    def run(self, plan: Plan, workers: int) -> Balance:
        return balance(plan, workers)
