"""PNG plots for the report: every sample shown, intervals drawn, nothing smoothed away.

- `ttft.png`: every TTFT sample per arm, one panel per prompt length, with the median and the
  10th-90th percentile band; cells flagged as two-mode are marked.
- `decode.png`: decode rate per arm and prompt length: each request as a dot, the median with its
  95% bootstrap interval.
- `acceptance.png`: per-position acceptance rate from /metrics, one line per arm.
- `sweep-<arm>.png`: decode rate against the swept parameter, best value marked.
- `quality.png`: task scores, a panel for all scenarios and one per category: each arm's earned
  count in each of its runs, the runs of one arm joined, so a move between its own runs shows
  beside the gap to another arm.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from weightsmith.bench.analysis import Analysis
from weightsmith.bench.config import sweep_base, sweep_point
from weightsmith.bench.outdir import write_owned
from weightsmith.bench.results import BenchResults
from weightsmith.core.files import file_part
from weightsmith.core.terminal import printable

_DPI = 110
_COLOURS = cast("tuple[tuple[float, float, float], ...]", cast(ListedColormap, plt.get_cmap("tab10")).colors)


def _shown(text: str) -> str:
    """`text`, a label holding a name from an input (an arm, a sweep, a category), as a plot draws it.

    `printable`, so no control character reaches the font: matplotlib warns about a glyph it lacks,
    and that warning would print the raw character (an escape sequence) to the terminal. Every `$`
    escaped, so mathtext never reads a name as a formula: `a$b$c` would be drawn as math, and one
    it cannot parse (`$\\foo$`) raises while the figure is saved.
    """
    return printable(text).replace("$", r"\$")


def _label(name: str, limit: int = 22) -> str:
    """An axis label for an arm: a sweep arm's parameter goes on its own line, so the arms of
    one sweep stay distinguishable however long their base name is."""

    def cut(text: str) -> str:
        return text if len(text) <= limit else text[: limit - 1] + "…"

    if sweep_point(name):
        return f"{_shown(cut(sweep_base(name)))}\n{_shown(cut(sweep_point(name)))}"
    return _shown(cut(name))


def _save(fig: Figure, path: Path) -> None:
    """Render `fig` as PNG and write it whole to `path`, a file bench may replace (`write_owned`), never
    through a link there."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=_DPI)
    finally:
        plt.close(fig)
    write_owned(path.parent, path.name, buffer.getvalue())


def _jitter(n: int, width: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-width, width, n)


def _samples(results: BenchResults, arm: str, length: int, attr: str) -> list[float]:
    return [
        getattr(r, attr)
        for v in results.visits
        if v.arm == arm
        for r in v.requests
        if r.ok and r.target_tokens == length and getattr(r, attr) is not None
    ]


