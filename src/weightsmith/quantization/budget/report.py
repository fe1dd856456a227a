"""The sensitivity report: the per-module table, a heat map of what each candidate costs, and the chosen
plan as a recipe `quantize --recipe` takes.

Files (`FILES`), all in one folder that appears whole or not at all: sensitivity.json (the table, which
`quantize --avg-bits --sensitivity` reuses), sensitivity.md, sensitivity.png, and with a budget plan.toml.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.quantization.budget.candidates import Candidate
from weightsmith.quantization.budget.choose import Choice, budget_line
from weightsmith.quantization.budget.sensitivity import Table, with_measure

FILES = ("sensitivity.json", "sensitivity.md", "sensitivity.png", "plan.toml")


def module_kind(module: str) -> tuple[int | None, str]:
    """(decoder layer index or None, the module's kind): `self_attn.q_proj`, `mlp.experts.down_proj`..."""
    parts = module.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        rest = [p for p in parts[3:] if not p.isdigit()]
        return int(parts[2]), ".".join(rest)
    return None, module


def markdown(table: Table, cands: tuple[Candidate, ...], measure: str, choice: Choice | None) -> str:
    costs = with_measure(table, measure)
    chosen = {m: g.chosen.label for g in (choice.groups if choice else []) for m in g.modules}
    lines = [
        f"# Sensitivity of {table.source}",
        "",
        f"Measure: **{measure}** ({'nats of KL per token' if measure == 'fisher' else 'see docs/budget.md'}); "
        f"calibration: {table.text or 'none (data-free)'}, {table.tokens:,} tokens. Family {table.family}.",
        "",
    ]
    if choice is not None:
        lines += [budget_line(choice), ""]
    head = ["module", "params", *(f"{c.label} bits / cost" for c in cands), *(["chosen"] if choice else [])]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in table.modules:
        cells = [f"`{m.module}`", f"{m.params:,}"]
        for c in cands:
            cost = costs[m.module].get(c.label)
            cells.append("—" if cost is None else f"{c.bits(m.module, m.shape, m.dtype) / m.params:.3f} / {cost:.3g}")
        if choice is not None:
            cells.append(chosen.get(m.module, "—"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def heat_map(table: Table, cands: tuple[Candidate, ...], measure: str, path: Path, choice: Choice | None) -> None:
    """Layers down, module kinds across, one panel per quantizing candidate: log10 of each module's cost
    (summed over a layer's experts); with a choice, a last panel of what each module was given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    costs = with_measure(table, measure)
    cells: dict[tuple[int, str], dict[str, float]] = {}
    for m in table.modules:
        layer, kind = module_kind(m.module)
        if layer is None:
            continue
        slot = cells.setdefault((layer, kind), {})
        for label, value in costs[m.module].items():
            slot[label] = slot.get(label, 0.0) + value
    layers = sorted({k[0] for k in cells})
    kinds = sorted({k[1] for k in cells})
    shown = [c for c in cands if c.scheme is not None]
    if not layers or not shown:
        return
    grids = []
    for c in shown:
        grid = np.full((len(layers), len(kinds)), np.nan)
        for (layer, kind), slot in cells.items():
            cost = slot.get(c.label)
            if cost is not None and cost > 0:
                grid[layers.index(layer), kinds.index(kind)] = math.log10(cost)
        grids.append(grid)
    finite = np.concatenate([g[np.isfinite(g)] for g in grids])
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    panels = len(shown) + (choice is not None)
    fig, axes = plt.subplots(1, panels, figsize=(2.5 + 0.42 * len(kinds) * panels, 1.6 + 0.16 * len(layers)),
                             squeeze=False, constrained_layout=True)  # fmt: skip
    image = None
    for ax, c, grid in zip(axes[0], shown, grids, strict=False):
        image = ax.imshow(grid, aspect="auto", cmap="magma", vmin=low, vmax=high, interpolation="nearest")
        ax.set_title(c.label)
        ax.set_xticks(range(len(kinds)), [k.split(".")[-1] for k in kinds], rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(layers)), [str(v) for v in layers], fontsize=6)
    axes[0][0].set_ylabel("decoder layer")
    assert image is not None
    fig.colorbar(image, ax=axes[0][: len(shown)].tolist(), label=f"log10 {measure} cost")
    if choice is not None:
        _chosen_panel(axes[0][-1], choice, cands, layers, kinds)
    fig.suptitle(f"what each candidate costs each module ({measure})")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _chosen_panel(ax: Any, choice: Choice, cands: tuple[Candidate, ...], layers: list[int], kinds: list[str]) -> None:
    """What the budget gave each module: one colour per candidate (a layer's experts share one choice)."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    labels = [c.label for c in cands]
    grid = np.full((len(layers), len(kinds)), np.nan)
    for g in choice.groups:
        for module in g.modules:
            layer, kind = module_kind(module)
            if layer is not None:
                grid[layers.index(layer), kinds.index(kind)] = labels.index(g.chosen.label)
    colours = ["#fde0c5", "#f59e72", "#d1495b", "#5b2a86", "#1b998b", "#888888"][: len(labels)]
    ax.imshow(grid, aspect="auto", cmap=ListedColormap(colours), vmin=-0.5, vmax=len(labels) - 0.5,
              interpolation="nearest")  # fmt: skip
    ax.set_title(f"chosen at {choice.avg_bits:.3f} bits")
    ax.set_xticks(range(len(kinds)), [k.split(".")[-1] for k in kinds], rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(layers)), [str(v) for v in layers], fontsize=6)
    ax.legend(handles=[Patch(color=c, label=lab) for c, lab in zip(colours, labels, strict=True)], fontsize=6,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))  # fmt: skip


def recipe_toml(choice: Choice, cands: tuple[Candidate, ...], ignore: tuple[str, ...]) -> str:
    """The chosen plan as a recipe file: one rule per candidate chosen, exact module names."""
    recipe = choice.recipe(cands, ignore)
    out = [f"# {budget_line(choice)}", f"ignore = {_strings(list(recipe.ignore))}", ""]
    for rule in recipe.rules:
        out += ["[[rule]]", f"targets = {_strings(list(rule.targets))}", f'scheme = "{rule.scheme.name}"']
        if rule.scheme.weight_args().get("strategy") == "group":
            out.append(f"group_size = {rule.scheme.group_size}")
        out.append("")
    return "\n".join(out)


def _strings(values: list[str]) -> str:
    import json

    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def write_report(
    out: Path, table: Table, cands: tuple[Candidate, ...], measure: str, choice: Choice | None,
    ignore: tuple[str, ...], force: bool,
) -> list[Path]:  # fmt: skip
    """The report's files in `out`, written beside it and renamed into place; an existing `out` is replaced
    only with `force`, and only when it holds nothing but this report's files."""
    import json

    _check_out(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f".{out.name}.partial-{secrets.token_hex(6)}")
    os.mkdir(work)  # a new name (mkdir refuses one that exists), in the umask's mode: it becomes OUT
    try:
        (work / "sensitivity.json").write_text(json.dumps(table.to_json(), indent=1) + "\n")
        (work / "sensitivity.md").write_text(markdown(table, cands, measure, choice))
        heat_map(table, cands, measure, work / "sensitivity.png", choice)
        if choice is not None:
            (work / "plan.toml").write_text(recipe_toml(choice, cands, ignore))
        if os.path.lexists(out):
            shutil.rmtree(out)
        os.rename(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return [out / name for name in FILES if (out / name).exists()]


def _check_out(out: Path, force: bool) -> None:
    if not os.path.lexists(out):
        return
    if not force:
        raise WeightsmithError("exists; pass --force to replace it", file=out, code="usage")
    info = os.lstat(out)
    if not stat.S_ISDIR(info.st_mode) or any(
        name not in FILES or not stat.S_ISREG(os.lstat(out / name).st_mode) for name in os.listdir(out)
    ):
        raise WeightsmithError(
            f"holds files a sensitivity report does not write (only {', '.join(FILES)}); choose another --out",
            file=out,
            code="usage",
        )
