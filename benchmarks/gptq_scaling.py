"""`quantize --method gptq` across ranks: wall time, peak RSS and traffic at world sizes 1, 2, 4 on this machine.

On SmolLM2-135M (or `--model DIR`), W4A16 group 64, the same calibration tokens at every world size:
one process (`--processes` left out, the peer every other size is a ratio of), then `--processes P`
(P ranks over localhost, as torchrun would start them), in an order reversed every other repeat.
Each run's output must be byte-identical to the one process's (`model.safetensors`); the table says
so. Peak RSS is the largest of the launcher and its ranks (the rusage of the launcher's end).

What one machine of 2 cores cannot show is what many nodes do, so the script also prints the traffic
per decoder layer (exact, from the shapes: what `engine.gptq` sends) and a projection on paper for a
DeepSeek-V3-shaped 671B MoE (61 layers, 256 routed experts of 7168 x 2048 a layer, 37B active, 64k
calibration tokens) on 8 and 32 nodes, from the rates the one-process run measured here per phase
(`--json`'s `engine_split`: Hessian passes, solves, output passes) scaled by cores and by a network
of `--gbits`. The projection assumes the engine GPTQs each expert as a Linear of its own; it does
not today (merged 3-D experts are left to round-to-nearest, `engine.gptq`), so it is the arithmetic
bound, stated as such in docs/engine.md.

    python benchmarks/gptq_scaling.py [--model DIR] [--tokens 8192] [--seq-len 512] [--processes 1 2 4]
                                      [--repeats 1] [--node-cores 64] [--gbits 25]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

#: Tokens a batch holds at most (engine.gptq.BATCH_TOKENS): the unit of work the ranks take turns on.
from weightsmith.engine.gptq import BATCH_TOKENS


@dataclass
class Run:
    wall: float
    cpu: float
    rss_mib: float
    split: dict[str, float]
    digest: str


def run(model: Path, out: Path, processes: int, tokens: int, seq_len: int) -> Run:
    """One `weightsmith quantize --method gptq` (with `--processes P` above 1), timed from outside."""
    cmd = [sys.executable, "-m", "weightsmith", "quantize", str(model), str(out), "--method", "gptq",
           "--group-size", "64", "--builtin", "code", "--tokens", str(tokens), "--seq-len", str(seq_len),
           "--json", "--no-hash", "--force"]  # fmt: skip
    if processes > 1:
        cmd += ["--processes", str(processes)]
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # rusage of the launcher and every rank it waited for
        wall = time.perf_counter() - start
        stdout.seek(0)
        stderr.seek(0)
        text, err = stdout.read(), stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-2000:]}")
    report = json.loads(text)
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, report["engine_split"], digest)


@dataclass(frozen=True)
class Shapes:
    """A decoder layer as GPTQ sees it: the width of each Hessian and the (rows, cols) of each Linear."""

    hessians: list[int]
    linears: list[tuple[int, int]]


def dense_layer(config: dict) -> Shapes:
    """A Llama layer: q/k/v share one Hessian, gate/up another; o and down each their own."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads") or heads
    q, k = heads * dim, kv * dim
    return Shapes(
        [hidden, q, hidden, inter],
        [(q, hidden), (k, hidden), (k, hidden), (hidden, q), (inter, hidden), (inter, hidden), (hidden, inter)],
    )


def traffic(shapes: Shapes, batches: int, ranks: int) -> float:
    """Bytes a layer sends over the network: every batch's `2 X^T X` (float32) not made on its Hessian's
    owner goes to it; every solved Linear's dequantized weight (float32) and values (int8) go from its
    owner to the other ranks. The owner's own turns, about 1/ranks of the batches, stay local."""
    if ranks == 1:
        return 0.0
    remote = batches - batches // ranks  # on average: the batches whose turn is not the owner's
    products = sum(4 * d * d * remote for d in shapes.hessians)
    results = sum(5 * r * c * (ranks - 1) for r, c in shapes.linears)
    return float(products + results)


def gram_flops(shapes: Shapes, tokens: int) -> float:
    """Multiply-adds x 2 of the Hessians' upper triangles (`add_gram` multiplies out about 10/16 of the square)."""
    return sum(2 * tokens * d * d * 10 / 16 for d in shapes.hessians)


def solve_flops(shapes: Shapes) -> float:
    """GPTQ's arithmetic per group: the inverse factor (~d^3 / 3 x 2 for Cholesky and its inverse) and the
    error propagation (~rows x d^2)."""
    by_width: dict[int, int] = {}
    for rows, cols in shapes.linears:
        by_width[cols] = by_width.get(cols, 0) + rows
    return sum(2 * d**3 / 3 + 2 * rows * d * d for d, rows in by_width.items())


def forward_flops(shapes: Shapes, tokens: int) -> float:
    """The layer's Linears on `tokens` tokens (attention's own products are small beside them here)."""
    return sum(2 * tokens * r * c for r, c in shapes.linears)


