"""How fast the command line starts, and whether a fresh clone's first quantize pays a compile.

1. `weightsmith --help` and every command's `--help`, each in a fresh process, alternating with two
   peers, `python -c "import typer"` (what any typer command line pays before its own work) and the
   `--help` of a plain typer app's command with three options and nothing else (typer's rich help and
   the pydantic validator it builds for an unset help flag), and with numba's own import: medians of
   wall and CPU seconds, and which of numpy, numba, scipy or pydantic each loaded (none should: they wait for
   work that needs them). Target: 0.15 s each. The sources are byte-compiled first, as an installed
   package's are: with PYTHONDONTWRITEBYTECODE set, an edited module would be compiled in every run.
   `--against REV` adds every `--help` of git revision REV (a worktree of it), alternating with ours.
2. `weightsmith quantize` of a small BF16 checkpoint, the default recipe and plain W4A16 RTN, kernels
   in numba's cache: seconds from the process's start to its first quantized rows written, with the
   kernels' load (numba's import and cache load) within it. Target: 0.3 s.
3. A fresh clone of this repository (`git clone` into a temporary folder, so that it has its own
   numba cache beside its sources), and there:
   - `make demo`: the install step (`make .venv/.core`) timed on its own, then the demo, which
     compiles only the kernels it uses: seconds to its first output line and to its end;
   - a plain `pip install` of the clone into a fresh venv (no warm step), then for every scheme a
     plain run can take, `weightsmith quantize` of one synthetic BF16 checkpoint (`--gib`, 1 GiB)
     twice: the first run compiles that scheme's kernels (and must say so on its first line), the
     second loads them from numba's cache. Their wall and CPU seconds, and the first run's notice.

The machine may be shared: the load average is printed with each part, and CPU seconds (what
bounds the wall time on an idle machine) are shown beside wall seconds.

    python benchmarks/startup_speed.py [--runs 7] [--skip-clone] [--skip-demo] [--gib 1] [--schemes NAME ...]
                                       [--results FILE] [--against REV]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "numba", "scipy", "pydantic")
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


#: A plain typer app's command with three options and no work, its `--help`: what typer alone costs a
#: command's help (it builds a pydantic validator for its unset help flag, which `weightsmith.cli` avoids).
PEER_HELP = """
import sys
import typer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def root() -> None:
    \"\"\"A peer.\"\"\"


@app.command()
def cmd(
    path: str = typer.Argument(..., help="A path."),
    count: int = typer.Option(1, min=0, help="A count."),
    flag: bool = typer.Option(False, "--flag", help="A flag."),
) -> None:
    \"\"\"A command with options.\"\"\"


sys.argv = ["peer", "cmd", "--help"]
app()
"""
#: The most a command's `--help` may take, wall seconds, and a quantize run's time from its start to
#: its first quantized rows written with the kernels in numba's cache.
HELP_TARGET, FIRST_OUTPUT_TARGET = 0.15, 0.3


def start_up(runs: int) -> dict[str, Any]:
    from weightsmith.cli import COMMAND_MODULES

    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    commands = {
        "peer: python -c 'import typer'": [sys.executable, "-c", "import typer"],
        "peer: a typer command with three options, --help": [sys.executable, "-c", PEER_HELP],
        "numba's own import": [sys.executable, "-c", "import numba"],
        "weightsmith --help": [sys.executable, "-c", LOADED, "--help"],
    } | {f"weightsmith {name} --help": [sys.executable, "-c", LOADED, name, "--help"] for name in COMMAND_MODULES}
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
    peer = statistics.median(results["peer: a typer command with three options, --help"].walls)
    helps = {
        label: statistics.median(r.walls)
        for label, r in results.items()
        if label.startswith("weightsmith") and label.endswith("--help")
    }
    bare, slowest = helps["weightsmith --help"], max(helps, key=helps.__getitem__)
    print(f"  slowest --help: {slowest} {helps[slowest]:.3f} s = {helps[slowest] / bare:.2f}x `weightsmith --help` "
          f"(typer and its rich help, no command's modules: {bare:.3f} s); a plain typer app's command {peer:.3f} s; "
          f"{sum(v <= HELP_TARGET for v in helps.values())} of {len(helps)} within {HELP_TARGET} s")  # fmt: skip
    return {
        "runs": runs,
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "commands": {
            label: {"wall": statistics.median(r.walls), "best": min(r.walls), "cpu": statistics.median(r.cpus)}
            | ({"loaded": r.note.split("loaded:", 1)[1].strip()} if "loaded:" in r.note else {})
            for label, r in results.items()
        },
    }


def help_against(rev: str, runs: int) -> dict[str, Any]:
    """Every command's `--help` of this tree against the same of revision `rev` (a git worktree of it),
    alternating in one run, both byte-compiled: medians and each command's ratio."""
    from weightsmith.cli import COMMAND_MODULES

    with tempfile.TemporaryDirectory(prefix="startup-against-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
        try:
            trees = {rev: tree / "src", "this tree": REPO / "src"}
            compileall.compile_dir(tree / "src", quiet=1)  # as `main` compiles this tree's
            labels = ["", *COMMAND_MODULES]
            walls: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in labels}
            load = os.getloadavg()[0]
            for k in range(runs):
                for name in labels:
                    for label, src in list(trees.items())[:: 1 if k % 2 == 0 else -1]:  # each goes first in turn
                        wall, _, _ = run([sys.executable, "-m", "weightsmith", *([name] if name else []), "--help"],
                                         os.environ | {"PYTHONPATH": str(src)})  # fmt: skip
                        walls[(label, name)].append(wall)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)
    print(f"every --help against {rev}, {runs} alternating runs (load average {load:.2f} before):")
    out: dict[str, Any] = {"rev": rev, "runs": runs, "load": round(load, 2), "commands": {}}
    for name in labels:
        before, after = (statistics.median(walls[(t, name)]) for t in trees)
        label = f"weightsmith {name} --help".replace("  ", " ")
        print(f"  {label:36s} {rev} {before:.3f} s, this tree {after:.3f} s ({before / after:.2f}x)")
        out["commands"][label] = {"before": before, "after": after}
    return out


