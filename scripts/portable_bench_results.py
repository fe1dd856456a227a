"""Rewrite a results.json written before bench recorded paths portably, then rebuild its report.

    python scripts/portable_bench_results.py RESULTS.json --arms-dir DIR --out-dir DIR

A version-1 results file holds the paths of the machine it ran on. This reads it with bench's own
reader, rewrites it with `weightsmith.bench.paths.make_portable` (the code `bench run` now applies
to what it saves) given the two roots that run had (the arms file's folder and its `--out` folder),
and writes results.json, report.md and the plots beside it as `bench report` does. The
measurements are untouched; only paths change.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from weightsmith.bench.paths import make_portable
from weightsmith.bench.report import write_all
from weightsmith.bench.results import load_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--arms-dir", type=Path, help="the folder the run's arms file was in")
    parser.add_argument("--out-dir", type=Path, help="the run's --out folder, as it was spelled there")
    args = parser.parse_args()
    results = make_portable(load_results(args.results), args.arms_dir, args.out_dir)
    write_all(results, args.results.parent)


if __name__ == "__main__":
    main()
