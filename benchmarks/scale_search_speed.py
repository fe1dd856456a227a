"""Scale-search speed and quality against llm-compressor's `memoryless_mse`, on the same checkpoint.

Builds a Llama-shaped BF16 checkpoint (default 128 MiB; llm-compressor's eager search runs at a few
MB/s on a CPU, so larger sizes take many minutes), then runs in fresh processes:
llm-compressor `model_free_ptq` with `observer="memoryless_mse"`, and `weightsmith quantize` with
`--scale-search none` (RTN), `--scale-search mse` (ours) and `--scale-search memoryless_mse` (the exact
reproduction). Prints wall times (process start and imports included), work times (the quantize
call alone), peak RSS, the relative weight error of each output, and our search's speed-up over
llm-compressor's. At this size fixed start-up costs (numba's first call, about a second) dominate
our times; our search against our own RTN is measured at scale by `quantize_speed.py --search`.

    python benchmarks/scale_search_speed.py [--mib 128] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import build, ours, reference
from weightsmith.fidelity.weights import weight_error

MEMORYLESS = """
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=128,
                        observer="memoryless_mse")
scheme = QuantizationScheme(targets=["Linear"], weights=args)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=128.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        total = build(t / "src", args.mib / 1024, shards=1, hidden=1024, inter=2816, vocab=4096)
        print(f"checkpoint: {total / 2**20:.1f} MiB BF16 tensors")
        # each arm: the folder it writes, and the search `weightsmith quantize` is given (None: llm-compressor)
        arms: dict[str, tuple[str, str | None]] = {
            "weightsmith rtn": ("rtn", "none"),
            "weightsmith mse (ours)": ("mse", "mse"),
            "weightsmith memoryless_mse": ("memoryless", "memoryless_mse"),
            "llm-compressor memoryless_mse": ("llmc", None),
        }

        def run(arm: str) -> dict:
            folder, search = arms[arm]
            if search is None:
                return reference(t / "src", t / folder, "scheme", MEMORYLESS)
            return ours(t / "src", t / folder, args.workers, "--scale-search", search)

        runs: dict[str, list[dict]] = {k: [] for k in arms}
        for r in range(args.repeats):
            for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
                runs[arm].append(run(arm))
                print(f"  run {r + 1} {arm}: {runs[arm][-1]}", flush=True)
        # the figures every arm has (ours also report a time split, which has no median)
        med = {
            arm: {k: statistics.median(x[k] for x in rs) for k in ("wall", "work", "rss_mib")}
            for arm, rs in runs.items()
        }
        print(f"\n{'arm':32} {'wall s':>8} {'work s':>8} {'MB/s':>8} {'RSS MiB':>8} {'rel. weight MSE':>16}")
        for arm, m in med.items():
            err = weight_error(t / "src", t / arms[arm][0]).overall.rel_mse
            rate = total / 1e6 / m["work"]
            print(f"{arm:32} {m['wall']:8.2f} {m['work']:8.2f} {rate:8.1f} {m['rss_mib']:8.0f} {err:16.6e}")
        ours_mse, llmc = med["weightsmith mse (ours)"], med["llm-compressor memoryless_mse"]
        print(
            f"\nours (mse) against llm-compressor memoryless_mse: {llmc['work'] / ours_mse['work']:.0f}x faster work, ",
            end="",
        )
        print(f"{llmc['wall'] / ours_mse['wall']:.0f}x faster end to end (imports and start-up included)")
        print("(our search against our own RTN at scale: benchmarks/quantize_speed.py --search)")


if __name__ == "__main__":
    main()