def first_output(runs: int) -> dict[str, Any]:
    """`weightsmith quantize` (the default recipe and plain W4A16 RTN) of a small BF16 checkpoint, kernels
    in numba's cache: seconds from the process's start to its first quantized rows written (`--json`'s
    `first_output`), and the kernels' load (numba's import and cache load, on one worker) within it."""
    from common import build

    env = os.environ | {"PYTHONPATH": str(REPO / "src")}
    arms = {"default recipe": [], "w4a16 RTN": ["--scheme", "w4a16", "--scale-search", "none"]}
    figures: dict[str, dict[str, list[float]]] = {arm: {"first_output": [], "load": [], "wall": []} for arm in arms}
    with tempfile.TemporaryDirectory(prefix="first-output-") as tmp:
        src = Path(tmp) / "src"
        build(src, 0.0, shards=1, layers=1, hidden=1024, inter=2816, vocab=4096)
        load = os.getloadavg()[0]
        for k in range(runs + 1):  # the first round warms numba's cache and the page cache; it is not counted
            for arm, flags in arms.items():
                out = Path(tmp) / "out"
                shutil.rmtree(out, ignore_errors=True)
                command = [sys.executable, "-m", "weightsmith", "quantize", str(src), str(out), "--json", "--no-hash"]
                started = time.perf_counter()
                done = subprocess.run([*command, *flags], capture_output=True, text=True, env=env, check=True)
                wall = time.perf_counter() - started
                split = json.loads(done.stdout)["time_split"]
                if k:
                    figures[arm]["first_output"].append(split["first_output"])
                    figures[arm]["load"].append(split["wall"]["load"])
                    figures[arm]["wall"].append(wall)
    print(f"quantize to its first output, kernels cached, {runs} runs each (load average {load:.2f}):")
    out: dict[str, Any] = {"runs": runs, "load": round(load, 2)}
    for arm, got in figures.items():
        medians = {key: statistics.median(values) for key, values in got.items()}
        print(f"  {arm:16s} first output at {medians['first_output']:.3f} s (target {FIRST_OUTPUT_TARGET} s), "
              f"of which the kernels' load {medians['load']:.3f} s; whole run {medians['wall']:.3f} s")  # fmt: skip
        out[arm] = medians
    return out


