"""Quantize speed and memory against llm-compressor's `model_free_ptq`, measured in the same run.

Builds a synthetic Llama-shaped BF16 checkpoint (default about 2 GiB, in 4 shards), then runs,
in alternating order and in fresh processes, `weightsmith quantize` and `model_free_ptq` with the
same scheme (W4A16, group 128) and ignore list. Prints medians of wall time end to end (process
start, imports and all), weightsmith's own quantize time and throughput, peak RSS of each, and
the ratio. `--grow 8` repeats weightsmith alone on an 8 GiB checkpoint to show that peak RSS stays
flat as the model grows.

    python benchmarks/quantize_speed.py [--gib 2] [--repeats 3] [--grow 8] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from weightsmith.safetensors.writer import ShardWriter, TensorSpec

HIDDEN, INTER = 4096, 11008
IGNORE = ["lm_head", "model.embed_tokens"]
REFERENCE = """
import sys
from llmcompressor import model_free_ptq
model_free_ptq(sys.argv[1], sys.argv[2], scheme="W4A16", ignore=["lm_head", "model.embed_tokens"], device="cpu")
"""


def layer_specs(layer: int) -> list[TensorSpec]:
    p = f"model.layers.{layer}"
    shapes = {
        "self_attn.q_proj": (HIDDEN, HIDDEN),
        "self_attn.k_proj": (1024, HIDDEN),
        "self_attn.v_proj": (1024, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HIDDEN),
        "mlp.gate_proj": (INTER, HIDDEN),
        "mlp.up_proj": (INTER, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTER),
    }
    specs = [TensorSpec(f"{p}.{m}.weight", "BF16", s) for m, s in shapes.items()]
    specs += [TensorSpec(f"{p}.{n}.weight", "BF16", (HIDDEN,)) for n in ("input_layernorm", "post_attention_layernorm")]
    return specs


def build(folder: Path, gib: float, shards: int = 4) -> int:
    """A Llama-7B-shaped BF16 checkpoint of about `gib` GiB; returns its tensor bytes."""
    per_layer = sum(s.nbytes for s in layer_specs(0))
    layers = max(1, round(gib * 2**30 / per_layer))
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 25, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)  # 64 MiB of values
    weight_map, total = {}, 0
    per_shard = -(-layers // shards)
    for k in range(shards):
        specs = [s for layer in range(k * per_shard, min(layers, (k + 1) * per_shard)) for s in layer_specs(layer)]
        if k == 0:
            specs.append(TensorSpec("model.embed_tokens.weight", "BF16", (32000, HIDDEN)))
        if k == shards - 1:
            specs += [
                TensorSpec("model.norm.weight", "BF16", (HIDDEN,)),
                TensorSpec("lm_head.weight", "BF16", (32000, HIDDEN)),
            ]
        if not specs:
            continue
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        with ShardWriter(folder / name, specs) as w:
            for i, s in enumerate(specs):
                n = int(np.prod(s.shape))
                start = (i * 7919) % (pool.size - 1)
                vals = np.resize(np.roll(pool, -start), n) if n > pool.size - start else pool[start : start + n]
                w.write(s.name, vals)
                weight_map[s.name] = name
                total += s.nbytes
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": layers,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return total


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) of the child, and its stdout."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, out


def ours(src: Path, out: Path, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "weightsmith.cli", "quantize", str(src), str(out), "--json", "--no-hash"]
    cmd += [a for i in IGNORE for a in ("--ignore", i)] + (["--workers", str(workers)] if workers else [])
    wall, rss, stdout = timed(cmd)
    return {"wall": wall, "rss_mib": rss, "work": json.loads(stdout)["seconds"]}


def reference(src: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    wall, rss, _ = timed([sys.executable, "-c", REFERENCE, str(src), str(out)])
    return {"wall": wall, "rss_mib": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--grow", type=float, default=0.0, help="also run weightsmith alone on a checkpoint this many GiB")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        tmp_path = Path(tmp)
        total = build(tmp_path / "src", args.gib)
        shards = len(list((tmp_path / "src").glob("*.safetensors")))
        print(f"checkpoint: {total / 2**30:.2f} GiB BF16 tensors in {shards} shards")
        runs: dict[str, list[dict]] = {"weightsmith": [], "model_free_ptq": []}
        for r in range(args.repeats):
            order = ["weightsmith", "model_free_ptq"] if r % 2 == 0 else ["model_free_ptq", "weightsmith"]
            for arm in order:
                if arm == "weightsmith":
                    runs[arm].append(ours(tmp_path / "src", tmp_path / "ours", args.workers))
                elif not args.skip_reference:
                    runs[arm].append(reference(tmp_path / "src", tmp_path / "ref"))
                print(f"  run {r + 1} {arm}: {runs[arm][-1] if runs[arm] else 'skipped'}", flush=True)

        def med(arm: str, key: str) -> float:
            return statistics.median(x[key] for x in runs[arm])

        gb = total / 1e9
        ws_wall, ws_work, ws_rss = med("weightsmith", "wall"), med("weightsmith", "work"), med("weightsmith", "rss_mib")
        print(f"\nweightsmith      end to end {ws_wall:6.2f} s   quantize work {ws_work:6.2f} s", end="")
        print(f" ({gb / ws_work:.2f} GB/s of BF16 input)   peak RSS {ws_rss:,.0f} MiB")
        if runs["model_free_ptq"]:
            ref_wall, ref_rss = med("model_free_ptq", "wall"), med("model_free_ptq", "rss_mib")
            print(f"model_free_ptq   end to end {ref_wall:6.2f} s   peak RSS {ref_rss:,.0f} MiB")
            print(
                f"ratio            {ref_wall / ws_wall:.1f}x faster end to end (median of {args.repeats}, alternating)"
            )
        if args.grow:
            for leftover in ("ours", "ref", "src"):
                shutil.rmtree(tmp_path / leftover, ignore_errors=True)
            big = build(tmp_path / "big", args.grow)
            r = ours(tmp_path / "big", tmp_path / "ours-big", args.workers)
            print(
                f"weightsmith on {big / 2**30:.2f} GiB: end to end {r['wall']:.2f} s, quantize work {r['work']:.2f} s",
                end="",
            )
            print(f" ({big / 1e9 / r['work']:.2f} GB/s), peak RSS {r['rss_mib']:,.0f} MiB")


if __name__ == "__main__":
    main()