def plot_ttft(results: BenchResults, analysis: Analysis, path: Path) -> Path | None:
    """All TTFT samples per arm, a panel per prompt length."""
    lengths = sorted({p.target_tokens for p in results.prompts})
    arms = [a.name for a in results.arms]
    samples = {(a, n): _samples(results, a, n, "ttft_s") for a in arms for n in lengths}
    if not lengths or not any(samples.values()):
        return None
    flagged = {(c.arm, c.target_tokens) for c in analysis.cells if c.ttft_modality and c.ttft_modality.flagged}
    fig, axes = plt.subplots(
        1,
        len(lengths),
        figsize=(max(4.8, 1.1 * len(arms) + 2.2) * len(lengths) ** 0.8 + 1, 4.6),
        squeeze=False,
    )
    longest = max(max(values, default=0.0) for values in samples.values())
    scale, unit = (1.0, "s") if longest > 10 else (1000.0, "ms")
    for ax, length in zip(axes[0], lengths, strict=True):
        values_all: list[float] = []
        for i, arm in enumerate(arms):
            ms = np.array(samples[(arm, length)]) * scale
            if ms.size == 0:
                continue
            values_all.extend(ms)
            colour = _COLOURS[i % len(_COLOURS)]
            ax.scatter(i + _jitter(ms.size, 0.18, i), ms, s=14, alpha=0.6, color=colour, lw=0)
            p10, med, p90 = np.percentile(ms, [10, 50, 90])
            ax.plot([i - 0.3, i + 0.3], [med, med], color="black", lw=1.6)
            ax.add_patch(Rectangle((i - 0.3, p10), 0.6, p90 - p10, fill=False, ec="0.4", lw=0.8))
            if (arm, length) in flagged:
                ax.annotate(
                    "two modes",
                    (i, np.max(ms)),
                    textcoords="offset points",
                    xytext=(0, 6),
                    ha="center",
                    color="crimson",
                    fontsize=8,
                    fontweight="bold",
                )
        cell_tokens = [
            c.prompt_tokens_median for c in analysis.cells if c.target_tokens == length and c.prompt_tokens_median
        ]
        measured = f" (~{int(np.median(cell_tokens))} measured)" if cell_tokens else ""
        ax.set_title(f"prompt {length} tokens{measured}", fontsize=10)
        ax.set_xticks(range(len(arms)), [_label(a) for a in arms], fontsize=8)
        ax.set_xlim(-0.6, len(arms) - 0.4)
        if values_all and max(values_all) / max(min(values_all), 1e-9) > 20:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(bottom=0 if ax.get_yscale() == "linear" else None)
    axes[0][0].set_ylabel(f"time to first token ({unit})")
    fig.suptitle("TTFT, every request (line: median, box: 10th-90th percentile)", fontsize=11)
    fig.tight_layout()
    _save(fig, path)
    return path


def plot_decode(results: BenchResults, analysis: Analysis, path: Path) -> Path | None:
    """Decode rate per arm and prompt length: dots per request, median with 95% interval."""
    lengths = sorted({p.target_tokens for p in results.prompts})
    arms = [a.name for a in results.arms]
    cells = {(c.arm, c.target_tokens): c for c in analysis.cells}
    if not any(c.decode for c in analysis.cells):
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(arms) + 2.5), 4.6))
    width = 0.7 / max(1, len(lengths))
    for j, length in enumerate(lengths):
        colour = _COLOURS[j % len(_COLOURS)]
        for i, arm in enumerate(arms):
            x = i - 0.35 + width * (j + 0.5)
            rates = _samples(results, arm, length, "decode_tok_s")
            if rates:
                ax.scatter(
                    x + _jitter(len(rates), width * 0.25, i * 7 + j), rates, s=10, alpha=0.35, color=colour, lw=0
                )
            cell = cells.get((arm, length))
            if cell is None or cell.decode is None:
                continue
            lo, hi = cell.decode_median_ci or (cell.decode.median, cell.decode.median)
            ax.errorbar(
                x,
                cell.decode.median,
                yerr=[[cell.decode.median - lo], [hi - cell.decode.median]],
                fmt="o",
                color=colour,
                ecolor="black",
                elinewidth=1.2,
                capsize=4,
                ms=6,
                mec="black",
                label=f"prompt {length}" if i == 0 else None,
            )
    ax.set_xticks(range(len(arms)), [_label(a) for a in arms], fontsize=8)
    ax.set_ylabel("decode rate (tokens/s after the first)")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(lengths), frameon=False)
    ax.set_title("Decode rate per request; median with 95% bootstrap interval", fontsize=11, pad=24)
    fig.tight_layout()
    _save(fig, path)
    return path


#: Panels side by side in the acceptance plot before a new row starts.
_ACCEPTANCE_COLUMNS = 3


