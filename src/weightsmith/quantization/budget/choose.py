"""Spending a bit budget: the choice per group of modules that minimises the summed cost within the bits.

This is a multiple-choice knapsack: each group (the modules vLLM builds into one layer) takes exactly one
of its options (bits, cost). Three answers are made and the cheapest in cost kept: the greedy one (from
every group's cheapest option, the upgrades along each group's lower convex hull bought in order of cost
saved per bit while they fit: the linear relaxation's optimum up to the one upgrade that did not fit);
the exact optimum once every option's extra bits are rounded up to 1/32768 of the budget left (a dynamic
programme); and every uniform choice that fits, so that the budget never does worse than one of them.
What each leaves of the budget then buys the largest saving that still fits, until none does. The same
table and budget give the same plan.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from weightsmith.core.errors import WeightsmithError
from weightsmith.quantization.budget.candidates import Candidate
from weightsmith.quantization.budget.sensitivity import Table, with_measure
from weightsmith.quantization.recipe import Recipe, Rule


@dataclass(frozen=True)
class Option:
    """One candidate for a whole group: its stored bits and its cost, each summed over the group's modules."""

    label: str
    bits: int
    cost: float


@dataclass
class Group:
    """Modules that take one choice together, their options, and the one chosen."""

    name: str
    modules: tuple[str, ...]
    params: int
    options: tuple[Option, ...]
    chosen: Option

    def option(self, label: str) -> Option | None:
        return next((o for o in self.options if o.label == label), None)


