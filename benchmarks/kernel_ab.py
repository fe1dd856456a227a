"""Steady-state quantize speed of this checkout against another one, side by side in one run.

A change to the kernels (how they are compiled, specialised or written) must not make a warm run
slower. This builds one synthetic BF16 checkpoint, gives each source tree its own numba cache and
fills it with one discarded run per scheme, then runs `weightsmith quantize` from the two trees in
alternating order, in fresh processes: medians of quantize work (`--json` seconds) and of the kernel
phase's CPU seconds, and their ratio (after / before). The load average is printed beside them.

    git worktree add /tmp/before main
    python benchmarks/kernel_ab.py --before /tmp/before/src [--gib 0.5] [--repeats 5] [--schemes w4a16 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import build, load, measured

HERE = Path(__file__).resolve().parents[1] / "src"
#: Each scheme as it comes (its default search) and, where that is a search, plain round-to-nearest too.
DEFAULT_ARMS = [
    ("w4a16",),
    ("w4a16", "--scale-search", "none"),
    ("w4a16-asym",),
    ("w4afp8",),
    ("nvfp4a16",),
    ("nvfp4a16", "--scale-search", "mse"),
    ("fp8-dynamic",),
    ("fp8-block",),
    ("w8a8",),
    ("w8a16",),
    ("mxfp4a16",),
    ("mxfp8a16",),
]


def quantize(tree: Path, cache: Path, src: Path, out: Path, scheme: str, extra: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "NUMBA_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "weightsmith.cli", "quantize", str(src), str(out), "--json", "--no-hash",
               "--force", "--scheme", scheme, *extra]  # fmt: skip
    command += [] if "--pre-pass" in extra else ["--pre-pass", "none"]  # the scheme's kernels alone, unless asked
    run = measured(command, env=env)
    report = json.loads(run.stdout)
    return {"work": report["seconds"], "kernel_cpu": report["time_split"]["cpu"]["kernel"], "load": load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout's src folder")
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--schemes", nargs="*", help="schemes to run as they come (default: every plain scheme)")
    ap.add_argument("--results", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args()
    arms = [(s,) for s in args.schemes] if args.schemes else DEFAULT_ARMS
    trees = {"before": args.before.resolve(), "after": HERE}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        total = build(root / "src", args.gib)
        print(f"checkpoint: {total / 2**30:.2f} GiB BF16; before {trees['before']}, after {trees['after']}")
        for scheme, *extra in arms:
            label = " ".join([scheme, *extra])
            runs: dict[str, list[dict[str, float]]] = {side: [] for side in trees}
            for side, tree in trees.items():  # fill each tree's cache: not measured
                quantize(tree, root / f"numba-{side}", root / "src", root / "out", scheme, extra)
            for r in range(args.repeats):
                for side in trees if r % 2 == 0 else list(trees)[::-1]:
                    tree = trees[side]
                    runs[side].append(quantize(tree, root / f"numba-{side}", root / "src", root / "out", scheme, extra))
            med = {
                side: {k: statistics.median(x[k] for x in rs) for k in ("work", "kernel_cpu")}
                for side, rs in runs.items()
            }
            loads = [x["load"] for rs in runs.values() for x in rs]
            b, a = med["before"], med["after"]
            print(f"  {label:32s} work {b['work']:6.2f} s -> {a['work']:6.2f} s ({a['work'] / b['work']:.2f}x); "
                  f"kernel CPU {b['kernel_cpu']:6.2f} s -> {a['kernel_cpu']:6.2f} s "
                  f"({a['kernel_cpu'] / b['kernel_cpu']:.2f}x); load {min(loads):.1f}-{max(loads):.1f}",
                  flush=True)  # fmt: skip
            results[label] = {"median": med, "runs": runs}
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(
            json.dumps({"gib": args.gib, "repeats": args.repeats, "arms": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
