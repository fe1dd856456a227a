"""`quantize --method gptq` against llm-compressor's `oneshot` with a GPTQModifier, on CPU, same tokens.

On SmolLM2-135M (or `--model DIR`), W4A16 group 64 (576 and 1536 are not multiples of 128), each
run in its own process, one at a time, measured for wall time and peak RSS (its own, `common.measured`):
- `weightsmith quantize --method gptq --builtin code --tokens N --seq-len L --scale-search none
  --dampening 0.01` (round-to-nearest's grid and 1 % dampening, as oneshot's GPTQ);
- `oneshot` with `GPTQModifier` (same scheme, same `--actorder`: static, its default, or none;
  dampening 0.01, block 128, lm_head ignored) on the same token ids;
- `weightsmith quantize` round-to-nearest, for the KL GPTQ is to lower;
- `weightsmith quantize --method gptq` on its own defaults (the `wmse` grid, dampening 0.1), what a user
  gets without the two options above (`--skip-defaults` leaves it out).
With `--repeat N` the GPTQ runs go N rounds back to back, the order reversed every other round (the
machine's speed drifts), and the ratios are of the medians. Ours also prints where its time went
(`--json`'s `engine_split`: importing torch and transformers, tokens, each layer's loads, Hessian
passes, quantizing, output passes). Then KL, top-1
agreement and perplexity of each against the original on held-out text (Python's `textwrap.py`,
which the calibration text does not contain), by `fidelity.logits.compare`. With several `--tokens`,
each is measured in turn, and each tool's wall time is fitted as a fixed part plus a part per token:
the ratio of the per-token parts is where the ratio of whole runs goes as the calibration grows.

With `--moe FAMILY` the model is a small random MoE of that family (`tests/engine/tiny_models.py`'s
`MOE_FAMILIES` at hidden size 256, 4 layers, 8 experts of 128 with top-2 routing, SmolLM2's tokenizer),
both tools give every expert every token (ours `--all-experts`, oneshot's `moe_calibrate_all_experts`,
its default) and neither quantizes the routers (`mlp.gate`, `shared_expert_gate`), as ours never does.

    python benchmarks/gptq_speed.py [--model DIR | --moe qwen2_moe|qwen3_moe|mixtral|laguna] [--tokens 2048 [N ...]]
                                    [--seq-len 256] [--group-size 64]
                                    [--asym] [--actorder static|none] [--eval-tokens 512]
                                    [--skip-oneshot] [--skip-defaults] [--keep DIR] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

from common import Measured, measured
from stream_memory import token_ids, weightsmith
from weightsmith.quantization.recipe import LLM_COMPRESSOR_DAMPENING

#: Both runs dampen as llm-compressor does, so the comparison is of the same algorithm.
DAMPENING = str(LLM_COMPRESSOR_DAMPENING)

ONESHOT = """
import json, os, sys
os.environ.setdefault("TQDM_DISABLE", "1")
import torch, transformers
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.gptq import GPTQModifier
src, seqs_file, out, group, symmetric = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
actorder, dampening = None if sys.argv[6] == "none" else sys.argv[6], float(sys.argv[7])
ignore = ["lm_head", *json.loads(sys.argv[8])]
seqs = json.loads(open(seqs_file).read())
model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype="auto")
data = Dataset.from_dict({"input_ids": seqs, "attention_mask": [[1] * len(s) for s in seqs]})
weights = {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": group}
recipe = GPTQModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights}},
                      ignore=ignore, actorder=actorder, dampening_frac=dampening, block_size=128)
oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(seqs),
        max_seq_length=max(map(len, seqs)), shuffle_calibration_samples=False, output_dir=out)  # our order
"""


def row(label: str, run: Measured) -> None:
    """One run's wall and CPU seconds (the fairer ratio on a shared machine: wall time depends on the
    other load), its peak RSS and the load averages."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{label:<48} wall {run.wall:7.1f} s  cpu {run.cpu:7.1f} s  peak RSS {run.rss_mib / 1024:5.2f} GiB  "
          f"(load {load})", flush=True)  # fmt: skip