def _by_sweep_value(names: list[str]) -> dict[str, list[str]]:
    """Arm names grouped by what follows `@` (a swept value; "" for arms without one), in first-seen order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(sweep_point(name), []).append(name)
    return groups


def plot_acceptance(analysis: Analysis, path: Path) -> Path | None:
    """Per-position acceptance rate for every arm whose /metrics gave one: one panel per swept value
    (drafts at the same k side by side), each draft in the same colour and marker in every panel."""
    usable = {a.arm: a for a in analysis.acceptance if a.per_position_rate}
    if not usable:
        return None
    panels = _by_sweep_value(list(usable))
    bases = list(dict.fromkeys(sweep_base(name) for name in usable))
    columns = min(len(panels), _ACCEPTANCE_COLUMNS)
    rows = -(-len(panels) // columns)
    most = max(len(arms) for arms in panels.values())
    height = 3.4 + 0.2 * most
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, height * rows), squeeze=False, sharey=True)
    for ax, (value, arms) in zip(axes.flat, panels.items(), strict=False):
        k_max = max(len(usable[name].per_position_rate) for name in arms)
        for n, name in enumerate(arms):
            acc = usable[name]
            i = bases.index(sweep_base(name))
            # identical curves (e.g. every arm at 1.0) stay visible: later arms get smaller markers
            # drawn on top, so earlier ones show as a ring around them
            ax.plot(
                np.arange(1, len(acc.per_position_rate) + 1),
                acc.per_position_rate,
                marker="osD^v<>ph*"[i % 10],
                linestyle=("-", "--", ":", "-.")[i % 4],
                color=_COLOURS[i % len(_COLOURS)],
                label=_shown(f"{sweep_base(name)} (mean length {acc.mean_acceptance_length:.2f})"),
                lw=1.5,
                markersize=max(3.5, 9.0 - 1.8 * n),
                zorder=2 + n,
            )
        ax.set_xlabel("draft position")
        if k_max <= 16:
            ax.set_xticks(range(1, k_max + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.set_title(_shown(value) if value else "acceptance per draft position", fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("accepted / drafts")
    fig.suptitle("Acceptance per draft position (from /metrics deltas)", fontsize=11)
    fig.tight_layout()
    _save(fig, path)
    return path


def sweep_key(base: str) -> str:
    """The name a sweep's plot goes by in the report (its file is that name made safe: `file_part`)."""
    return f"sweep-{base}"


def plot_sweeps(analysis: Analysis, out_dir: Path) -> dict[str, Path]:
    """Decode rate against each swept parameter, with the best value marked; by `sweep_key`."""
    paths = {}
    for sweep in analysis.sweeps:
        points = [p for p in sweep.points if p.decode_geomean is not None]
        if not points:
            continue
        numeric = all(isinstance(p.value, int | float) for p in points)
        xs = [float(p.value) for p in points] if numeric else list(range(len(points)))
        order = np.argsort(xs)
        xs = [xs[i] for i in order]
        points = [points[i] for i in order]
        ys = [y for p in points if (y := p.decode_geomean) is not None]
        lo = [y - (p.decode_ci[0] if p.decode_ci else y) for y, p in zip(ys, points, strict=True)]
        hi = [(p.decode_ci[1] if p.decode_ci else y) - y for y, p in zip(ys, points, strict=True)]
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        ax.errorbar(
            xs,
            ys,
            yerr=[lo, hi],
            fmt="o-",
            color=_COLOURS[0],
            capsize=4,
            label="decode rate (geometric mean over prompts)",
        )
        for x, y, p in zip(xs, ys, points, strict=True):
            if p.arm == sweep.best_arm:
                ax.scatter(
                    [x],
                    [y],
                    s=260,
                    marker="*",
                    color="gold",
                    edgecolor="black",
                    zorder=5,
                    label=_shown(f"best: {sweep.param}={p.value}"),
                )
        accept = [p.mean_acceptance_length for p in points]
        if any(a is not None for a in accept):
            ax2 = ax.twinx()
            ax2.plot(
                [x for x, a in zip(xs, accept, strict=True) if a is not None],
                [a for a in accept if a is not None],
                "s--",
                color=_COLOURS[1],
                alpha=0.7,
                label="mean acceptance length",
            )
            ax2.set_ylabel("mean acceptance length", color=_COLOURS[1])
            ax2.set_ylim(bottom=1)
            handles, labels = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(handles + h2, labels + l2, fontsize=8, loc="lower right")
        else:
            ax.legend(fontsize=8, loc="lower right")
        ax.set_xticks(xs, [_shown(str(p.value)) for p in points])
        ax.set_xlabel(_shown(sweep.param))
        ax.set_ylabel("decode rate (tok/s), 95% interval")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(_shown(f"{sweep.base}: decode rate against {sweep.param}"), fontsize=11)
        fig.tight_layout()
        path = out_dir / f"{file_part(sweep_key(sweep.base))}.png"
        _save(fig, path)
        paths[sweep_key(sweep.base)] = path
    return paths


