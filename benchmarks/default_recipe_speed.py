"""Speed of the default int4 recipe on a real model, against it without its pre-pass and without its search.

`weightsmith quantize SRC OUT` with no flags balances a Llama, Mistral or Qwen2 checkpoint with the
SINQ pre-pass before its `wmse` search; the pre-pass is what the default costs over asymmetric `wmse`
alone (`--pre-pass none`), and what makes it close half the KL gap to GPTQ (docs/fidelity-study.md);
the pre-pass followed by plain round-to-nearest (`--pre-pass sinq --scale-search none`) is the fast option.
Real weights matter here: they stop the Sinkhorn search after 4-5 steps a tile, where random weights
take all 16. Rounds alternate the arms (default, peer, default, ...), each a fresh process on a warm
page cache; the figures are medians over the rounds: GB/s of source tensor bytes over the quantize
seconds (`--json`'s `seconds`), the pre-pass's own seconds, and peak RSS.

    python benchmarks/default_recipe_speed.py [--rounds 5] [--model qwen|smollm2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from common import load, measured

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models import qwen25_coder_bf16, smollm2_fp32

#: model -> (its folder, built on first use; the group size its Linears take: 128 leaves SmolLM2's
#: 576-wide ones in BF16, and the pre-pass with them)
MODELS = {"qwen": (qwen25_coder_bf16, []), "smollm2": (smollm2_fp32, ["--group-size", "64"])}
#: arm -> the flags beside the model's own
ARMS = {
    "default": [],
    "--pre-pass none": ["--pre-pass", "none"],
    "sinq, RTN": ["--pre-pass", "sinq", "--scale-search", "none"],
}


def run(src: Path, out: Path, flags: list[str]) -> dict[str, float]:
    """One `weightsmith quantize` in a fresh process: its quantize seconds, pre-pass seconds, GB/s and peak RSS."""
    shutil.rmtree(out, ignore_errors=True)
    child = measured([sys.executable, "-m", "weightsmith", "quantize", str(src), str(out), "--json", "--no-hash",
                      *flags])  # fmt: skip
    report = json.loads(child.stdout)
    seconds = report["seconds"]
    return {
        "seconds": seconds,
        "pre_pass": report["time_split"].get("pre_pass", 0.0),
        "gb_s": report["manifest"]["sizes"]["bytes_before"] / 1e9 / seconds,
        "rss_mib": child.rss_mib,
        "applied": report["manifest"].get("pre_pass") is not None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both arms, alternating (default 5)")
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen")
    args = parser.parse_args()
    build, flags = MODELS[args.model]
    src = build()
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        run(src, Path(tmp) / "warm", flags)  # the page cache and numba's cache, for every round alike
        for _ in range(args.rounds):
            for arm, extra in ARMS.items():
                runs[arm].append(run(src, Path(tmp) / "out", [*flags, *extra]))
            loads.append(load())
    if not all(r["applied"] for r in runs["default"]):
        raise SystemExit(f"{src}: the default ran no pre-pass here, so there is nothing to compare")
    med = {arm: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "pre_pass", "gb_s", "rss_mib")}
           for arm, rs in runs.items()}  # fmt: skip
    print(f"{src.name}: {args.rounds} rounds, load {min(loads):.1f}-{max(loads):.1f} on 2 cores; medians:")
    for arm, m in med.items():
        spread = ", ".join(f"{r['gb_s']:.2f}" for r in runs[arm])
        pre = f", pre-pass {m['pre_pass']:.2f} s" if m["pre_pass"] else ""
        rss = f"peak RSS {m['rss_mib']:.0f} MiB"
        print(f"  {arm:15s} {m['seconds']:.2f} s = {m['gb_s']:.2f} GB/s ({spread}){pre}; {rss}")
    for peer in list(ARMS)[1:]:
        print(f"default / {peer}: {med['default']['gb_s'] / med[peer]['gb_s']:.2f}x the throughput")


if __name__ == "__main__":
    main()