def held_out_text() -> str:
    """Python's `textwrap.py`: code like the calibration text, but not in it."""
    return (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8")


def fidelity(orig: Path, quant: Path, tokens: int) -> str:
    from weightsmith.fidelity.logits import compare

    r = compare(orig, quant, text=held_out_text(), tokens=tokens, text_source="textwrap.py")
    if r.status != "ok":
        return f"{r.status}: {r.reason}"
    return f"KL {r.kl:.4f}  top-1 {r.top1_agreement:.3f}  ppl {r.ppl_quant:.3f} (orig {r.ppl_orig:.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: SmolLM2-135M fp32)")
    ap.add_argument("--moe", default=None, help="a small random MoE of this family instead (see above)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048],
                    help="calibration tokens; several: each measured, then both tools' times fitted")  # fmt: skip
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--asym", action="store_true", help="W4A16_ASYM instead of W4A16")
    ap.add_argument("--actorder", choices=["static", "none"], default="static", help="for both GPTQ runs")
    ap.add_argument("--eval-tokens", type=int, default=512)
    ap.add_argument("--skip-oneshot", action="store_true")
    ap.add_argument("--skip-defaults", action="store_true", help="leave out our GPTQ on its own defaults")
    ap.add_argument("--keep", type=Path, default=None, help="keep the outputs in this folder")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the GPTQ runs, back to back (medians)")
    args = ap.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars of the loads would fill the output
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    base = args.keep or Path(tempfile.mkdtemp(prefix="gptq-speed-"))
    if args.moe is not None:
        args.model = small_moe(args.moe, base / f"{args.moe}-src")
    if args.model is None:
        from models import smollm2_fp32

        args.model = smollm2_fp32()
    walls = {}  # tokens -> (our median wall, oneshot's)
    for tokens in args.tokens:
        print(f"=== {tokens} calibration tokens", flush=True)
        pair = measure(args, tokens, base / f"tokens-{tokens}" if len(args.tokens) > 1 else base)
        if pair is not None:
            walls[tokens] = pair
    if len(walls) > 1:
        fit(walls)


