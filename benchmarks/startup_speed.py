"""How fast the command line starts, and whether a fresh clone's first quantize pays a compile.

1. `weightsmith --help` and `weightsmith inspect --help`, each in a fresh process, alternating with
   the peer `python -c "import typer"` (what any typer command line pays before its own work):
   medians of wall and CPU seconds, and whether numpy, numba or scipy were loaded (they must not be
   for `--help`).
2. A fresh clone of this repository (`git clone` into a temporary folder, so that it has its own
   numba cache beside its sources), set up as `make` sets it up (`python -m weightsmith.warm`, which
   compiles every kernel), then the demo draft quantized twice with the dflash-draft preset: the
   first and the second run's wall and CPU seconds and their ratio. `--no-warm` leaves out the
   set-up step, to show the compile a first run pays without it.

The machine may be shared: the load average is printed with each part, and CPU seconds (what
bounds the wall time on an idle machine) are shown beside wall seconds.

    python benchmarks/startup_speed.py [--runs 7] [--no-warm] [--skip-clone] [--results FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "numba", "scipy")
#: Prints which of HEAVY a `weightsmith ARGS` run loaded, on stderr after the command's own output.
LOADED = f"""
import sys
sys.argv = ["weightsmith", *sys.argv[1:]]
from weightsmith.cli import main
try:
    main()
except SystemExit:
    pass
print("loaded:", ",".join(m for m in {HEAVY!r} if m in sys.modules) or "none", file=sys.stderr)
"""


@dataclass
class Runs:
    """Wall and CPU seconds of each run of one command."""

    label: str
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    note: str = ""

    def add(self, wall: float, cpu: float) -> None:
        self.walls.append(wall)
        self.cpus.append(cpu)

    def line(self) -> str:
        if len(self.walls) == 1:
            return f"  {self.label:44s} wall {self.walls[0]:6.3f} s, CPU {self.cpus[0]:6.3f} s{self.note}"
        return (
            f"  {self.label:44s} wall median {statistics.median(self.walls):6.3f} s (best {min(self.walls):.3f}), "
            f"CPU median {statistics.median(self.cpus):6.3f} s{self.note}"
        )


def run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, float, str]:
    """Wall and CPU seconds of `command` in a fresh process (its own usage, from wait4), and its stderr."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}): {text}")
    return wall, usage.ru_utime + usage.ru_stime, text


def start_up(runs: int) -> dict[str, Any]:
    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    commands = {
        "peer: python -c 'import typer'": [sys.executable, "-c", "import typer"],
        "weightsmith --help": [sys.executable, "-c", LOADED, "--help"],
        "weightsmith inspect --help": [sys.executable, "-c", LOADED, "inspect", "--help"],
    }
    results = {label: Runs(label) for label in commands}
    load = os.getloadavg()[0]
    for _ in range(runs):  # alternating, so that every command sees the same load
        for label, command in commands.items():
            wall, cpu, err = run(command, env)
            results[label].add(wall, cpu)
            if "loaded:" in err:
                results[label].note = f"; loaded: {err.rsplit('loaded:', 1)[1].strip()}"
    print(f"start-up, {runs} runs each (load average {load:.2f} before, {os.getloadavg()[0]:.2f} after):")
    for result in results.values():
        print(result.line())
    peer = statistics.median(results["peer: python -c 'import typer'"].cpus)
    ours = statistics.median(results["weightsmith --help"].cpus)
    print(f"  `weightsmith --help`: {ours / peer:.1f}x the CPU of importing typer alone (target: under 0.3 s wall)")
    return {
        "runs": runs,
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "commands": {
            label: {"wall": statistics.median(r.walls), "best": min(r.walls), "cpu": statistics.median(r.cpus)}
            for label, r in results.items()
        },
    }


def first_run(warm: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="startup-speed-") as tmp:
        clone = Path(tmp) / "weightsmith"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()  # fmt: skip
        env = os.environ | {"PYTHONPATH": str(clone / "src")}
        print(f"fresh clone of {commit} in a temporary folder, its own numba cache:")
        if warm:
            wall, cpu, _ = run([sys.executable, "-m", "weightsmith.warm"], env, clone)
            print(f"  set-up step (python -m weightsmith.warm, as make runs it): {wall:.1f} s wall, {cpu:.1f} s CPU")
        else:
            print("  no set-up step (--no-warm): the first run compiles what it uses")
        src = Path(tmp) / "draft-bf16"
        make_draft = "import sys, pathlib, weightsmith.demo as d; d.write_demo_checkpoint(pathlib.Path(sys.argv[1]))"
        run([sys.executable, "-c", make_draft, str(src)], env, clone)
        load = os.getloadavg()[0]
        first, second = Runs("first quantize (demo draft, dflash-draft)"), Runs("second quantize")
        for result, out in ((first, "first"), (second, "second")):
            command = [sys.executable, "-m", "weightsmith", "quantize", str(src), str(Path(tmp) / out),
                       "--preset", "dflash-draft"]  # fmt: skip
            result.add(*run(command, env, clone)[:2])
        print(f"  (load average {load:.2f} before, {os.getloadavg()[0]:.2f} after)")
        print(first.line())
        print(second.line())
        ratio_wall = first.walls[0] / second.walls[0]
        ratio_cpu = first.cpus[0] / second.cpus[0]
        print(f"  first / second: {ratio_wall:.2f}x wall, {ratio_cpu:.2f}x CPU (target: within 1.20x)")
        return {
            "commit": commit,
            "warm": warm,
            "load": [round(load, 2), round(os.getloadavg()[0], 2)],
            "first": {"wall": first.walls[0], "cpu": first.cpus[0]},
            "second": {"wall": second.walls[0], "cpu": second.cpus[0]},
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each start-up command")
    parser.add_argument("--no-warm", action="store_true", help="leave out the set-up step that compiles the kernels")
    parser.add_argument("--skip-clone", action="store_true", help="only the start-up part")
    parser.add_argument("--results", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    results = {"cores": os.cpu_count(), "start_up": start_up(args.runs)}
    if not args.skip_clone:
        results["first_run"] = first_run(warm=not args.no_warm)
    print(f"machine: {os.cpu_count()} CPUs")
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