#: More categories than this are not drawn (the report's table lists them all).
_QUALITY_PANELS = 24
_RUN_MARKERS = "os^Dv<>ph*"


def plot_quality(analysis: Analysis, path: Path) -> Path | None:
    """Earned per run, per arm: a panel for all scenarios, then one per category."""
    q = analysis.quality
    if q is None or not q.arms:
        return None
    panels: list[tuple[str, list[tuple[int, list[int], list[int]]]]] = [
        ("all scenarios", [(i, a.earned, a.total) for i, a in enumerate(q.arms)])
    ]
    for category in q.categories[: _QUALITY_PANELS - 1]:
        panels.append(
            (
                category,
                [(i, c.earned, c.total) for i, a in enumerate(q.arms) for c in a.categories if c.category == category],
            )
        )
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    width = max(3.0, 0.9 * len(q.arms) + 1.4)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 2.9 * rows + 0.6), squeeze=False)
    runs = max(len(a.runs) for a in q.arms)
    for ax, (title, series) in zip(axes.flat, panels, strict=False):
        top = max((t for _, _, totals in series for t in totals), default=0)
        for i, earned, _ in series:
            colour = _COLOURS[i % len(_COLOURS)]
            xs = [i + 0.3 * (j - (len(earned) - 1) / 2) / max(1, runs - 1) for j in range(len(earned))]
            ax.plot(xs, earned, color=colour, lw=1.0, alpha=0.6)
            for j, (x, e) in enumerate(zip(xs, earned, strict=True)):
                ax.scatter([x], [e], marker=_RUN_MARKERS[j % len(_RUN_MARKERS)], color=colour, s=36, zorder=3)
        ax.axhline(top, color="0.5", lw=0.8, ls="--")
        ax.set_title(_shown(f"{title[:40]} (max {top})"), fontsize=9)
        ax.set_xticks(range(len(q.arms)), [_label(a.arm, 14) for a in q.arms], fontsize=7)
        ax.set_xlim(-0.6, len(q.arms) - 0.4)
        ax.set_ylim(0, max(1, top) * 1.08)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    handles = [
        Line2D([], [], marker=_RUN_MARKERS[j % len(_RUN_MARKERS)], color="0.3", ls="", label=f"run {j + 1}")
        for j in range(runs)
    ]
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=min(runs, 6), frameon=False)
    shown = (
        ""
        if len(q.categories) < _QUALITY_PANELS
        else f" (first {_QUALITY_PANELS - 1} of {len(q.categories)} categories)"
    )
    fig.suptitle(f"Scenarios passed per run, per arm (dashed: the maximum){shown}", fontsize=11, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    _save(fig, path)
    return path


def write_plots(results: BenchResults, analysis: Analysis, out_dir: Path) -> dict[str, Path]:
    """Every plot that has data, by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}
    plotters: tuple[tuple[str, Callable[[Path], Path | None]], ...] = (
        ("ttft", lambda p: plot_ttft(results, analysis, p)),
        ("decode", lambda p: plot_decode(results, analysis, p)),
        ("acceptance", lambda p: plot_acceptance(analysis, p)),
        ("quality", lambda p: plot_quality(analysis, p)),
    )
    for name, fn in plotters:
        path = fn(out_dir / f"{name}.png")
        if path is not None:
            made[name] = path
    made.update(plot_sweeps(analysis, out_dir))
    return made
