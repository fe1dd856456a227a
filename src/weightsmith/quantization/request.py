"""A quantize request: the typed object `weightsmith quantize` and `weightsmith.quantize` both build, and
the one place it is checked, so that the command line and the library cannot drift.

`QuantizeRequest` holds everything a run is asked for; `resolve` checks it once (the method's options,
the scheme against the recipe, the workers, the pre-pass) into a `Resolved` request, which the plan
carries to the write. Every refusal is a `WeightsmithError` of one line with code "usage" (or the
recipe's code), worded with the command line's flags (`--recipe`, `--scale-search`...): the request's
fields carry the same names with underscores, and a message that differs by caller would be two
messages to keep true.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import echo, short_repr
from weightsmith.engine.gptq_defaults import ACTORDERS, GPTQ_DAMPENING
from weightsmith.io import names
from weightsmith.io.texts import MAX_TOKENS, MIN_TOKENS, tokens_option
from weightsmith.quantization.budget.plan import BudgetOptions
from weightsmith.quantization.prepasses import PRE_PASSES
from weightsmith.quantization.recipe import GPTQ_GRID_ONLY, MAX_GROUP_SIZE, Recipe, gptq_refusal, load_recipe
from weightsmith.schemes import make_scheme
from weightsmith.searches import gptq_starts

if TYPE_CHECKING:
    from weightsmith.quantization.budget.choose import Choice
    from weightsmith.quantization.plan import Plan

METHODS = ("rtn", "gptq")
#: The scheme of a request that names none: asymmetric int4 lowered KL against symmetric on both
#: models of docs/fidelity-study.md, with every search and with GPTQ.
DEFAULT_SCHEME = "w4a16-asym"
#: The most worker threads `--workers` may ask for: each holds a batch of tensors in memory, so a
#: mistyped count would run the machine out of memory (or threads) before any work is done.
MAX_WORKERS = 256
#: `--pre-pass` values beside the pre-passes themselves: the default, and none at all.
AUTO, NO_PRE_PASS = "auto", "none"
#: `--method gptq`'s calibration tokens (at most) and tokens per sequence, unless given.
GPTQ_TOKENS, GPTQ_SEQ_LEN = 2048, 256
#: compressed-tensors' names for group ordering (a g_idx per column): "dynamic" is its alias of "group".
_GROUP_ACTORDERS = ("group", "dynamic")


@dataclass(frozen=True)
class GptqOptions:
    """`method="gptq"`: where its calibration tokens come from, how many, and the solver's settings.

    `text` (a UTF-8 file) or `builtin` (a built-in text, "code" when neither is given); at most `tokens`
    tokens in sequences of `seq_len`; `dampening` is the fraction of each Hessian's mean diagonal added to
    its diagonal; `actorder` "static" (llm-compressor's default) or "none"; `all_experts` gives each MoE
    expert's Hessian every token rather than those routed to it (the outputs still routed as the model
    routes: llm-compressor's `calibrate_all_experts`); `trust_remote_code` runs the checkpoint's own
    model code."""

    text: str | os.PathLike[str] | None = None
    builtin: str | None = None
    tokens: int = GPTQ_TOKENS
    seq_len: int = GPTQ_SEQ_LEN
    dampening: float = GPTQ_DAMPENING
    actorder: str = "static"
    all_experts: bool = False
    trust_remote_code: bool = False

    def calibration_source(self) -> tuple[str, str]:
        """The calibration text as (a label, words for a sentence): the file's path both times, or
        `builtin:NAME` and "the built-in NAME text" (the default built-in when neither is given)."""
        if self.text:
            return str(self.text), str(self.text)
        from weightsmith.io.texts import DEFAULT_BUILTIN

        name = self.builtin or DEFAULT_BUILTIN
        return f"builtin:{name}", f"the built-in {name} text"


@dataclass(frozen=True)
class QuantizeRequest:
    """Everything one quantize run is asked for; `weightsmith.quantize(request)` carries it out.

    `source`: a checkpoint folder, or a Hub id `org/name[@revision]` resolved from the local Hub cache
    (downloaded when the network allows; a local folder of the same spelling wins). `output`: the folder
    to write (None only for `plan_quantize`). `scheme` (default w4a16-asym), or a `recipe` (a TOML file or
    a `Recipe`) that says every rule's scheme itself: a `scheme`, `group_size` or `scale_search` beside it
    is refused rather than silently dropped. `scale_search` None takes the scheme's default (`wmse` for
    w4a16 and w4a16-asym); "none" is plain round-to-nearest, byte-identical to llm-compressor's
    `model_free_ptq`. `ignore`: modules kept unquantized (exact names or `re:REGEX`). `preset`: a known
    case (`dflash-draft`...). `calibration`: a statistics file of `calibrate` measured on `source`, which
    calibrated schemes (nvfp4, fp8) and `kv_cache="fp8"` need. `pre_pass`: "auto" (SINQ where its check
    passes, no `kv_cache` is asked for and the search is not "none"), a pre-pass's name, or "none"/None.
    `method`: "rtn" (data-free) or "gptq" (with `gptq`'s options; torch and transformers). `workers` None:
    one per core. `force` replaces an existing `output`; `hash_sources` records the source shards' sha256.
    `avg_bits`: choose each module's scheme from `budget`'s candidates to spend at most this many bits per
    weight (scales and zero points included) where it lowers the model's measured sensitivity most; the
    calibrated measures read `gptq`'s `text`/`builtin`, `tokens` and `seq_len`.
    """

    source: str | os.PathLike[str]
    output: str | os.PathLike[str] | None = None
    scheme: str | None = None
    recipe: str | os.PathLike[str] | Recipe | None = None
    preset: str | None = None
    ignore: Sequence[str] = ()
    group_size: int | None = None
    scale_search: str | None = None
    pre_pass: str | None = AUTO
    calibration: str | os.PathLike[str] | None = None
    kv_cache: str | None = None
    method: str = "rtn"
    gptq: GptqOptions = field(default_factory=GptqOptions)
    workers: int | None = None
    force: bool = False
    hash_sources: bool = True
    avg_bits: float | None = None
    budget: BudgetOptions = field(default_factory=BudgetOptions)


@dataclass(frozen=True)
class Resolved:
    """A request once `resolve` has checked it: what the plan is built from and the write carries out."""

    request: QuantizeRequest
    rules: Recipe
    #: The GPTQ options when the method is "gptq", else None.
    gptq: GptqOptions | None
    #: "auto", a pre-pass's name, or None (none asked, or "auto" under GPTQ).
    pre_pass: str | None
    #: Worker threads (the request's, or one per core).
    workers: int
    #: What `avg_bits` bought (the rules are its recipe), or None without a budget.
    budget: Choice | None = None

    @property
    def output(self) -> Path:
        if self.request.output is None:
            raise WeightsmithError("no output folder given: a plan can be made, not written", code="usage")
        return Path(self.request.output)


def resolve(request: QuantizeRequest, say: Callable[[str], None] | None = None) -> Resolved:
    """`request` checked, in the command line's order: the method's options first, then the scheme against
    the recipe, the workers, and the pre-pass against the method. With `avg_bits`, the budget is spent
    here (its table measured unless given; `say` hears its steps) and its recipe is the rules."""
    from weightsmith.quantization.pipeline import default_workers

    budgeted = request.avg_bits is not None
    gptq = gptq_options(request.method, request.gptq, request.scale_search, budget=budgeted)
    if budgeted:
        _budget_alone(request, gptq is not None)
    rules = (
        None
        if budgeted
        else rules_for(request.scheme, request.group_size, request.scale_search, request.recipe, gptq=gptq is not None)
    )
    workers = request.workers
    if workers is not None and (type(workers) is not int or not 0 <= workers <= MAX_WORKERS):
        raise WeightsmithError(
            f"--workers {short_repr(workers)}: give a whole number from 0 to {MAX_WORKERS}", code="usage"
        )
    if isinstance(request.ignore, str):
        raise WeightsmithError(f"--ignore {echo(request.ignore)}: give a list of module names", code="usage")
    pre_pass = pre_pass_option(request.pre_pass, gptq=gptq is not None)
    choice = None
    if request.avg_bits is not None:
        from weightsmith.quantization.budget.plan import budget_recipe

        sized = replace(request, workers=workers or default_workers())
        rules, choice = budget_recipe(sized, request.avg_bits, request.budget, say=say)
    assert rules is not None
    return Resolved(request, rules, gptq, pre_pass, workers or default_workers(), choice)


def _budget_alone(request: QuantizeRequest, gptq: bool) -> None:
    """`--avg-bits` chooses every module's scheme: a scheme, recipe, group size or search beside it is refused."""
    given = [flag for flag, v in (("--scheme", request.scheme), ("--recipe", request.recipe),
                                  ("--group-size", request.group_size), ("--scale-search", request.scale_search))
             if v is not None]  # fmt: skip
    if given:
        raise WeightsmithError(f"{given[0]} and --avg-bits both set the scheme; leave out {given[0]}", code="usage")
    if gptq:
        raise WeightsmithError(
            "--avg-bits measures its candidates by round-to-nearest; --method gptq on a budget is not built yet "
            "(quantize with the recipe `weightsmith sensitivity --avg-bits` writes)",
            code="usage",
        )


def rules_for(
    scheme: str | None,
    group_size: int | None,
    scale_search: str | None,
    recipe: str | os.PathLike[str] | Recipe | None,
    *,
    gptq: bool = False,
) -> Recipe:
    """`recipe` (a TOML file or a `Recipe`), or the one-rule recipe of `scheme` (`DEFAULT_SCHEME` when neither is
    given).

    A recipe says the scheme of every rule, so a scheme, group size or scale search beside it would be
    silently dropped: refused instead. `gptq`: a rule whose search GPTQ cannot start from is refused."""
    if recipe is None:
        if group_size is not None and (type(group_size) is not int or not 1 <= group_size <= MAX_GROUP_SIZE):
            raise WeightsmithError(  # the command line's option range, for callers that bypass it
                f"--group-size {short_repr(group_size)}: give a whole number from 1 to {MAX_GROUP_SIZE:,}", code="usage"
            )
        return Recipe.single(make_scheme(scheme or DEFAULT_SCHEME, group_size, scale_search))
    given = [flag for flag, v in (("--scheme", scheme), ("--group-size", group_size), ("--scale-search", scale_search))
             if v is not None]  # fmt: skip
    where = recipe.file if isinstance(recipe, Recipe) else Path(recipe)
    if given:
        raise WeightsmithError(
            f"{given[0]} and --recipe both set the scheme; put it in the recipe's rules", file=where, code="usage"
        )
    if not isinstance(recipe, Recipe):
        return load_recipe(Path(recipe), gptq=gptq)
    for number, rule in enumerate(recipe.rules, 1):
        search = rule.scheme.scale_search
        if gptq and gptq_refusal(search) is not None:  # what `load_recipe(gptq=True)` refuses in a file
            raise WeightsmithError(
                f"rule {number}: {GPTQ_GRID_ONLY}; it does not take scale_search = {search!r} "
                "(use another or leave it out)",
                file=where,
                code="recipe.invalid",
            )
    return recipe


def gptq_options(
    method: str, opts: GptqOptions, scale_search: str | None = None, *, budget: bool = False
) -> GptqOptions | None:
    """`opts` when `method` is "gptq", after checking them; None for "rtn", which takes none (a calibration
    text beside it is refused unless a `budget` measures on it). The ranges the command line's option
    parsers enforce (`--tokens`, `--seq-len`) are checked here too, for callers that bypass them."""
    if method not in METHODS:
        raise WeightsmithError(f"unknown method {echo(method)} (choose from {', '.join(METHODS)})", code="usage")
    if method == "rtn":
        if (opts.text is not None or opts.builtin is not None) and not budget:
            raise WeightsmithError(
                "--text and --builtin are calibration text for --method gptq and --avg-bits", code="usage"
            )
        return None
    refused = gptq_refusal(scale_search)
    if refused is not None:
        raise WeightsmithError(
            f"{GPTQ_GRID_ONLY}; it does not take --scale-search {scale_search} "
            f"({refused}); {', '.join(gptq_starts())} choose a grid GPTQ can start from",
            code="usage",
        )
    if not 0 <= opts.dampening < 1 or opts.dampening != opts.dampening:
        raise WeightsmithError(f"--dampening {opts.dampening} must be in [0, 1)", code="usage")
    if opts.actorder not in ACTORDERS:
        raise WeightsmithError(_actorder_refusal(opts.actorder), code="usage")
    tokens = tokens_option()(opts.tokens)
    if tokens != opts.tokens:  # "2048" from a caller that bypassed the option parser
        opts = replace(opts, tokens=tokens)
    if type(opts.seq_len) is not int or not 1 <= opts.seq_len <= MAX_TOKENS:
        raise WeightsmithError(
            f"--seq-len {short_repr(opts.seq_len)}: give a whole number from 1 to {MAX_TOKENS:,}", code="usage"
        )
    return opts


def _actorder_refusal(actorder: str) -> str:
    """Why `--actorder` refuses `actorder`: group ordering is refused for a reason; anything else is unknown."""
    choices = ", ".join(ACTORDERS)
    if actorder in _GROUP_ACTORDERS:
        alias = "" if actorder == "group" else ", compressed-tensors' other name for group"
        return (
            f"--actorder {echo(actorder)}{alias}: group ordering (a g_idx per column) is not offered: "
            f"compressed-tensors deprecates it and llm-compressor's GPTQ refuses it; choose from {choices}"
        )
    return f"--actorder {echo(actorder)} is not an activation ordering; choose from {choices}"


def open_plan(resolved: Resolved, *, progress: bool = False) -> Plan:
    """The plan of a resolved request: its source (a Hub id resolved from the cache, or downloaded), its
    statistics file if any, and its pre-pass checked against the checkpoint from the headers. "auto" takes
    the first pre-pass marked for it whose `skipped` finds nothing against it, and says why not. `progress`:
    show a Hub download's progress bars."""
    from weightsmith.calibration import derived
    from weightsmith.io.checkpoint import Checkpoint
    from weightsmith.io.hub import resolve_source
    from weightsmith.quantization.plan import build_plan

    request = resolved.request
    source, hub = resolve_source(request.source, progress=progress)
    ckpt = Checkpoint.open(source)
    cal = derived.load(request.calibration, ckpt) if request.calibration is not None else None
    plan = build_plan(ckpt, resolved.rules, list(request.ignore), request.preset, cal, request.kv_cache)
    plan.request, plan.hub = resolved, hub
    name = resolved.pre_pass
    if name == AUTO:
        name = None
        for candidate in (p for p in PRE_PASSES.values() if p.AUTO):
            plan.pre_pass_skipped = candidate.skipped(plan)
            if plan.pre_pass_skipped is None:
                name = candidate.NAME
                break
    if name is not None:
        pre_pass = PRE_PASSES[name]
        plan.pre_pass = name
        plan.changed = pre_pass.changed_tensors(plan, pre_pass.check(plan))
        changed, transformed = set(plan.changed), pre_pass.transformed(plan)
        for d in plan.decisions:
            if d.name in changed:
                d.reason += f"; values changed by --pre-pass {name} (folded in)"
            elif d.name in transformed:
                d.reason += f"; transformed by --pre-pass {name} first"
    return plan


def pre_pass_option(pre_pass: str | None, *, gptq: bool) -> str | None:
    """`--pre-pass` as `open_plan` takes it: "auto" (the default), a pre-pass's name, or None for "none"
    (and for "auto" under GPTQ, which chooses its values from untransformed weights). Refuses an unknown
    name, and an explicit pre-pass the method cannot start from."""
    if pre_pass is None or pre_pass == NO_PRE_PASS or (pre_pass == AUTO and gptq):
        return None
    if pre_pass != AUTO and pre_pass not in PRE_PASSES:
        choices = ", ".join((AUTO, *PRE_PASSES, NO_PRE_PASS))
        raise WeightsmithError(f"--pre-pass {short_repr(pre_pass)}: choose from {choices}", code="usage")
    if gptq:
        raise WeightsmithError(
            f"--pre-pass {pre_pass} is data-free: --method gptq would choose values for weights the pre-pass "
            "has not transformed; use --method rtn",
            code="usage",
        )
    return pre_pass


def plan_warnings(plan: Plan) -> list[str]:
    """What the command line warns of a plan, one plain line each: recipe targets that match no
    Linear-like weight, a DFlash draft whose q/k/v are quantized, and a statistics file measured on too
    few tokens for a stable maximum."""
    said = [
        f"rule {number} target {echo(target)} matches no Linear-like weight"
        for number, target in plan.unmatched_targets()
    ]
    said += _dflash_qkv(plan)
    cal = plan.calibration
    if cal is not None and cal.stats.provenance.tokens < MIN_TOKENS:
        said.append(
            f"{cal.path} was measured on {cal.stats.provenance.tokens:,} tokens; "
            f"a maximum over fewer than {MIN_TOKENS:,} is not stable"
        )
    return said


#: The attention projections a DFlash drafter reads as `qkv_proj.weight`, fused or as stored.
_QKV = ("qkv_proj", *names.FUSED_LAYERS["qkv_proj"])


def _dflash_qkv(plan: Plan) -> list[str]:
    """A DFlash draft (its config has `dflash_config`) with q/k/v quantized: the releases whose drafter
    reads `qkv_proj.weight` unguarded will not load it (`presets.DFLASH_QKV_READS`)."""
    from weightsmith.quantization.plan import QUANTIZE
    from weightsmith.quantization.presets import DFLASH_QKV_READS, reads_words

    if "dflash_config" not in plan.source.config:
        return []
    qkv = [d.module for d in plan.decisions if d.action == QUANTIZE and names.leaf(d.module) in _QKV]
    if not qkv:
        return []
    more = f" and {len(qkv) - 1} more q/k/v projection(s)" if len(qkv) > 1 else ""
    return [
        f"{qkv[0]}{more} of this DFlash draft quantized: {reads_words(DFLASH_QKV_READS, guarded=False)} read "
        "qkv_proj.weight directly, which a quantized layer does not have, so those will not load it "
        "(`--preset dflash-draft` keeps q/k/v BF16)"
    ]
