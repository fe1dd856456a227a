"""`quantize --avg-bits B` and `weightsmith sensitivity`: the scope, the measured table, and the recipe
the budget buys.

The scope is every Linear-like weight some candidate would quantize (the request's `--ignore` and preset
honoured), read from the headers. The table is measured now, or read from a file `sensitivity --out`
wrote for the same checkpoint (its fingerprint must match the scope's). The choice becomes an ordinary
recipe of exact module names, which the plan then carries out like any other.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core.errors import WeightsmithError
from weightsmith.io import names
from weightsmith.quantization.budget.candidates import Candidate, candidates
from weightsmith.quantization.budget.choose import Choice, groups_of, spend
from weightsmith.quantization.budget.sensitivity import (
    DRAWS,
    MEASURES,
    Calibration,
    Table,
    fingerprint,
    measure,
    read_table,
)

if TYPE_CHECKING:
    from weightsmith.quantization.recipe import Recipe
    from weightsmith.quantization.request import QuantizeRequest

#: The average bits a budget may ask for (one below the cheapest mix is refused with that mix's figure).
MIN_BITS, MAX_BITS = 1.0, 32.0


@dataclass(frozen=True)
class BudgetOptions:
    """`--avg-bits`' companions: the candidate `family` (`candidates` a subset of it by label), the
    `measure` the choice minimises, and `table`, a sensitivity table measured before (else measured now,
    the calibrated measures on the request's `--text`/`--builtin`, `--tokens`, `--seq-len`)."""

    family: str = "int4"
    candidates: tuple[str, ...] | None = None
    measure: str = "fisher"
    table: str | os.PathLike[str] | None = None
    draws: int = DRAWS


def check_options(avg_bits: float, opts: BudgetOptions) -> tuple[Candidate, ...]:
    if isinstance(avg_bits, bool) or not isinstance(avg_bits, (int, float)) or not MIN_BITS <= avg_bits <= MAX_BITS:
        raise WeightsmithError(f"--avg-bits {avg_bits!r}: give a number of bits from {MIN_BITS:g} to {MAX_BITS:g}",
                               code="usage")  # fmt: skip
    if opts.measure not in MEASURES:
        raise WeightsmithError(f"--measure {opts.measure!r}: choose from {', '.join(MEASURES)}", code="usage")
    return candidates(opts.family, opts.candidates)


def scope(
    request: QuantizeRequest, cands: tuple[Candidate, ...]
) -> tuple[Path, dict[str, tuple[tuple[int, int], str]]]:
    """The source folder and every weight some candidate would quantize: module -> (shape, dtype)."""
    from weightsmith.io.checkpoint import Checkpoint
    from weightsmith.io.hub import resolve_source
    from weightsmith.quantization.plan import QUANTIZE, build_plan
    from weightsmith.quantization.recipe import Recipe

    source, _ = resolve_source(request.source)
    ckpt = Checkpoint.open(source)
    found: dict[str, tuple[tuple[int, int], str]] = {}
    for c in cands:
        scheme = c.make()
        if scheme is None:
            continue
        made = build_plan(ckpt, Recipe.single(scheme), list(request.ignore), request.preset)
        for d in made.decisions:
            if d.action == QUANTIZE and d.param == names.WEIGHT and len(d.shape) == 2:
                found.setdefault(d.module, ((d.shape[0], d.shape[1]), d.dtype))
    if not found:
        raise WeightsmithError("no Linear-like weight any candidate quantizes", file=source, code="usage")
    order = {d: i for i, d in enumerate(ckpt.tensors)}
    return source, dict(sorted(found.items(), key=lambda kv: order.get(f"{kv[0]}.{names.WEIGHT}", 0)))


def table_for(
    request: QuantizeRequest,
    opts: BudgetOptions,
    cands: tuple[Candidate, ...],
    *,
    measures: tuple[str, ...] | None = None,
    say: Callable[[str], None] | None = None,
) -> Table:
    """The sensitivity table of `request.source`: read from `opts.table` (checked against the scope), or measured."""
    from weightsmith.quantization.pipeline import default_workers

    source, modules = scope(request, cands)
    if opts.table is not None:
        table = read_table(Path(opts.table))
        want = fingerprint({m: (dtype, shape) for m, (shape, dtype) in modules.items()})
        held = fingerprint({m.module: (m.dtype, m.shape) for m in table.modules})
        if held != want or table.family != opts.family:
            raise WeightsmithError(
                f"was measured on other weights or another family ({table.family}, {held}; this run: "
                f"{opts.family}, {want}): measure again",
                file=Path(opts.table),
                code="usage",
            )
        missing = [c.label for c in cands if c.label not in table.candidates]
        if missing:
            raise WeightsmithError(f"has no costs for candidate {missing[0]!r}", file=Path(opts.table), code="usage")
        return table
    gptq = request.gptq
    calibration = Calibration(
        str(gptq.text) if gptq.text else None, gptq.builtin, gptq.tokens, gptq.seq_len, opts.draws
    )
    fields = {"ignore": tuple(request.ignore), "preset": request.preset}
    return measure(
        source, modules, cands, opts.family,
        measures=measures or (("weight",) if opts.measure == "weight" else MEASURES),
        calibration=calibration, request_fields=fields, workers=request.workers or default_workers(), say=say,
    )  # fmt: skip


def budget_recipe(
    request: QuantizeRequest, avg_bits: float, opts: BudgetOptions, say: Callable[[str], None] | None = None
) -> tuple[Recipe, Choice]:
    """The recipe `avg_bits` buys for `request.source`, and the choice behind it."""
    cands = check_options(avg_bits, opts)
    table = table_for(request, opts, cands, say=say)
    choice = spend(groups_of(table, opts.measure, cands), avg_bits, opts.measure)
    return choice.recipe(cands, tuple(request.ignore)), choice
