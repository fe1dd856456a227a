"""How quantize's throughput grows with workers, beyond the cores this machine has: a schedule of measured tasks.

A quantize run is a fixed serial part (interpreter, imports, plan, opening the outputs, closing and
verifying) and two parallel phases: the pre-pass, one task per decoder layer, then the streaming
phase, one task per hand-over of row blocks (`--workers` threads take them in order), beside the
kernels' load on one worker. Each run here records the CPU seconds of every task on the thread that
ran it (`TimeSplit.tasks`, `pre_pass_tasks`).

On paper: with W workers the time is at least serial + pre-pass CPU / W + streaming CPU / W, and at
least the longest task; Amdahl's bound is serial + parallel / W. The simulation schedules the tasks
a one-worker run measured (uncontended: one worker on two cores) onto W workers as the pipeline
does, each task to the first worker free, in hand-over order (a task that quantizes not before the
kernels' load has ended on its worker), and adds the serial part: the wall time that run spent
outside both phases. It assumes a task's CPU seconds do not grow as workers
share the memory bus and the page cache; the two-worker run, measured in the same rounds, is the
check of that on this machine (its measured time against the simulated one).

Two arms: plain W4A16 RTN on a synthetic 2.14 GiB BF16 checkpoint, and the default recipe
(asymmetric W4A16, SINQ pre-pass, wmse search) on Qwen2.5-Coder-1.5B, whose real weights set how
long the pre-pass's Sinkhorn iterations run. `--rounds` fresh processes of each worker count,
alternating; medians. `--results FILE` writes the curve (scripts/speed_report.py draws it into
docs/scaling.png).

    python benchmarks/worker_scaling.py [--rounds 3] [--max-workers 64] [--results FILE]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import build, load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models import qwen25_coder_bf16

#: Runs one quantize through the typed API in this fresh process and prints its timing as JSON.
CHILD = """
import json, sys, time
from weightsmith.core.timesplit import process_seconds
from weightsmith.api import QuantizeRequest, quantize
src, out, workers, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
result = quantize(QuantizeRequest(source=src, output=out, workers=workers, hash_sources=False, **flags))
t = result.timing
print(json.dumps({"wall": process_seconds(), "before": t.before, "pre_pass": t.pre_pass, "workers": t.workers,
                  "load": t.cpu["load"], "tasks": t.tasks, "pre_pass_tasks": t.pre_pass_tasks,
                  "bytes": result.manifest.sizes.bytes_before}))
"""
ARMS = {
    "W4A16 RTN": {"scheme": "w4a16", "scale_search": "none", "pre_pass": None},
    "default recipe": {},
}


def makespan(tasks: list[list[Any]], workers: int, load: float) -> float:
    """Each task, in order, to the first worker free, one worker loading the kernels first: a task that
    quantizes (`tasks[i] = [cpu seconds, quantizes]`) starts no earlier than the load's end, as a real one
    waits on numba's import; a copy of a kept tensor starts at once."""
    free = [load] + [0.0] * (workers - 1)
    heapq.heapify(free)
    for seconds, kernels in tasks:
        start = heapq.heappop(free)
        heapq.heappush(free, (max(start, load) if kernels else start) + seconds)
    return max(free)


def simulate(run: dict[str, Any], workers: int) -> float:
    """The wall seconds of `run` (a one-worker run's record) on `workers` workers."""
    serial = run["wall"] - run["pre_pass"] - run["workers"]
    pre = makespan([[s, False] for s in run["pre_pass_tasks"]], workers, 0.0) if run["pre_pass_tasks"] else 0.0
    return serial + pre + makespan(run["tasks"], workers, run["load"])


def child(src: Path, out: Path, workers: int, flags: dict[str, Any]) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out), str(workers), json.dumps(flags)],
                          capture_output=True, text=True, env=env, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def arm(name: str, src: Path, out: Path, rounds: int, counts: list[int]) -> dict[str, Any]:
    flags = ARMS[name]
    child(src, out, 2, flags)  # the page cache and numba's cache, alike for every round
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for r in range(rounds):
        for w in (1, 2) if r % 2 == 0 else (2, 1):
            runs[w].append(child(src, out, w, flags))
    one = sorted(runs[1], key=lambda x: x["wall"])[rounds // 2]  # the median one-worker run
    gb = one["bytes"] / 1e9
    measured = {w: statistics.median(x["wall"] for x in rs) for w, rs in runs.items()}
    curve = {w: simulate(one, w) for w in counts}
    serial = one["wall"] - one["pre_pass"] - one["workers"]
    parallel = sum(one["pre_pass_tasks"]) + sum(s for s, _ in one["tasks"]) + one["load"]
    longest = max([*(s for s, _ in one["tasks"]), *one["pre_pass_tasks"], one["load"]])
    print(f"{name}: {gb:.2f} GB; one worker {measured[1]:.2f} s (simulated {curve[1]:.2f}), two workers "
          f"{measured[2]:.2f} s (simulated {curve[2]:.2f}: {measured[2] / curve[2]:.2f}x as measured); serial "
          f"{serial:.2f} s, parallel CPU {parallel:.2f} s in {len(one['tasks'])} hand-overs and "
          f"{len(one['pre_pass_tasks'])} pre-pass tasks, the longest {longest:.2f} s")  # fmt: skip
    print("  workers  " + "  ".join(f"{w:>6}" for w in counts))
    print("  seconds  " + "  ".join(f"{curve[w]:6.2f}" for w in counts))
    print("  GB/s     " + "  ".join(f"{gb / curve[w]:6.2f}" for w in counts))
    print(f"  bound: {serial:.2f} s + {parallel:.2f} s / W, at most {gb / max(serial, longest):.2f} GB/s")
    return {
        "gb": gb,
        "measured": {str(w): s for w, s in measured.items()},
        "simulated": {str(w): s for w, s in curve.items()},
        "serial": serial,
        "parallel_cpu": parallel,
        "longest_task": longest,
        "load": load(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-workers", type=int, default=64)
    ap.add_argument("--results", type=Path, help="also write the curves here as JSON")
    args = ap.parse_args()
    counts = [1 << k for k in range(args.max_workers.bit_length()) if 1 << k <= args.max_workers]
    results: dict[str, Any] = {"cores": os.cpu_count(), "rounds": args.rounds, "arms": {}}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        synthetic = Path(tmp) / "src"
        build(synthetic, 1.81)
        sources = {"W4A16 RTN": synthetic, "default recipe": qwen25_coder_bf16()}
        for name, src in sources.items():
            results["arms"][name] = arm(name, src, Path(tmp) / "out", args.rounds, counts)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
