"""What a quantize request may combine: the one place `weightsmith quantize` and `weightsmith.quantize`
(and `plan_quantize`) check their arguments, so that the command line and the library cannot drift.

Every refusal is a `WeightsmithError` of one line with code "usage" (or the recipe's code), worded with
the command line's flags (`--recipe`, `--scale-search`...): the library's keyword arguments carry the
same names with underscores, and a message that differs by caller would be two messages to keep true.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.calibration.stats_file import MAX_TOKENS, MIN_TOKENS, tokens_option
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import echo, short_repr
from weightsmith.engine.gptq_defaults import ACTORDERS, GPTQ_DAMPENING
from weightsmith.quantize.recipe import GPTQ_GRID_ONLY, GPTQ_REFUSED_SEARCHES, MAX_GROUP_SIZE, Recipe, load_recipe
from weightsmith.schemes import make_scheme

if TYPE_CHECKING:
    from weightsmith.quantize.plan import Plan

METHODS = ("rtn", "gptq")
#: The scheme of a request that names none: asymmetric int4 lowered KL against symmetric on both
#: models of docs/fidelity-study.md, with every search and with GPTQ.
DEFAULT_SCHEME = "w4a16-asym"
#: `--pre-pass` values beside the pre-passes themselves: the default, and none at all.
AUTO, NO_PRE_PASS = "auto", "none"
#: `--method gptq`'s calibration tokens (at most) and tokens per sequence, unless given.
GPTQ_TOKENS, GPTQ_SEQ_LEN = 2048, 256
#: compressed-tensors' names for group ordering (a g_idx per column): "dynamic" is its alias of "group".
_GROUP_ACTORDERS = ("group", "dynamic")


@dataclass(frozen=True)
class GptqOptions:
    """`--method gptq`: where its calibration tokens come from and its dampening."""

    text: Path | None
    builtin: str | None
    tokens: int
    seq_len: int
    dampening: float
    trust_remote_code: bool = False
    actorder: str = "static"

    def calibration_source(self) -> tuple[str, str]:
        """The calibration text as (a label, words for a sentence): the file's path both times, or
        `builtin:NAME` and "the built-in NAME text" (the default built-in when neither is given)."""
        if self.text:
            return str(self.text), str(self.text)
        from weightsmith.io.texts import DEFAULT_BUILTIN

        name = self.builtin or DEFAULT_BUILTIN
        return f"builtin:{name}", f"the built-in {name} text"


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
        if gptq and search in GPTQ_REFUSED_SEARCHES:  # what `load_recipe(gptq=True)` refuses in a file
            raise WeightsmithError(
                f"rule {number}: {GPTQ_GRID_ONLY}; it does not take scale_search = {search!r} "
                "(use another or leave it out)",
                file=where,
                code="recipe.invalid",
            )
    return recipe


def gptq_options(
    method: str,
    *,
    text: str | os.PathLike[str] | None = None,
    builtin: str | None = None,
    tokens: int = GPTQ_TOKENS,
    seq_len: int = GPTQ_SEQ_LEN,
    dampening: float = GPTQ_DAMPENING,
    actorder: str = "static",
    trust_remote_code: bool = False,
    scale_search: str | None = None,
) -> GptqOptions | None:
    """The GPTQ options when `method` is "gptq", after checking them; None for "rtn", which takes none.

    The ranges the command line's option parsers enforce (`--tokens`, `--seq-len`) are checked here
    too, for callers that bypass them."""
    if method not in METHODS:
        raise WeightsmithError(f"unknown method {echo(method)} (choose from {', '.join(METHODS)})", code="usage")
    if method == "rtn":
        if text is not None or builtin is not None:
            raise WeightsmithError("--text and --builtin are calibration text for --method gptq", code="usage")
        return None
    if scale_search in GPTQ_REFUSED_SEARCHES:
        raise WeightsmithError(
            f"{GPTQ_GRID_ONLY}; it does not take --scale-search {scale_search} "
            f"({GPTQ_REFUSED_SEARCHES[scale_search]}); wmse, mse and noclip choose a grid GPTQ can start from",
            code="usage",
        )
    if not 0 <= dampening < 1 or dampening != dampening:
        raise WeightsmithError(f"--dampening {dampening} must be in [0, 1)", code="usage")
    if actorder not in ACTORDERS:
        raise WeightsmithError(_actorder_refusal(actorder), code="usage")
    tokens = tokens_option()(tokens)
    if type(seq_len) is not int or not 1 <= seq_len <= MAX_TOKENS:
        raise WeightsmithError(
            f"--seq-len {short_repr(seq_len)}: give a whole number from 1 to {MAX_TOKENS:,}", code="usage"
        )
    return GptqOptions(
        None if text is None else Path(text), builtin, tokens, seq_len, dampening, trust_remote_code, actorder
    )


def resolve(
    *,
    scheme: str | None,
    group_size: int | None,
    scale_search: str | None,
    recipe: str | os.PathLike[str] | Recipe | None,
    method: str,
    text: str | os.PathLike[str] | None = None,
    builtin: str | None = None,
    tokens: int = GPTQ_TOKENS,
    seq_len: int = GPTQ_SEQ_LEN,
    dampening: float = GPTQ_DAMPENING,
    actorder: str = "static",
    trust_remote_code: bool = False,
) -> tuple[Recipe, GptqOptions | None]:
    """The rules and the GPTQ options of a request, refused in the command line's order: the method's
    options first, then the scheme against the recipe."""
    gptq = gptq_options(
        method,
        text=text,
        builtin=builtin,
        tokens=tokens,
        seq_len=seq_len,
        dampening=dampening,
        actorder=actorder,
        trust_remote_code=trust_remote_code,
        scale_search=scale_search,
    )
    return rules_for(scheme, group_size, scale_search, recipe, gptq=gptq is not None), gptq


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


def open_plan(
    src: str | os.PathLike[str],
    rules: Recipe,
    *,
    ignore: list[str] | None = None,
    preset: str | None = None,
    calibration: str | os.PathLike[str] | None = None,
    kv_cache: str | None = None,
    pre_pass: str | None = None,
) -> Plan:
    """The plan of `rules` (from `resolve`) for the checkpoint `src`, with its statistics file if any,
    and the pre-pass `pre_pass` as `pre_pass_option` returned it (checked against the checkpoint from
    its headers): "auto" takes SINQ where `sinq.skipped` finds nothing against it, and says why not."""
    from weightsmith.calibration import derived
    from weightsmith.io.checkpoint import Checkpoint
    from weightsmith.quantize import sinq
    from weightsmith.quantize.plan import build_plan

    ckpt = Checkpoint.open(src)
    cal = derived.load(calibration, ckpt) if calibration is not None else None
    plan = build_plan(ckpt, rules, ignore, preset, cal, kv_cache)
    if pre_pass == AUTO:
        plan.pre_pass_skipped = sinq.skipped(plan)
        pre_pass = None if plan.pre_pass_skipped else "sinq"
    if pre_pass is not None:
        plan.pre_pass = pre_pass
        plan.changed = sinq.changed_tensors(plan, sinq.check(plan))
        changed = set(plan.changed)
        for d in plan.decisions:
            if d.name in changed:
                d.reason += f"; values changed by --pre-pass {pre_pass} (column scales folded in)"
            elif sinq.folds(d.name):
                d.reason += f"; balanced by --pre-pass {pre_pass} first"
    return plan


def pre_pass_option(pre_pass: str | None, *, gptq: bool) -> str | None:
    """`--pre-pass` as `open_plan` takes it: "auto" (the default), "sinq", or None for "none" (and for
    "auto" under GPTQ, which chooses its values from unbalanced weights). Refuses an unknown name, and
    an explicit pre-pass the method cannot start from."""
    from weightsmith.quantize.sinq import PRE_PASSES

    if pre_pass is None or pre_pass == NO_PRE_PASS or (pre_pass == AUTO and gptq):
        return None
    if pre_pass != AUTO and pre_pass not in PRE_PASSES:
        choices = ", ".join((AUTO, *PRE_PASSES, NO_PRE_PASS))
        raise WeightsmithError(f"--pre-pass {short_repr(pre_pass)}: choose from {choices}", code="usage")
    if gptq:
        raise WeightsmithError(
            f"--pre-pass {pre_pass} is data-free: --method gptq would choose values for weights the pre-pass "
            "has not balanced; use --method rtn",
            code="usage",
        )
    return pre_pass


def plan_warnings(plan: Plan) -> list[str]:
    """What the command line warns of a plan, one plain line each: recipe targets that match no
    Linear-like weight, and a statistics file measured on too few tokens for a stable maximum."""
    said = [
        f"rule {number} target {echo(target)} matches no Linear-like weight"
        for number, target in plan.unmatched_targets()
    ]
    cal = plan.calibration
    if cal is not None and cal.stats.provenance.tokens < MIN_TOKENS:
        said.append(
            f"{cal.path} was measured on {cal.stats.provenance.tokens:,} tokens; "
            f"a maximum over fewer than {MIN_TOKENS:,} is not stable"
        )
    return said
