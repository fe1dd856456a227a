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

Each fold runs only where every weight it rescales is balanced, quantized by a scheme `takes` accepts
(`FOLDS`): a projection kept unquantized or quantized otherwise (w8a16) is written exactly as stored; the
folds that would rescale it are skipped, so a recipe that mixes schemes per module still has the others
balanced. Only where no fold of any layer can run is the pre-pass refused, naming the first projection
that is not balanced.

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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from weightsmith.core.errors import CheckpointError, WeightsmithError
from weightsmith.core.lazy import lazy_module
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
from weightsmith.quantization.plan import QUANTIZE, Decision, Plan, shape_refusal
from weightsmith.quantization.prepasses.base import PrePass, register
from weightsmith.schemes.base import Scheme

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import sinkhorn
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    sinkhorn = lazy_module("weightsmith.quant.sinkhorn")

#: The classes (`architectures[0]`, what vLLM builds) whose decoder layers are pre-norm Llama blocks
#: with norms that multiply by their weight: the families that say the pre-pass may fold into their norms.
ARCHITECTURES = tuple(arch for arch, family in FAMILIES.items() if family.foldable_norms == NORMS)
#: The code of the refusal of a config that contradicts itself.
CONTRADICTION = "config.contradiction"
#: What `--pre-pass auto` refuses rather than skips: where the pre-pass would fold, a config that
#: contradicts itself or a weight whose shape config.json contradicts (`plan.shape_refusal`).
REFUSED_UNDER_AUTO = (CONTRADICTION, SHAPE)
_KNOWN = {f"{m}.{names.WEIGHT}" for m in PROJECTIONS + NORMS} | {f"{m}.{names.BIAS}" for m in PROJECTIONS}
#: Each fold, by where its scale goes (a norm, or the projection whose input columns it divides), with the
#: projections whose weights it rescales: it runs only where all of them are balanced (`_balanced`), so
#: that a weight kept or quantized by another scheme keeps its stored bytes.
FOLDS: dict[str, tuple[str, ...]] = {
    "self_attn.o_proj": ("self_attn.o_proj", "self_attn.v_proj"),  # o's columns, v's rows (and bias)
    "mlp.down_proj": ("mlp.down_proj", "mlp.up_proj"),  # down's columns, up's rows (and bias)
    "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),  # their columns
    "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),  # their columns
}
#: The projection whose rows (and bias) o_proj's and down_proj's folds multiply by their scale.
_ROWS_OF = {"self_attn.o_proj": "self_attn.v_proj", "mlp.down_proj": "mlp.up_proj"}


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
    for an architecture or a tensor it cannot fold exactly, for a recipe under which no fold can run
    (no layer has all the weights of one fold balanced), or KV-cache scales it would invalidate (they
    are measured on SRC, and the fold rescales v_proj's rows)."""
    return _checked(plan)[0]


def _checked(plan: Plan) -> tuple[list[str], dict[str, frozenset[str]], Heads]:
    """`check`'s layers, with the folds that run in each and how o_proj's columns map onto v_proj's rows
    (the folds need all three)."""
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
    runs: dict[str, frozenset[str]] = {}
    lacking: WeightsmithError | None = None
    first: WeightsmithError | None = None  # where no fold can run: the first refusal met in layer order
    for layer, present in layers.items():
        part = next((p for p in (f"{m}.{names.WEIGHT}" for m in NORMS + PROJECTIONS) if p not in present), None)
        if part is not None:
            if lacking is None:
                lacking = refusal(f"layer {layer}", f"has no {part}, so its scales have nowhere to go")
            first = lacking if first is None else first
            continue
        projections = [decisions[f"{layer}.{m}.{names.WEIGHT}"] for m in PROJECTIONS]
        unbalanced = next((d for d in projections if not _balanced(d)), None)
        if unbalanced is not None and first is None:
            first = _unbalanced(unbalanced)
        runs[layer] = _running(decisions, layer)
        folded = {m for fold in runs[layer] for m in FOLDS[fold]}
        for d in projections:
            if d.module.removeprefix(f"{layer}.") in folded:  # (the plan has checked the norms and biases)
                wrong = shape_refusal(plan.source, arch, d)
                if wrong is not None:
                    raise wrong
    if not any(runs.values()):
        assert first is not None  # a fold that cannot run has a weight that is not balanced
        raise first
    if lacking is not None:
        raise lacking
    return sorted((p for p in runs if runs[p]), key=lambda p: int(p.rsplit(".", 1)[1])), runs, heads


def _balanced(d: Decision | None) -> bool:
    """Whether the pre-pass may rescale `d`'s weight: quantized by a scheme `takes` accepts."""
    return d is not None and d.action == QUANTIZE and d.rule is not None and takes(d.rule.scheme)


def _unbalanced(d: Decision) -> WeightsmithError:
    """The refusal of a projection `_balanced` turns down, saying how the plan treats it."""
    why = d.reason if d.action != QUANTIZE else f"is quantized as {d.rule.scheme.name if d.rule else '?'}"
    return refusal(f"tensor {d.name}", f"must be quantized as {' or '.join(_schemes())} ({why})")


def _running(decisions: dict[str, Decision], layer: str) -> frozenset[str]:
    """The folds of `layer` (keys of `FOLDS`) whose every weight is balanced, from the plan's decisions."""
    return frozenset(
        fold
        for fold, modules in FOLDS.items()
        if all(_balanced(decisions.get(f"{layer}.{m}.{names.WEIGHT}")) for m in modules)
    )


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
    run, and the output would not be the model config.json describes either way. Plain round-to-nearest is
    asked for where a weight a fold would rescale has `--scale-search none` (where no fold can run, any
    projection: the refusal is then `check`'s)."""
    plain = any(d.rule is not None and d.rule.scheme.scale_search is None for d in _rescaled(plan))
    try:
        check(plan)
    except WeightsmithError as exc:
        if exc.code in REFUSED_UNDER_AUTO and not plain:
            raise
        return str(exc).removeprefix("--pre-pass sinq: ")
    if plain:
        return "--scale-search none asks for plain round-to-nearest of the source's weights"
    return None


def _rescaled(plan: Plan) -> list[Decision]:
    """The projection weights a fold would rescale, judged from the decisions alone (the folds whose every
    weight is balanced); where there are none, every projection weight."""
    projections = [d for d in plan.decisions if folds(d.name)]
    out = rescaled(plan)
    return [d for d in projections if d.name in out] or projections


def rescaled(plan: Plan) -> set[str]:
    """The projection weights a fold that runs rescales."""
    decisions = {d.name: d for d in plan.decisions}
    layers = dict.fromkeys(f"model.layers.{found.group(1)}" for d in plan.decisions if (found := LAYER.match(d.name)))
    return {
        f"{layer}.{m}.{names.WEIGHT}" for layer in layers for fold in _running(decisions, layer) for m in FOLDS[fold]
    }


def folds(name: str) -> bool:
    """Whether `name` is a projection weight of a decoder layer (rescaled by each of its folds that runs)."""
    found = LAYER.match(name)
    return found is not None and found.group(2) in {f"{m}.{names.WEIGHT}" for m in PROJECTIONS}


def changed_tensors(plan: Plan, layers: list[str]) -> list[str]:
    """The unquantized tensors whose values the pre-pass changes: the norm of each joint fold that runs,
    and v_proj's and up_proj's biases, where there are any, when o_proj's and down_proj's folds run."""
    decisions = {d.name: d for d in plan.decisions}
    out = []
    for layer in layers:
        runs = _running(decisions, layer)
        out += [f"{layer}.{n}.{names.WEIGHT}" for n in NORMS if n in runs]
        out += [f"{layer}.{m}.{names.BIAS}" for fold, m in _ROWS_OF.items() if fold in runs]
    return [n for n in out if n in plan.source.tensors]


@dataclass
class Balance:
    """Per weight, the factors its rows are multiplied by and its columns divided by; the new
    values of the unquantized tensors the folds changed, in their own dtype."""

    rows: dict[str, np.ndarray] = field(default_factory=dict)
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    #: CPU seconds of each layer's folds, on the thread that ran them (the benchmarks' schedules).
    task_seconds: list[float] = field(default_factory=list)

    def apply(self, name: str, x: np.ndarray, r0: int) -> np.ndarray:
        """Rows [r0, r0 + len(x)) of weight `name` balanced, in `x`'s dtype (the kernels' input dtype). A
        weight may have row factors and no column factors: v_proj or up_proj whose joint fold was skipped
        (a neighbour is not balanced) while o_proj's or down_proj's ran."""
        inv = self.cols.get(name)
        rows = self.rows.get(name)
        if inv is None and rows is None:
            return x
        if inv is None:
            inv = np.ones(x.shape[1], np.float32)  # times 1 is exact: the rows are rounded once, as with both
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


def _layer(plan: Plan, heads: Heads, layer: str, runs: frozenset[str], workers: int) -> Balance:
    """One decoder layer's folds that run (`runs`, keys of `FOLDS`): its weights read once each in their
    stored dtype (no float32 copy), and only those of a fold that runs."""
    group = {d.module: d.rule.scheme.group_size for d in plan.decisions if d.rule is not None}
    out = Balance()
    with OriginalWeights(plan.source) as reader:

        def weight(module: str) -> np.ndarray:
            return reader.weight(f"{layer}.{module}")

        def tensor(name: str) -> np.ndarray | None:
            full = f"{layer}.{name}"
            return reader.read(full) if full in plan.source.tensors else None

        def gsize(module: str) -> int:  # asked only of a balanced weight, whose scheme has groups
            return int(group[f"{layer}.{module}"])

        t_in: dict[str, np.ndarray] = {}  # o_proj's and down_proj's input scales, by module
        if "self_attn.o_proj" in runs:
            # o_proj: columns of query heads sharing a KV head stacked as rows, so they get one scale
            o = weight("self_attn.o_proj")
            t_v = _scales([sinkhorn.Rows(o, columns=c) for c in _o_columns(heads)], gsize("self_attn.o_proj"), workers)
            t_v = _finite(plan, t_v, {f"{layer}.self_attn.o_proj.{names.WEIGHT}": o})
            del o
            t_in["self_attn.o_proj"] = t_v
        if "mlp.down_proj" in runs:
            down = weight("mlp.down_proj")
            t_in["mlp.down_proj"] = _finite(plan, _scales([sinkhorn.Rows(down)], gsize("mlp.down_proj"), workers),
                                            {f"{layer}.mlp.down_proj.{names.WEIGHT}": down})  # fmt: skip
            del down
        for fold, t in t_in.items():
            module = _ROWS_OF[fold]
            out.rows[f"{layer}.{module}.{names.WEIGHT}"] = t
            bias = tensor(f"{module}.{names.BIAS}")
            if bias is not None:
                out.values[f"{layer}.{module}.{names.BIAS}"] = (bias.astype(np.float32) * t).astype(bias.dtype)

        def joint(norm: str) -> None:
            modules = FOLDS[norm]
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

        for norm in NORMS:
            if norm in runs:
                joint(norm)
        if "self_attn.o_proj" in t_in:
            t_o = np.repeat(t_in["self_attn.o_proj"].reshape(heads.kv, 1, heads.dim), heads.per_kv, axis=1)
            out.cols[f"{layer}.self_attn.o_proj.{names.WEIGHT}"] = (1 / t_o.reshape(-1)).astype(np.float32)
        if "mlp.down_proj" in t_in:
            out.cols[f"{layer}.mlp.down_proj.{names.WEIGHT}"] = (1 / t_in["mlp.down_proj"]).astype(np.float32)
    return out


def balance(plan: Plan, workers: int) -> Balance:
    """Every layer's folds that run, `workers` layers at a time (the kernel releases the GIL); where there
    are fewer layers than workers, each layer's tiles are shared among the workers left over."""
    layers, runs, heads = _checked(plan)
    total = Balance()
    workers = max(1, workers)
    at_once = min(workers, len(layers))

    def timed(layer: str) -> tuple[Balance, float]:
        cpu = time.thread_time()
        part = _layer(plan, heads, layer, runs[layer], workers // at_once)
        return part, time.thread_time() - cpu

    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="ws-sinq") as pool:
        for part, seconds in pool.map(timed, layers):
            total.rows |= part.rows
            total.cols |= part.cols
            total.values |= part.values
            total.task_seconds.append(seconds)
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
        "the checkpoint keeps the usual format. Llama, Mistral and Qwen2, --method rtn only; a projection kept "
        "unquantized or quantized other than w4a16[-asym] is left as stored, the folds that would rescale it skipped"
    )
    SUMMARY = (
        "weights balanced, column scales folded into {changed} norms and biases and the v/up_proj rows "
        "(same function; --pre-pass none keeps the source's)"
    )
    CARD = (
        "each 4-bit projection's input columns balanced by SINQ's Sinkhorn column scales (at most {iterations} "
        "steps per group, from the weights alone) before quantizing, the scales folded into the layer norms and "
        "the v_proj/up_proj rows so that the unquantized model computes the same function (a projection kept "
        "unquantized or quantized by another scheme is left as stored: the folds that would rescale it are "
        "skipped); the norm weights (and biases) listed in the manifest's pre_pass.changed differ from the "
        "source's by design, so adapters (LoRA) trained on the source's weights do not fit this checkpoint."
    )

    def takes(self, scheme: Scheme) -> bool:
        return takes(scheme)

    def check(self, plan: Plan) -> list[str]:
        return check(plan)

    def skipped(self, plan: Plan) -> str | None:
        return skipped(plan)

    def changed_tensors(self, plan: Plan, parts: list[str]) -> list[str]:
        return changed_tensors(plan, parts)

    def transformed(self, plan: Plan) -> set[str]:
        return rescaled(plan)

    def run(self, plan: Plan, workers: int) -> Balance:
        return balance(plan, workers)
