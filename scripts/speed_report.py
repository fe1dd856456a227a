"""The README's speed table and docs/scaling.png, from the JSON that `make bench` writes.

Every figure in the table comes from a benchmark run (benchmarks/results/*.json, written by
`quantize_speed.py --results`, `scaling.py --results` and `worker_scaling.py --results`), so the
README says what the last run measured and under what load. The table replaces what lies between the
two markers in README.md.

    python scripts/speed_report.py [--results benchmarks/results] [--readme README.md] [--plot docs/scaling.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- speed-table:begin -->", "<!-- speed-table:end -->"
RTN, REFERENCE, MSE, NVFP4 = (
    "weightsmith",
    "model_free_ptq",
    "weightsmith --scale-search mse",
    "weightsmith --scheme nvfp4a16",
)
NVFP4_MSE = NVFP4 + " --scale-search mse"
DEFAULT = "weightsmith default (wmse)"
STREAMING = ("read", "kernel", "write", "fsync")


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _loads(run: dict[str, Any]) -> str:
    lo, hi = run["load"]
    return f"load {lo:.1f}-{hi:.1f} on {run['cores']} cores"


def _split(split: dict[str, Any]) -> str:
    """CPU seconds per phase, summed over the worker threads."""
    cpu = split["cpu"]
    return ", ".join(f"{k} {cpu[k]:.2f}" for k in (*STREAMING, "load"))


def _bound(gb: float, arm: dict[str, Any], workers: int) -> float:
    """GB/s if the CPU seconds the run spent were spread evenly over `workers` otherwise idle cores:
    an upper bound (a run never divides its work perfectly), which the load of other jobs lowers."""
    split = arm["split"]
    fixed = arm["work"] - split["workers"]
    return float(gb / (fixed + sum(split["cpu"][k] for k in (*STREAMING, "load")) / workers))


def quantize_rows(q: dict[str, Any]) -> list[str]:
    gb = q["gib"] * 2**30 / 1e9
    w = q["workers"]
    ours, ref = q[RTN], q.get(REFERENCE)
    cmd = "`make bench` (`python benchmarks/quantize_speed.py --search --nvfp4 --grow 8`)"
    what = (
        f"W4A16 RTN (`--scale-search none`, as `model_free_ptq`), {q['gib']:.2f} GiB BF16 checkpoint "
        f"({q['shards']} shards), median of {q['repeats']}, {_loads(q)}"
    )
    figure = f"quantize work {ours['work']:.2f} s = **{ours['gb_s']:.2f} GB/s** of BF16 input"
    figure += f" (best {ours['best_gb_s']:.2f})"
    if ref:
        figure += (
            f"; end to end {ours['wall']:.2f} s vs {ref['wall']:.2f} s for `model_free_ptq` "
            f"(**{ref['wall'] / ours['wall']:.1f}x**); peak RSS {ours['rss_mib']:,.0f} MiB vs {ref['rss_mib']:,.0f} MiB"
        )
    figure += (
        f"; CPU seconds per phase: {_split(ours['split'])}; CPU bound on {w} idle cores: {_bound(gb, ours, w):.2f} GB/s"
    )
    if "floor" in q:
        fl = q["floor"]
        figure += (
            f"; end to end {fl['ratio']:.1f}x the floor of moving the bytes ({fl['seconds']:.2f} s: `cat` of the "
            f"source {fl['read']:.2f} s, writing the output's bytes {fl['write']:.2f} s)"
        )
    rows = [f"| {what} | {figure} | {cmd} |"]
    searches = (
        (DEFAULT, "W4A16 with its default search (wmse), no pre-pass"),
        (NVFP4, "NVFP4A16"),
        (NVFP4_MSE, "NVFP4A16 `--scale-search mse`"),
        (MSE, "W4A16 `--scale-search mse`"),
    )
    for arm, label in searches:
        if arm in q:
            a = q[arm]
            rows.append(
                f"| {label}, same checkpoint and runs | quantize work {a['work']:.2f} s = **{a['gb_s']:.2f} GB/s**; "
                f"CPU seconds per phase: {_split(a['split'])}; CPU bound on {w} idle cores: "
                f"{_bound(gb, a, w):.2f} GB/s | same |"
            )
    if "grow" in q:
        g = q["grow"]
        rows.append(
            f"| peak RSS as the model grows | {ours['rss_mib']:,.0f} MiB at {q['gib']:.2f} GiB, "
            f"{g['rss_mib']:,.0f} MiB at {g['gib']:.2f} GiB ({g['gb_s']:.2f} GB/s, load {g['load']:.1f}) | same |"
        )
    return rows


def scheme_rows(results: Path) -> list[str]:
    cells = []
    for path in sorted(results.glob("quantize-*.json")):
        q = json.loads(path.read_text())
        ours, ref = q[RTN], q.get(REFERENCE)
        ratio = f", {ref['wall'] / ours['wall']:.1f}x `model_free_ptq` end to end" if ref else ""
        cells.append(f"{q['scheme']} {ours['gb_s']:.2f} GB/s{ratio} (load {q['load'][0]:.1f}-{q['load'][1]:.1f})")
    if not cells:
        return []
    q = json.loads(next(iter(sorted(results.glob("quantize-*.json")))).read_text())
    what = f"the other schemes, {q['gib']:.2f} GiB BF16 checkpoint, median of {q['repeats']} each"
    return [f"| {what} | {'; '.join(cells)} | `python benchmarks/quantize_speed.py --gib 0.5 --scheme NAME` |"]


def inspect_rows(i: dict[str, Any]) -> list[str]:
    """`inspect` and `verify` as commands on the synthetic MoE, alone and beside a busy core."""

    def cell(name: str) -> str:
        r, busy = i[name], i[f"{name}_busy"]
        return (
            f"`{name}` **{r['wall']:.2f} s** median (best {r['best']:.2f}, CPU {r['cpu']:.2f} s, load "
            f"{r['load'][0]:.1f}-{r['load'][1]:.1f}); with one core busy {busy['wall']:.2f} s "
            f"(**{busy['wall'] / r['wall']:.2f}x**)"
        )

    what = (
        f"`inspect` and `verify` (headers only) as commands on a {i['gb']:.0f} GB sparse MoE checkpoint "
        f"({i['shards']} shards, {i['tensors']:,} tensors), median of {len(i['inspect']['runs'])}"
    )
    figure = f"{cell('inspect')}; {cell('verify')}; `inspect()` in process {i['in_process']['wall']:.2f} s"
    return [f"| {what} | {figure} | `python benchmarks/inspect_speed.py` |"]


def startup_rows(u: dict[str, Any]) -> list[str]:
    """The command line's start, `make demo` on a fresh clone, and each scheme's first quantize against its second."""
    c = u["start_up"]["commands"]
    peer, ours = c["peer: python -c 'import typer'"], c["weightsmith --help"]
    load = u["start_up"]["load"]
    rows = [
        f"| `weightsmith --help` in a fresh process, median of {u['start_up']['runs']} (load {load[0]:.1f}-"
        f"{load[1]:.1f}) | **{ours['wall']:.2f} s** wall ({ours['cpu']:.2f} s CPU); importing typer alone "
        f"{peer['wall']:.2f} s | `python benchmarks/startup_speed.py` |"
    ]
    helps = {
        label: r["wall"]
        for label, r in c.items()
        if label.startswith("weightsmith ") and label.endswith("--help") and label != "weightsmith --help"
    }
    if helps:
        slowest = max(helps, key=helps.__getitem__)
        numba = c["numba's own import"]["wall"]
        peer = c.get("peer: a typer command with three options, --help")
        beside = f"; `weightsmith --help` itself {ours['wall']:.2f} s (typer and its rich help, no command's modules)"
        if peer is not None:
            beside += f", a plain typer app's command with three options {peer['wall']:.2f} s"
        loading = sorted({c[label].get("loaded", "?") for label in helps} - {"none"})
        loads = "none loads numpy, numba, scipy or pydantic" if not loading else f"some load {', '.join(loading)}"
        rows.append(
            f"| every command's `--help`, fresh processes, median of {u['start_up']['runs']} (target 0.15 s) | "
            f"{min(helps.values()):.2f}-{helps[slowest]:.2f} s (slowest `{slowest}`){beside}; {loads}; numba's own "
            f"import {numba:.2f} s | same |"
        )
    if "against" in u:
        a = u["against"]
        ratios = {label: r["before"] / r["after"] for label, r in a["commands"].items()}
        low, high = min(ratios, key=ratios.__getitem__), max(ratios, key=ratios.__getitem__)
        rows.append(
            f"| every command's `--help` against revision {a['rev']}, alternating in the same run, median of "
            f"{a['runs']} (load {a['load']:.1f}) | **{ratios[low]:.2f}x-{ratios[high]:.2f}x** faster (`{low}` "
            f"{a['commands'][low]['before']:.2f} -> {a['commands'][low]['after']:.2f} s, `{high}` "
            f"{a['commands'][high]['before']:.2f} -> {a['commands'][high]['after']:.2f} s) | "
            f"`python benchmarks/startup_speed.py --against {a['rev']}` |"
        )
    if "first_output" in u:
        fo = u["first_output"]
        cells = "; ".join(
            f"{arm} **{r['first_output']:.2f} s**, of which the kernels' load {r['load']:.2f} s"
            for arm, r in fo.items()
            if isinstance(r, dict)
        )
        rows.append(
            f"| `quantize` from its process's start to its first quantized rows written, kernels in numba's cache, "
            f"median of {fo['runs']} (load {fo['load']:.1f}; target 0.3 s) | {cells} | same |"
        )
    f = u.get("first_run", {})
    if "make_demo" in f:
        m = f["make_demo"]
        rows.append(
            f"| `make demo` on a fresh clone, after its install step ({m['install']['wall']:.0f} s) "
            f"(load {m['load'][0]:.1f}-{m['load'][1]:.1f}) | first line at **{m['demo']['first_line_s']:.1f} s**, "
            f"done at **{m['demo']['wall']:.1f} s** wall ({m['demo']['cpu']:.1f} s CPU), the kernels it uses "
            "compiled on the way | same |"
        )
    if "pip" in f:
        pip = f["pip"]
        cells = [
            f"{name} {r['first']['wall']:.1f} s / {r['second']['wall']:.1f} s "
            f"(+{r['first']['cpu'] - r['second']['cpu']:.1f} s CPU)"
            for name, r in pip.items()
            if name != "gib"
        ]
        loads = [r["load"] for name, r in pip.items() if name != "gib"]
        rows.append(
            f"| first `quantize` against the second after a plain `pip install`, {pip['gib']:.2f} GiB BF16 "
            f"checkpoint, each scheme (load {min(loads):.1f}-{max(loads):.1f}); a first run says on its first "
            f"line that it compiles | {'; '.join(cells)} | same |"
        )
    return rows


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y over x."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def scaling_rows(s: dict[str, Any]) -> list[str]:
    rows = []
    for kind, fit in s["fits"].items():
        mine = [r for r in s["rows"] if r["kind"] == kind]
        points = ", ".join(
            f"{r['factor']}x {r['gb']:.1f} GB / {r['tensors']:,} tensors: {r['seconds']:.2f} s "
            f"({r['s_per_gb']:.3f} s/GB, {r['ms_per_tensor']:.3f} ms/tensor, load {r['load']:.1f})"
            for r in mine
        )
        if kind == "quantize":  # its cost follows the bytes; inspect's follows the tensors (headers)
            line = f"{fit['fixed_s']:.2f} s + {fit['s_per_gb']:.3f} s per GB"
        else:
            fixed, per_tensor = _fit([(r["tensors"], r["seconds"]) for r in mine])
            line = f"{fixed:.2f} s + {per_tensor * 1e6:.1f} ms per 1,000 tensors"
        rows.append(
            f"| `{kind}` at 1x, 2x, 10x, median of {s['repeats']} (docs/scaling.png) | {points}; "
            f"fit: **{line}** | `python benchmarks/scaling.py` |"
        )
    return rows


def workers_rows(w: dict[str, Any]) -> list[str]:
    """Throughput against workers, simulated from one-worker runs' tasks, with the two-worker check."""
    rows = []
    for name, a in w["arms"].items():
        curve = ", ".join(f"{k} {a['gb'] / s:.2f}" for k, s in a["simulated"].items())
        check = a["measured"]["2"] / a["simulated"]["2"]
        rows.append(
            f"| {name} on more workers than cores: GB/s per worker count, scheduled from a one-worker run's "
            f"measured tasks (docs/scaling.png) | {curve}; serial {a['serial']:.2f} s, parallel CPU "
            f"{a['parallel_cpu']:.2f} s, so at most {a['gb'] / max(a['serial'], a['longest_task']):.2f} GB/s; "
            f"two workers measured {a['measured']['2']:.2f} s, {check:.2f}x the simulated (load {a['load']:.1f}) "
            f"| `python benchmarks/worker_scaling.py` |"
        )
    return rows


