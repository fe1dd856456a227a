"""How quantize and inspect times grow with the model: 1x, 2x and 10x, cost per GB and per tensor.

quantize: Llama-shaped BF16 checkpoints 7B wide (benchmarks/common.py) with 2, 4 and 20 decoder
layers (`--layers` sets the 1x count), the same vocabulary, so the layers grow and the embeddings
do not; each built, quantized (W4A16, `--repeats` fresh processes, median) and removed before the
next. inspect: the synthetic NVFP4 MoE of inspect_speed.py with 4, 8 and 40 sparse layers (files
extended with `ftruncate`, so 10x costs no disk). Each row prints the median time, its cost per GB
and per tensor, and the machine's load average; a least-squares line through the three points
splits each command's time into a fixed part and a cost per GB, so the time for another model
size can be read off it. `--results FILE` writes the figures as JSON (scripts/speed_report.py
draws docs/scaling.png and the README's table from it).

    python benchmarks/scaling.py [--layers 2] [--repeats 3] [--results FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from common import build, load, ours
from inspect_speed import CommandTimes, MoeShape, build_checkpoint, run_command

FACTORS = (1, 2, 10)
#: Sparse MoE layers at 1x for inspect (each about 4.6 GB and 2,300 tensors).
INSPECT_LAYERS = 4


def _tensors(root: Path) -> int:
    return len(json.loads((root / "model.safetensors.index.json").read_text())["weight_map"])


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y over x."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def _row(kind: str, factor: int, gb: float, tensors: int, seconds: list[float], rss: float | None) -> dict[str, Any]:
    t = statistics.median(seconds)
    row = {"kind": kind, "factor": factor, "gb": gb, "tensors": tensors, "seconds": t, "runs": seconds,
           "s_per_gb": t / gb, "ms_per_tensor": 1e3 * t / tensors, "rss_mib": rss, "load": load()}  # fmt: skip
    memory = f"peak RSS {rss:6,.0f} MiB  " if rss is not None else ""
    print(
        f"{kind:8} {factor:3}x {gb:9.2f} GB {tensors:8,} tensors  median {t:7.2f} s  "
        f"{row['s_per_gb']:8.3f} s/GB  {row['ms_per_tensor']:8.3f} ms/tensor  {memory}load {row['load']:.2f}",
        flush=True,
    )
    return row


def quantize_rows(tmp: Path, layers: int, repeats: int, workers: int) -> list[dict[str, Any]]:
    rows = []
    for factor in FACTORS:
        src, out = tmp / "src", tmp / "out"
        total = build(src, 0, layers=layers * factor)
        runs = [ours(src, out, workers) for _ in range(repeats)]
        rss = max(r["rss_mib"] for r in runs)
        rows.append(_row("quantize", factor, total / 1e9, _tensors(src), [r["work"] for r in runs], rss))
        shutil.rmtree(src)
        shutil.rmtree(out, ignore_errors=True)
    return rows


def inspect_rows(tmp: Path, layers: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for factor in FACTORS:
        root = build_checkpoint(tmp / f"moe-{factor}", MoeShape(layers=layers * factor))
        apparent = sum(p.stat().st_size for p in root.glob("*.safetensors"))
        times = CommandTimes([], [])
        for _ in range(repeats):
            run_command(["inspect", str(root)], times)
        # (no RSS here: a child forked from this process counts the pages it shared with it, which the
        # quantize runs above made large; inspect_speed.py measures inspect's own)
        rows.append(_row("inspect", factor, apparent / 1e9, _tensors(root), times.walls, None))
        shutil.rmtree(root)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per command: the line through its points (fixed seconds, seconds per GB) and per tensor."""
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        fixed, per_gb = fit([(r["gb"], r["seconds"]) for r in mine])
        _, per_tensor = fit([(r["tensors"], r["seconds"]) for r in mine])
        out[kind] = {"fixed_s": fixed, "s_per_gb": per_gb, "ms_per_tensor": 1e3 * per_tensor}
        print(
            f"{kind}: time = {fixed:.2f} s + {per_gb:.3f} s per GB (fit over 1x, 2x, 10x); "
            f"{1e3 * per_tensor:.3f} ms per added tensor; 10x/1x time {mine[-1]['seconds'] / mine[0]['seconds']:.1f}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the 1x quantize checkpoint")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--results", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        rows = quantize_rows(Path(tmp), args.layers, args.repeats, args.workers)
        rows += inspect_rows(Path(tmp), INSPECT_LAYERS, args.repeats)
    fits = summary(rows)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        results = {"cores": os.cpu_count(), "repeats": args.repeats, "rows": rows, "fits": fits}
        args.results.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
