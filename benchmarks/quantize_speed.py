"""Quantize speed and memory against llm-compressor's `model_free_ptq`, measured in the same run.

Builds a synthetic Llama-shaped BF16 checkpoint (default about 2 GiB, in 4 shards), then runs,
in alternating order and in fresh processes, `weightsmith quantize` and `model_free_ptq` with the
same scheme (W4A16, group 128, or the preset of `--scheme NAME`) and ignore list. Prints medians
of wall time end to end (process start, imports and all), weightsmith's own quantize time and
throughput, peak RSS of each, the ratio, the machine's load average, and the time split of the
median run (what bounds the rate: CPU seconds per phase against the cores there are); weightsmith
runs plain RTN (`--scale-search none`), as model_free_ptq does, and, where the scheme has a default
search (w4a16's wmse), that default too, as a fraction of plain RTN's throughput. `--grow 8`
repeats weightsmith alone on an 8 GiB checkpoint to show that peak RSS stays flat as the model
grows. The floor is what moving the bytes costs any tool: `cat` of the source plus writing the
output's bytes into memory (tmpfs); our end-to-end time is given as a multiple of it. `--results FILE`
also writes the figures as JSON (scripts/speed_report.py turns them into the README's table).

    python benchmarks/quantize_speed.py [--gib 2] [--repeats 3] [--grow 8] [--workers N] [--search [NAME]] [--nvfp4]
                                        [--scheme fp8-dynamic] [--arm LABEL=OPTIONS]... [--results FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import build, load, ours, reference, split_line
from weightsmith.quantization.pipeline import default_workers
from weightsmith.schemes import SCHEME_NAMES, make_scheme

RTN, REFERENCE, NVFP4 = ("weightsmith", "model_free_ptq", "weightsmith --scheme nvfp4a16")


def io_floor(src: Path, out: Path, elsewhere: Path, repeats: int) -> dict[str, float]:
    """What any tool pays to move these bytes: `cat` of the source shards to /dev/null (the page cache
    warm, as for the runs) and writing the output shards' bytes anew into memory (tmpfs /dev/shm where
    there is one, else under `elsewhere`: no disk, no writeback throttling, no fsync, all of which
    quantize pays, so a floor no tool goes below); medians over `repeats`."""
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and os.access(shm, os.W_OK) else elsewhere
    shards = sorted(src.glob("*.safetensors"))
    data = [p.read_bytes() for p in sorted(out.glob("*.safetensors"))]
    reads, writes = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)
        reads.append(time.perf_counter() - started)
        with tempfile.TemporaryDirectory(dir=root) as scratch:
            started = time.perf_counter()
            for k, blob in enumerate(data):
                Path(scratch, f"{k}.bin").write_bytes(blob)
            writes.append(time.perf_counter() - started)
    read, write = statistics.median(reads), statistics.median(writes)
    return {"read": read, "write": write, "seconds": read + write}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--grow", type=float, default=0.0, help="also run weightsmith alone on a checkpoint this many GiB")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--search", nargs="?", const="mse", metavar="NAME",
                    help="also time --scale-search NAME (mse when bare) against plain RTN")  # fmt: skip
    ap.add_argument("--nvfp4", action="store_true", help="also time --scheme nvfp4a16, plain and with its search")
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="LABEL=OPTIONS",
        help="also time weightsmith with these quantize options, e.g. 'hqq=--scheme w4a16-asym --scale-search hqq'",
    )
    ap.add_argument("--scheme", choices=SCHEME_NAMES, default="w4a16", help="the scheme both sides run")
    ap.add_argument("--results", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args()
    workers = args.workers or default_workers()
    results: dict = {"scheme": args.scheme, "workers": workers, "cores": os.cpu_count(), "load_start": load()}
    preset = make_scheme(args.scheme).config_group_name  # what model_free_ptq is asked for
    # our arms: the label the summary prints, and the options added to `weightsmith quantize`
    arms = {RTN: ("--scheme", args.scheme)}
    default = make_scheme(args.scheme).scale_search
    if default:
        arms[f"weightsmith default ({default})"] = ("--scheme", args.scheme)
    if args.search:
        arms[f"weightsmith --scale-search {args.search}"] = ("--scheme", args.scheme, "--scale-search", args.search)
    if args.nvfp4:
        arms[NVFP4] = ("--scheme", "nvfp4a16")
        arms[NVFP4 + " --scale-search mse"] = ("--scheme", "nvfp4a16", "--scale-search", "mse")
    for arm in args.arm:
        label, _, options = arm.partition("=")
        arms[f"weightsmith {label}"] = tuple(options.split())

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        tmp_path = Path(tmp)
        total = build(tmp_path / "src", args.gib)
        shards = len(list((tmp_path / "src").glob("*.safetensors")))
        print(f"checkpoint: {total / 2**30:.2f} GiB BF16 tensors in {shards} shards; scheme {preset}")
        order = [RTN, REFERENCE, *list(arms)[1:]]
        runs: dict[str, list[dict]] = {arm: [] for arm in order}
        for r in range(args.repeats):
            for arm in order if r % 2 == 0 else order[::-1]:
                if arm == REFERENCE:
                    if args.skip_reference:
                        continue
                    runs[arm].append(reference(tmp_path / "src", tmp_path / "ref", repr(preset)))
                else:
                    runs[arm].append(ours(tmp_path / "src", tmp_path / "ours", args.workers, *arms[arm],
                                          default_search=arm.startswith("weightsmith default")))  # fmt: skip
                print(f"  run {r + 1} {arm}: {runs[arm][-1]}", flush=True)

        def med(arm: str, key: str) -> float:
            return statistics.median(x[key] for x in runs[arm])

        def median_run(arm: str) -> dict:
            return sorted(runs[arm], key=lambda x: x["work"])[len(runs[arm]) // 2]

        gb = total / 1e9
        loads = [x["load"] for rs in runs.values() for x in rs]
        results.update(gib=round(total / 2**30, 2), shards=shards, repeats=args.repeats)
        results["load"] = [min(loads, default=0.0), max(loads, default=0.0)]
        ws_wall, ws_work, ws_rss = med(RTN, "wall"), med(RTN, "work"), med(RTN, "rss_mib")
        print(f"\nweightsmith      end to end {ws_wall:6.2f} s   quantize work {ws_work:6.2f} s", end="")
        print(f" ({gb / ws_work:.2f} GB/s of BF16 input)   peak RSS {ws_rss:,.0f} MiB")
        best = min(x["work"] for x in runs[RTN])
        print(f"                 best run: quantize work {best:6.2f} s ({gb / best:.2f} GB/s)")
        split = median_run(RTN)["split"]
        print(f"time split of the median run: {split_line(split, median_run(RTN)['work'], workers)}")
        print(f"load average (1 min) over the runs: {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores")
        results[RTN] = {"wall": ws_wall, "work": ws_work, "gb_s": gb / ws_work, "best_gb_s": gb / best,
                        "rss_mib": ws_rss, "split": split}  # fmt: skip
        floor = io_floor(tmp_path / "src", tmp_path / "ours", tmp_path, args.repeats)
        above = ws_wall / floor["seconds"]
        print(f"floor: cat of the source {floor['read']:.2f} s + writing the output's bytes {floor['write']:.2f} s"
              f" = {floor['seconds']:.2f} s; weightsmith end to end is {above:.1f}x it")  # fmt: skip
        results["floor"] = floor | {"ratio": above}
        if runs[REFERENCE]:
            ref_wall, ref_rss = med(REFERENCE, "wall"), med(REFERENCE, "rss_mib")
            print(f"model_free_ptq   end to end {ref_wall:6.2f} s   peak RSS {ref_rss:,.0f} MiB")
            print(f"ratio            {ref_wall / ws_wall:.1f}x faster end to end, ", end="")
            print(f"{med(REFERENCE, 'work') / ws_work:.1f}x on the quantize work (median of {args.repeats})")
            results[REFERENCE] = {"wall": ref_wall, "work": med(REFERENCE, "work"), "rss_mib": ref_rss}
        for arm in list(arms)[1:]:
            work = med(arm, "work")
            label = arm.removeprefix("weightsmith ")
            print(f"with {label}: quantize work {work:6.2f} s ({gb / work:.2f} GB/s), ", end="")
            print(f"{ws_work / work:.2f} of plain RTN's throughput, peak RSS {med(arm, 'rss_mib'):,.0f} MiB")
            mid = median_run(arm)
            print(f"  time split of its median run: {split_line(mid['split'], mid['work'], workers)}")
            results[arm] = {"work": work, "gb_s": gb / work, "rss_mib": med(arm, "rss_mib"), "split": mid["split"]}
        if args.grow:
            for leftover in ("ours", "ref", "src"):
                shutil.rmtree(tmp_path / leftover, ignore_errors=True)
            big = build(tmp_path / "big", args.grow)
            r = ours(tmp_path / "big", tmp_path / "ours-big", args.workers)
            print(
                f"weightsmith on {big / 2**30:.2f} GiB: end to end {r['wall']:.2f} s, quantize work {r['work']:.2f} s",
                end="",
            )
            print(f" ({big / 1e9 / r['work']:.2f} GB/s), peak RSS {r['rss_mib']:,.0f} MiB, load {r['load']:.2f}")
            results["grow"] = {"gib": round(big / 2**30, 2), "work": r["work"], "gb_s": big / 1e9 / r["work"],
                               "rss_mib": r["rss_mib"], "load": r["load"]}  # fmt: skip
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