def plot(s: dict[str, Any], path: Path, w: dict[str, Any] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(s["fits"])
    fig, axes = plt.subplots(1, len(kinds) + (w is not None), figsize=(5 * (len(kinds) + (w is not None)), 4))
    for ax, kind in zip(axes, kinds, strict=False):
        mine = [r for r in s["rows"] if r["kind"] == kind]
        fit = s["fits"][kind]
        gbs = [r["gb"] for r in mine]
        for r in mine:
            ax.scatter([r["gb"]] * len(r["runs"]), r["runs"], color="0.6", s=12)
        ax.plot(gbs, [r["seconds"] for r in mine], "o", color="C0", label="median")
        top = max(gbs) * 1.05
        ax.plot([0, top], [fit["fixed_s"], fit["fixed_s"] + fit["s_per_gb"] * top], "-", color="C1",
                label=f"{fit['fixed_s']:.2f} s + {fit['s_per_gb']:.3f} s/GB")  # fmt: skip
        for r in mine:
            ax.annotate(f"{r['factor']}x, {r['tensors']:,} tensors", (r["gb"], r["seconds"]), fontsize=8,
                        textcoords="offset points", xytext=(4, -10))  # fmt: skip
        ax.set_xlabel("GB of tensors" + (" (sparse files)" if kind == "inspect" else " (BF16)"))
        ax.set_ylabel("seconds")
        ax.set_title(f"weightsmith {kind}")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=8)
    if w is not None:
        ax = axes[-1]
        for k, (name, a) in enumerate(w["arms"].items()):
            counts = [int(c) for c in a["simulated"]]
            ax.plot(counts, [a["gb"] / a["simulated"][str(c)] for c in counts], "-o", color=f"C{k}", ms=4,
                    label=f"{name}: simulated")  # fmt: skip
            ax.plot([int(c) for c in a["measured"]], [a["gb"] / v for v in a["measured"].values()], "x",
                    color=f"C{k}", ms=9, label=f"{name}: measured on {w['cores']} cores")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel("GB/s of BF16 input, end to end")
        ax.set_title("weightsmith quantize on more workers")
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right", fontsize=8)
    loads = [r["load"] for r in s["rows"]]
    fig.suptitle(
        f"time against model size: medians of {s['repeats']} (grey: each run), {s['cores']} cores shared with "
        f"other jobs (load {min(loads):.1f}-{max(loads):.1f})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--readme", type=Path, default=Path("README.md"))
    ap.add_argument("--plot", type=Path, default=Path("docs/scaling.png"))
    args = ap.parse_args()
    rows: list[str] = []
    q = _load(args.results / "quantize.json")
    if q:
        rows += quantize_rows(q)
    rows += scheme_rows(args.results)
    i = _load(args.results / "inspect.json")
    if i:
        rows += inspect_rows(i)
    u = _load(args.results / "startup.json")
    if u:
        rows += startup_rows(u)
    s = _load(args.results / "scaling.json")
    w = _load(args.results / "workers.json")
    if s:
        rows += scaling_rows(s)
    if w:
        rows += workers_rows(w)
    if s:
        plot(s, args.plot, w)
    table = "\n".join(["| what | figure | command |", "|---|---|---|", *rows])
    text = args.readme.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    args.readme.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    print(f"wrote {len(rows)} rows into {args.readme}" + (f" and {args.plot}" if s else ""))


if __name__ == "__main__":
    main()