@dataclass
class Choice:
    """The plan a budget bought: every group's option, and the budget it was asked for."""

    groups: list[Group]
    asked: float
    measure: str

    @property
    def params(self) -> int:
        return sum(g.params for g in self.groups)

    @property
    def bits(self) -> int:
        return sum(g.chosen.bits for g in self.groups)

    @property
    def avg_bits(self) -> float:
        return self.bits / self.params

    @property
    def cost(self) -> float:
        return sum(g.chosen.cost for g in self.groups)

    def to_json(self) -> dict[str, object]:
        counts: dict[str, int] = {}
        for g in self.groups:
            counts[g.chosen.label] = counts.get(g.chosen.label, 0) + len(g.modules)
        return {
            "avg_bits_asked": self.asked,
            "avg_bits": self.avg_bits,
            "params": self.params,
            "measure": self.measure,
            "predicted_cost": self.cost,
            "modules_by_candidate": counts,
            "groups": [
                {
                    "group": g.name,
                    "modules": list(g.modules),
                    "chosen": g.chosen.label,
                    "bits": g.chosen.bits,
                    "cost": g.chosen.cost,
                }
                for g in self.groups
            ],
        }

    def modules_by_label(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for g in self.groups:
            out.setdefault(g.chosen.label, []).extend(g.modules)
        return out

    def recipe(self, cands: tuple[Candidate, ...], ignore: tuple[str, ...] = ()) -> Recipe:
        """One rule per quantizing candidate chosen, targeting its modules by exact name; a module kept as
        stored is matched by no rule (the plan keeps it and lists it in `ignore`)."""
        chosen = self.modules_by_label()
        rules = []
        for c in cands:
            scheme = c.make()
            if scheme is not None and chosen.get(c.label):
                rules.append(Rule(tuple(chosen[c.label]), scheme))
        if not rules:
            raise WeightsmithError("the budget keeps every module as stored: nothing to quantize", code="usage")
        return Recipe(tuple(rules), tuple(ignore))


def groups_of(table: Table, measure: str, cands: tuple[Candidate, ...]) -> list[Group]:
    """The table's modules grouped as vLLM builds them, each group's options the candidates of `cands` that
    every member takes (a group none takes stays as stored, outside the budget)."""
    costs = with_measure(table, measure)
    out = []
    for name, members in table.groups().items():
        options = []
        for c in cands:
            if all(c.label in costs[m.module] for m in members):
                bits = sum(c.bits(m.module, m.shape, m.dtype) for m in members)
                options.append(Option(c.label, bits, sum(costs[m.module][c.label] for m in members)))
        if options:
            start = min(options, key=lambda o: (o.bits, o.cost))
            params = sum(m.params for m in members)
            out.append(Group(name, tuple(m.module for m in members), params, tuple(options), start))
    return out


def spend(groups: list[Group], avg_bits: float, measure: str) -> Choice:
    """`groups` with each one's option chosen to minimise the summed cost at most `avg_bits` per weight."""
    if not groups:
        raise WeightsmithError("no module can take a candidate: nothing to spend the budget on", code="usage")
    cheapest = [min(g.options, key=lambda o: (o.bits, o.cost)) for g in groups]
    params = sum(g.params for g in groups)
    total = avg_bits * params
    left = total - sum(o.bits for o in cheapest)
    if left < -1e-9 * total:
        raise WeightsmithError(
            f"--avg-bits {avg_bits:g} is below the cheapest mix, {sum(o.bits for o in cheapest) / params:.4f} bits "
            "per weight",
            code="usage",
        )
    tried = [_greedy(groups, cheapest, left), _table(groups, cheapest, left)]
    labels = dict.fromkeys(o.label for g in groups for o in g.options)
    for label in labels:  # never worse than a uniform choice that fits
        uniform = [g.option(label) for g in groups]
        if all(o is not None for o in uniform) and sum(o.bits for o in uniform if o) <= total:
            tried.append([o for o in uniform if o])
    best = min((_filled(groups, picks, total) for picks in tried), key=lambda picks: sum(o.cost for o in picks))
    for g, o in zip(groups, best, strict=True):
        g.chosen = o
    return Choice(groups, avg_bits, measure)


def _greedy(groups: list[Group], start: list[Option], left: float) -> list[Option]:
    """Upgrades along each group's lower convex hull, best saving per bit first, while they fit."""
    picks = list(start)
    hulls = [_hull(g, o) for g, o in zip(groups, start, strict=True)]
    steps = [0] * len(groups)
    heap: list[tuple[float, int]] = []
    for i, hull in enumerate(hulls):
        if len(hull) > 1:
            heapq.heappush(heap, (_rate(hull[0], hull[1]), i))
    while heap:
        _, i = heapq.heappop(heap)
        hull, k = hulls[i], steps[i]
        extra = hull[k + 1].bits - hull[k].bits
        if extra > left:
            continue  # the hull's later steps are larger still
        left -= extra
        steps[i] = k + 1
        picks[i] = hull[k + 1]
        if k + 2 < len(hull):
            heapq.heappush(heap, (_rate(hull[k + 1], hull[k + 2]), i))
    return picks


#: The dynamic programme's resolution: the bits left above the cheapest mix in this many units, each
#: option's extra bits rounded up to whole units (so its answer always fits).
UNITS = 1 << 15


def _table(groups: list[Group], start: list[Option], left: float) -> list[Option]:
    """The exact optimum of the problem with every option's extra bits rounded up to `UNITS` of the budget
    left: a dynamic programme over groups, the least cost at each number of units spent."""
    import numpy as np

    if left <= 0:
        return list(start)
    unit = left / UNITS
    best = np.full(UNITS + 1, np.inf)
    best[0] = 0.0
    picked = np.zeros((len(groups), UNITS + 1), np.int16)
    widths = []
    for i, (g, base) in enumerate(zip(groups, start, strict=True)):
        row = [max(0, int(np.ceil((o.bits - base.bits) / unit - 1e-9))) for o in g.options]
        widths.append(row)
        new = np.full(UNITS + 1, np.inf)
        for k, (o, w) in enumerate(zip(g.options, row, strict=True)):
            if w > UNITS:
                continue
            moved = np.full(UNITS + 1, np.inf)
            moved[w:] = best[: UNITS + 1 - w] + o.cost
            better = moved < new
            new[better] = moved[better]
            picked[i, better] = k
        best = new
    spent = int(np.argmin(best))
    picks = []
    for i in range(len(groups) - 1, -1, -1):
        k = int(picked[i, spent])
        picks.append(groups[i].options[k])
        spent -= widths[i][k]
    return picks[::-1]


def _filled(groups: list[Group], picks: list[Option], total: float) -> list[Option]:
    """`picks`, then what is left of the budget spent on the largest saving that still fits, until none does."""
    picks = list(picks)
    left = total - sum(o.bits for o in picks)
    while True:
        best: tuple[float, int, Option] | None = None
        for i, g in enumerate(groups):
            for o in g.options:
                saving = picks[i].cost - o.cost
                if saving > 0 and o.bits - picks[i].bits <= left and (best is None or saving > best[0]):
                    best = (saving, i, o)
        if best is None:
            return picks
        _, i, o = best
        left -= o.bits - picks[i].bits
        picks[i] = o


def _rate(a: Option, b: Option) -> float:
    """The heap's key for the upgrade a -> b: cost saved per bit, negated (heapq pops the smallest)."""
    return -(a.cost - b.cost) / (b.bits - a.bits)


def _hull(g: Group, start: Option) -> list[Option]:
    """The group's options on the lower convex hull of (bits, cost), from `start` (its cheapest in bits) on,
    each saving cost over the one before at a falling rate per bit."""
    points = sorted(
        (o for o in g.options if o.bits > start.bits and o.cost < start.cost), key=lambda o: (o.bits, o.cost)
    )
    hull = [start]
    for p in points:
        if p.cost >= hull[-1].cost:
            continue
        while len(hull) >= 2 and _rate(hull[-2], hull[-1]) >= _rate(hull[-1], p):
            hull.pop()  # hull[-1] saves less per bit than going straight on to p
        hull.append(p)
    return hull


def budget_line(choice: Choice) -> str:
    """The choice in one line: the bits asked and spent, and how many modules took each candidate."""
    spread = ", ".join(f"{label} {len(modules)}" for label, modules in choice.modules_by_label().items())
    return (
        f"budget: {choice.avg_bits:.4f} of {choice.asked:g} bits per weight over {choice.params:,} Linear weights; "
        f"modules: {spread}; predicted {choice.measure} cost {choice.cost:.4g}"
    )
