"""Peak memory and speed of the layer-streamed engine on a model larger than its memory bound.

Builds a synthetic Llama-shaped BF16 checkpoint of at least 6 GiB (7B-wide layers, tied
embeddings, SmolLM2's tokenizer), then runs, one process at a time, each measured for wall time
and peak RSS (each child's own high-water mark, `common.measured`):
- `weightsmith calibrate` on it;
- `weightsmith quantize --scheme w4a16` (the QUANT side of the eval), then
  `weightsmith eval ORIG QUANT --stream`;
- transformers' whole model (`from_pretrained` in BF16, run on 8 tokens), for comparison;
- on SmolLM2-135M, `weightsmith calibrate` and llm-compressor's `oneshot` (QuantizationModifier,
  NVFP4 with an FP8 KV-cache scheme) on CPU with the same calibration tokens, for a time ratio
  (`--skip-oneshot` leaves it out).

    python benchmarks/stream_memory.py [--gib 6] [--tokens 1024] [--seq-len 512] [--eval-tokens 512]
                                       [--skip-oneshot] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from common import build, measured

#: The bound the issue sets for calibrate and eval --stream on the >= 6 GiB model.
BOUND_GIB = 2.5
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SMOLLM2_VOCAB = 49152

#: The whole model loaded and run on a few tokens: a load alone may leave the weights mapped but
#: never read, which RSS would not count.
LOAD_WHOLE = """
import sys, torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
with torch.no_grad():
    model(torch.arange(8)[None])
"""

ONESHOT = """
import json, os, sys, time
os.environ.setdefault("TQDM_DISABLE", "1")
import torch, transformers
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
seqs = json.loads(open(sys.argv[2]).read())
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
data = Dataset.from_dict({"input_ids": seqs, "attention_mask": [[1] * len(s) for s in seqs]})
kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
recipe = QuantizationModifier(targets="Linear", scheme="NVFP4", ignore=["lm_head"], kv_cache_scheme=kv)
started = time.perf_counter()
oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(seqs),
        max_seq_length=max(map(len, seqs)))
print("WORK_SECONDS", time.perf_counter() - started)
"""


def weightsmith(*args: object) -> list[str]:
    return [sys.executable, "-m", "weightsmith.cli", *map(str, args)]


def calibrate_seconds(stderr_line: str) -> float:
    """The measuring time `calibrate` reports (`... tokens in S s ...`)."""
    match = re.search(r"tokens in ([0-9.]+) s", stderr_line)
    return float(match.group(1)) if match else float("nan")


def row(label: str, wall: float, rss_mib: float, extra: str = "") -> None:
    print(f"{label:<44} {wall:8.1f} s  peak RSS {rss_mib / 1024:6.2f} GiB  {extra}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=6.0)
    ap.add_argument("--tokens", type=int, default=1024, help="calibration tokens on the big model")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-tokens", type=int, default=512)
    ap.add_argument("--smollm2-tokens", type=int, default=512)
    ap.add_argument("--skip-oneshot", action="store_true", help="leave out llm-compressor's oneshot on SmolLM2")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the big model here instead of a temporary folder")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from models import smollm2_fp32

    smollm2 = smollm2_fp32()
    with tempfile.TemporaryDirectory(prefix="stream-memory-") as tmp:
        root = args.keep or Path(tmp)
        src, quant, stats = root / "bf16", root / "w4a16", Path(tmp) / "stats.safetensors"
        if not (src / "config.json").exists():
            shutil.rmtree(src, ignore_errors=True)
            extra = {"num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": SMOLLM2_VOCAB,
                     "tie_word_embeddings": True, "max_position_embeddings": 4096}  # fmt: skip
            build(src, args.gib, vocab=SMOLLM2_VOCAB, tied=True, config_extra=extra)
            for name in TOKENIZER_FILES:
                shutil.copy(smollm2 / name, src / name)
        size = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
        print(f"synthetic Llama: {size / 2**30:.2f} GiB BF16, {layers} layers of hidden 4096, bound {BOUND_GIB} GiB")

        run = measured(weightsmith("calibrate", src, "--out", stats, "--tokens", args.tokens, "--seq-len",
                                   args.seq_len, "--force"))  # fmt: skip
        work = calibrate_seconds(run.stderr)
        row("weightsmith calibrate", run.wall, run.rss_mib, f"{args.tokens / work:.1f} tokens/s ({args.tokens} tokens)")
        peaks = [run.rss_mib]

        if not (quant / "config.json").exists():
            run = measured(weightsmith("quantize", src, quant, "--scheme", "w4a16", "--scale-search", "none",
                                       "--no-hash", "--json"))  # fmt: skip
            row("weightsmith quantize w4a16 (QUANT for eval)", run.wall, run.rss_mib)
        run = measured(weightsmith("eval", src, quant, "--stream", "--json", "--tokens", args.eval_tokens))
        logits = json.loads(run.stdout)["logits"]
        assert logits["status"] == "ok", logits
        row("weightsmith eval --stream", run.wall, run.rss_mib,
            f"{2 * args.eval_tokens / logits['seconds']:.1f} tokens/s through both models, "
            f"KL {logits['kl']:.3g}")  # fmt: skip
        peaks.append(run.rss_mib)

        whole = measured([sys.executable, "-c", LOAD_WHOLE, str(src)])
        row("transformers whole model (BF16, 8 tokens)", whole.wall, whole.rss_mib)
        verdict = "within" if max(peaks) < BOUND_GIB * 1024 else "OVER"
        print(f"streamed peak {max(peaks) / 1024:.2f} GiB: {verdict} the {BOUND_GIB} GiB bound; "
              f"whole-model load {whole.rss_mib / 1024:.2f} GiB for a {size / 2**30:.2f} GiB model")  # fmt: skip

        if not args.skip_oneshot:
            small_stats = Path(tmp) / "smollm2.safetensors"
            seq = 256
            run = measured(weightsmith("calibrate", smollm2, "--out", small_stats, "--tokens", args.smollm2_tokens,
                                       "--seq-len", seq))  # fmt: skip
            ours = calibrate_seconds(run.stderr)
            row("SmolLM2 weightsmith calibrate", run.wall, run.rss_mib, f"measuring {ours:.1f} s")
            tokens_file = Path(tmp) / "tokens.json"
            tokens_file.write_text(json.dumps(token_ids(smollm2, args.smollm2_tokens, seq)))
            run = measured([sys.executable, "-c", ONESHOT, str(smollm2), str(tokens_file)])
            theirs = float(run.stdout.split("WORK_SECONDS")[-1].split()[0])
            row("SmolLM2 llm-compressor oneshot (CPU)", run.wall, run.rss_mib, f"calibrating {theirs:.1f} s")
            print(f"oneshot / calibrate: {theirs / ours:.1f}x (calibration work), same {args.smollm2_tokens} tokens")


def token_ids(folder: Path, tokens: int, seq_len: int) -> list[list[int]]:
    """The sequences `calibrate` runs (the default built-in text), for oneshot to run the same."""
    from weightsmith.calibration.measure import calibration_tokens

    return calibration_tokens(folder, None, None, tokens, seq_len)[0]


if __name__ == "__main__":
    main()