def fresh_env() -> dict[str, str]:
    """This environment without what would point a child at this checkout or at another numba cache."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "VIRTUAL_ENV")}


def first_line_run(command: list[str], env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    """Run `command`, stdout and stderr together: seconds to its first output line, wall and CPU
    seconds (its own and its children's, from wait4), and that first line."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True)
    assert proc.stdout is not None
    first, first_at, lines = "", None, []
    for line in proc.stdout:
        if first_at is None and line.strip():
            first, first_at = line.strip(), time.perf_counter() - started
        lines.append(line)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed: {''.join(lines[-20:])}")
    return {"first_line_s": round(first_at or wall, 2), "wall": round(wall, 2),
            "cpu": round(usage.ru_utime + usage.ru_stime, 2), "first_line": first}  # fmt: skip


def make_demo(clone: Path) -> dict[str, Any]:
    """`make demo` on a fresh clone: the install step (`.venv/.core`) timed apart, then the demo itself."""
    env = fresh_env()
    load = os.getloadavg()[0]
    install = first_line_run(["make", "-C", str(clone), ".venv/.core"], env)
    demo = first_line_run(["make", "-s", "-C", str(clone), "--no-print-directory", "demo"], env)  # -s: its own lines
    print(f"make demo on a fresh clone (load average {load:.2f} before, {os.getloadavg()[0]:.2f} after):")
    print(f"  install (make .venv/.core): {install['wall']:.1f} s wall, {install['cpu']:.1f} s CPU")
    print(f"  demo after it: first line at {demo['first_line_s']:.1f} s, done at {demo['wall']:.1f} s wall, "
          f"{demo['cpu']:.1f} s CPU (targets on an idle 2-core machine: 30 s and 90 s)")  # fmt: skip
    return {"load": [round(load, 2), round(os.getloadavg()[0], 2)], "install": install, "demo": demo}


def pip_first_runs(clone: Path, venv: Path, gib: float, schemes: list[str]) -> dict[str, Any]:
    """A plain `pip install` of the clone into a fresh venv (no warm step), then each scheme's quantize
    of one synthetic BF16 checkpoint run twice: the first compiles that scheme's kernels, the second
    loads them. The first line a first run prints is kept: it must say when it compiles."""
    from common import build

    env = fresh_env()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(clone)], check=True, env=env)  # fmt: skip
    src = venv.parent / "bf16"
    size = build(src, gib)
    print(f"plain pip install in a fresh venv; each scheme quantizes a {size / 2**30:.2f} GiB BF16 checkpoint twice:")
    results: dict[str, Any] = {"gib": round(size / 2**30, 2)}
    for scheme in schemes:
        load = os.getloadavg()[0]
        runs = []
        for k in range(2):
            out = venv.parent / f"out-{scheme}-{k}"
            command = [str(venv / "bin" / "weightsmith"), "quantize", str(src), str(out), "--scheme", scheme,
                       "--no-hash"]  # fmt: skip
            runs.append(first_line_run(command, env))
            shutil.rmtree(out)
        first, second = runs
        notice = first["first_line"] if first["first_line"].startswith("compiling") else ""
        said = f"; says: {notice}" if notice else ""
        print(f"  {scheme:12s} first {first['wall']:6.1f} s wall {first['cpu']:6.1f} s CPU, second "
              f"{second['wall']:6.1f} s wall {second['cpu']:6.1f} s CPU: {first['wall'] / second['wall']:.2f}x wall, "
              f"{first['cpu'] - second['cpu']:+.1f} s CPU (load {load:.2f}){said}")  # fmt: skip
        results[scheme] = {"load": round(load, 2), "first": first, "second": second, "notice": notice}
    return results


def first_runs(gib: float, demo: bool, schemes: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="startup-speed-") as tmp:
        clone = Path(tmp) / "weightsmith"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()  # fmt: skip
        print(f"fresh clone of {commit} in a temporary folder:")
        results: dict[str, Any] = {"commit": commit}
        if demo:
            results["make_demo"] = make_demo(clone)
        if schemes:
            results["pip"] = pip_first_runs(clone, Path(tmp) / "pip" / "venv", gib, schemes)
        return results


def default_schemes() -> list[str]:
    """Every scheme a plain run can take (the calibrated presets need statistics of a real model), one
    name per kernel set (an alias runs its twin's kernels)."""
    from weightsmith.schemes import REGISTRY, make_scheme

    seen, names = set(), []
    for name, cls in REGISTRY.items():
        scheme = make_scheme(name)
        key = (cls, scheme.symmetric, scheme.group_size, scheme.scale_search)
        if not cls.NEEDS_CALIBRATION and key not in seen:
            seen.add(key)
            names.append(name)
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each start-up command")
    parser.add_argument("--skip-clone", action="store_true", help="only the start-up part")
    parser.add_argument("--skip-demo", action="store_true", help="leave out `make demo`")
    parser.add_argument("--gib", type=float, default=1.0, help="size of the checkpoint each scheme quantizes")
    parser.add_argument("--schemes", nargs="*", help="schemes to run first and second (default: every plain one)")
    parser.add_argument("--results", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--against", metavar="REV", help="also time every --help of git revision REV beside ours")
    args = parser.parse_args(argv)
    compileall.compile_dir(REPO / "src", quiet=1)  # bytecode as an installed package has it
    results = {"cores": os.cpu_count(), "start_up": start_up(args.runs), "first_output": first_output(args.runs)}
    if args.against:
        results["against"] = help_against(args.against, args.runs)
    if not args.skip_clone:
        schemes = default_schemes() if args.schemes is None else args.schemes
        results["first_run"] = first_runs(args.gib, not args.skip_demo, schemes)
    print(f"machine: {os.cpu_count()} CPUs")
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