#: DeepSeek-V3 / R1 (671B, 37B active): hidden 7168, 61 layers (3 dense, 58 MoE), 256 routed experts of
#: 2048 and one shared, 8 routed per token; attention with a 1536 q rank and 512 + 64 kv rank, 128 heads.
MOE_LAYERS, MOE_HIDDEN, EXPERTS, EXPERT_INTER, ROUTED = 58, 7168, 256, 2048, 8
#: The attention's Linears (q down/up, kv down/up, o) and Hessians of one layer, then every expert's
#: (gate/up share a Hessian, down has its own), routed and shared alike.
ATTENTION = Shapes(
    [7168, 1536, 512, 128 * 128], [(1536, 7168), (576, 7168), (128 * 192, 1536), (128 * 256, 512), (7168, 128 * 128)]
)
EXPERTS_OF_A_LAYER = Shapes(
    [MOE_HIDDEN, EXPERT_INTER] * (EXPERTS + 1),
    [(EXPERT_INTER, MOE_HIDDEN), (EXPERT_INTER, MOE_HIDDEN), (MOE_HIDDEN, EXPERT_INTER)] * (EXPERTS + 1),
)
MOE_LAYER = Shapes(ATTENTION.hessians + EXPERTS_OF_A_LAYER.hessians, ATTENTION.linears + EXPERTS_OF_A_LAYER.linears)


def moe_projection(rates: dict[str, float], tokens: int, nodes: int, cores: int, gbits: float) -> dict[str, float]:
    """Seconds a 671B run would take on `nodes` nodes of `cores` cores, from this machine's rates per core.

    The Hessian phase's rate already holds the layer pass that feeds it (it was measured that way), so
    the layer pass is counted once more, for the outputs, as in `engine.gptq`'s phases."""
    share = tokens / nodes  # each node's turns of the batches
    expert_tokens = share * ROUTED / EXPERTS  # tokens an expert sees of a node's share (uniform routing)
    gram = gram_flops(ATTENTION, int(share)) + gram_flops(EXPERTS_OF_A_LAYER, int(expert_tokens))
    forward = forward_flops(ATTENTION, int(share)) + forward_flops(EXPERTS_OF_A_LAYER, int(expert_tokens))
    solve = solve_flops(MOE_LAYER) / nodes  # solves spread over the ranks (the experts evenly)
    compute = gram / rates["hessians"] + forward / rates["outputs"] + solve / rates["quantize"]
    batches = max(1, tokens // BATCH_TOKENS)
    network = traffic(MOE_LAYER, batches, nodes) / nodes / (gbits * 1e9 / 8)  # every node sends its part at once
    per_layer = compute / cores + network
    return {"compute_s": compute / cores * MOE_LAYERS, "network_s": network * MOE_LAYERS,
            "total_h": per_layer * MOE_LAYERS / 3600}  # fmt: skip


def main() -> None:
    from models import smollm2_fp32

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--node-cores", type=int, default=64)
    ap.add_argument("--gbits", type=float, default=25.0, help="network bandwidth per node, Gbit/s")
    args = ap.parse_args()
    model = args.model or smollm2_fp32()
    config = json.loads((model / "config.json").read_text())
    sizes = sorted(set(args.processes) | {1})
    runs: dict[int, list[Run]] = {p: [] for p in sizes}
    with tempfile.TemporaryDirectory(prefix="gptq-scaling-") as tmp:
        for repeat in range(args.repeats):
            for p in sizes if repeat % 2 == 0 else sizes[::-1]:
                runs[p].append(run(model, Path(tmp) / f"p{p}", p, args.tokens, args.seq_len))
                print(f"P={p}: {runs[p][-1].wall:.1f} s", file=sys.stderr)
    layer = dense_layer(config)
    batches = -(-args.tokens // BATCH_TOKENS)
    base = statistics.median(r.wall for r in runs[1])
    print(f"# {model.name}: {args.tokens:,} tokens in sequences of {args.seq_len} ({batches} batches), "
          f"{os.cpu_count()} cores, load {load():.1f}\n")  # fmt: skip
    print("| ranks | wall s (median) | speedup | CPU s | peak RSS MiB (largest rank) | traffic per layer MB | output |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    reference = runs[1][0].digest
    for p in sizes:
        wall = statistics.median(r.wall for r in runs[p])
        same = all(r.digest == reference for r in runs[p])
        print(f"| {p} | {wall:.1f} | {base / wall:.2f}x | {statistics.median(r.cpu for r in runs[p]):.1f} | "
              f"{max(r.rss_mib for r in runs[p]):.0f} | {traffic(layer, batches, p) / 1e6:.1f} | "
              f"{'identical' if same else 'DIFFERS'} |")  # fmt: skip
    split = runs[1][0].split
    layers = config["num_hidden_layers"]
    rates = {
        "hessians": gram_flops(layer, args.tokens) * layers / split["hessians"],
        "quantize": solve_flops(layer) * layers / split["quantize"],
        "outputs": forward_flops(layer, args.tokens) * (layers - 1) / split["outputs"],
    }
    cores = os.cpu_count() or 1
    per_core = {k: v / cores for k, v in rates.items()}
    print("\nmeasured per core (one process, its engine_split): "
          + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in per_core.items()))  # fmt: skip
    print(f"\n# projection: 671B MoE (DeepSeek-V3 shapes), 65,536 tokens, nodes of {args.node_cores} cores, "
          f"{args.gbits:g} Gbit/s\n")  # fmt: skip
    print("| nodes | compute h | network h | total h |")
    print("|---:|---:|---:|---:|")
    for nodes in (1, 8, 32):
        projected = moe_projection(per_core, 65536, nodes, args.node_cores, args.gbits)
        print(f"| {nodes} | {projected['compute_s'] / 3600:.2f} | {projected['network_s'] / 3600:.2f} | "
              f"{projected['total_h']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