#: The MoE `--moe` builds: larger than the tests' tiny ones, so that the solves, not the start, take the time.
MOE_SHAPES = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
    head_dim=32, moe_intermediate_size=128, shared_expert_intermediate_size=256,
)  # fmt: skip
#: Routers, which neither tool should quantize (oneshot's `Linear` target would take them).
ROUTERS = [r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$", r"re:.*block_sparse_moe\.gate$"]


def small_moe(family: str, folder: Path) -> Path:
    """A random MoE of `family` with SmolLM2's tokenizer (`MOE_SHAPES` over the tests' shapes of it)."""
    from engine.tiny_models import moe_shapes, save_tiny
    from models import smollm2_fp32

    if (folder / "config.json").exists():
        return folder
    return save_tiny(folder, family, tokenizer=smollm2_fp32(), shapes=moe_shapes(family, **MOE_SHAPES))


def measure(args: argparse.Namespace, tokens: int, base: Path) -> tuple[float, float] | None:
    """Every run on `tokens` calibration tokens and their fidelity; (our median wall, oneshot's), None
    without oneshot."""
    scheme = "w4a16-asym" if args.asym else "w4a16"
    base.mkdir(parents=True, exist_ok=True)
    common = ["--scheme", scheme, "--group-size", args.group_size, "--no-hash", "--force"]
    calibration = ["--method", "gptq", "--builtin", "code", "--tokens", tokens, "--seq-len", args.seq_len,
                   "--actorder", args.actorder, *(["--all-experts"] if args.moe else [])]  # fmt: skip
    gptq = [*calibration, "--scale-search", "none", "--dampening", DAMPENING]  # oneshot's grid and dampening

    rtn = weightsmith("quantize", args.model, base / "rtn", *common, "--scale-search", "none")
    row("weightsmith quantize (RTN)", measured(rtn))
    arms = {"ours": weightsmith("quantize", args.model, base / "gptq", *common, *gptq, "--json")}
    outputs = {"RTN": base / "rtn", "weightsmith GPTQ": base / "gptq"}
    if not args.skip_defaults:
        arms["defaults"] = weightsmith("quantize", args.model, base / "gptq-defaults", *common, *calibration)
        outputs["weightsmith GPTQ, defaults"] = base / "gptq-defaults"
    if not args.skip_oneshot:
        seqs = base / "tokens.json"
        seqs.write_text(json.dumps(token_ids(args.model, tokens, args.seq_len)))
        oneshot = [sys.executable, "-c", ONESHOT, str(args.model), str(seqs), str(base / "oneshot"),
                   str(args.group_size), "0" if args.asym else "1", args.actorder, DAMPENING,
                   json.dumps(ROUTERS if args.moe else [])]  # fmt: skip
        arms["oneshot"] = oneshot
        outputs["llm-compressor GPTQ"] = base / "oneshot"
    labels = {
        "ours": f"weightsmith quantize --method gptq ({tokens} tokens)",
        "defaults": "weightsmith quantize --method gptq, its defaults",
        "oneshot": "llm-compressor oneshot GPTQModifier (CPU)",
    }
    runs: dict[str, list[Measured]] = {arm: [] for arm in arms}
    for r in range(args.repeat):  # back to back, the order reversed every other round
        for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            run = measured(arms[arm])
            runs[arm].append(run)
            row(labels[arm], run)
            if arm == "ours":
                split = json.loads(run.stdout)["engine_split"]
                print("  its phases (wall s): " + ", ".join(f"{phase} {t:.2f}" for phase, t in split.items()),
                      flush=True)  # fmt: skip
    walls = None
    if "oneshot" in runs:
        ours, theirs = runs["ours"], runs["oneshot"]
        walls = statistics.median(o.wall for o in ours), statistics.median(t.wall for t in theirs)
        print(f"oneshot / ours, median of {args.repeat} rounds: "
              f"wall {walls[1] / walls[0]:.2f}x, "
              f"cpu {statistics.median(t.cpu for t in theirs) / statistics.median(o.cpu for o in ours):.2f}x "
              f"(rounds: {', '.join(f'{t.wall / o.wall:.2f}' for o, t in zip(ours, theirs, strict=True))}); "
              f"peak RSS ours {max(o.rss_mib for o in ours) / 1024:.2f} GiB, "
              f"oneshot {max(t.rss_mib for t in theirs) / 1024:.2f} GiB",
              flush=True)  # fmt: skip
        if "defaults" in runs:
            mine = runs["defaults"]
            print(f"oneshot / ours on its defaults: wall "
                  f"{walls[1] / statistics.median(d.wall for d in mine):.2f}x "
                  f"(rounds: {', '.join(f'{t.wall / d.wall:.2f}' for d, t in zip(mine, theirs, strict=True))})",
                  flush=True)  # fmt: skip
    print(
        f"fidelity on {args.eval_tokens} held-out tokens (textwrap.py), {scheme} g{args.group_size}, "
        f"actorder {args.actorder}:"
    )
    for label, folder in outputs.items():
        print(f"  {label:<26} {fidelity(args.model, folder, args.eval_tokens)}", flush=True)
    return walls


def fit(walls: dict[int, tuple[float, float]]) -> None:
    """Each tool's wall time as a fixed part plus a part per calibration token (least squares), and the
    ratio of the two per-token parts: where the ratio of whole runs tends as the tokens grow."""
    tokens = list(walls)
    ours = statistics.linear_regression(tokens, [w[0] for w in walls.values()])
    theirs = statistics.linear_regression(tokens, [w[1] for w in walls.values()])
    print("tokens   ours wall   oneshot wall   oneshot / ours")
    for n, (mine, other) in walls.items():
        print(f"{n:>6} {mine:>9.1f} s {other:>12.1f} s {other / mine:>12.2f}x")
    print(
        f"fitted: ours {ours.intercept:.1f} s + {1000 * ours.slope:.2f} s per 1,000 tokens; oneshot "
        f"{theirs.intercept:.1f} s + {1000 * theirs.slope:.2f} s per 1,000 tokens; per-token ratio "
        f"{theirs.slope / ours.slope:.2f}x (the ratio of whole runs as the tokens grow)"
    )


if __name__ == "__main__":
    main()
