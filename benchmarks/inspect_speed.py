"""How fast `weightsmith inspect` reads a 200+ GB MoE checkpoint.

Builds a synthetic Laguna-shaped MoE checkpoint (48 layers, 256 routed experts and one shared
expert per sparse layer, a dense first layer, NVFP4 `nvfp4-pack-quantized` MLPs, BF16 attention
with a per-head gate, FP8 KV-cache scales) whose shards have correct headers and are extended to
their full size with `ftruncate`, so they occupy almost no disk. Then runs `weightsmith inspect` on
it in a fresh process and prints the table; then times `weightsmith inspect` and `weightsmith verify`
(headers only) as commands, alternating, `--runs` times each: median wall and CPU seconds, peak RSS,
and the load average, since on a shared machine the wall time follows the load while the CPU time
(what bounds the wall time on an idle machine) barely does. Then the same runs again with one core
kept busy by a spinning process (a user's other job), and the ratio busy / first: the target is
that a second job at most doubles the time.

    python benchmarks/inspect_speed.py [--layers 48] [--experts 256] [--runs 5] [--keep DIR] [--results FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common import measured
from weightsmith.audit.inspect import InspectReport, inspect
from weightsmith.safetensors.writer import ShardWriter, TensorSpec


@dataclass(frozen=True)
class MoeShape:
    """Dimensions of the synthetic model; the defaults give about 225 GB of tensor data."""

    layers: int = 48
    experts: int = 256
    hidden: int = 5120
    moe_intermediate: int = 2048
    shared_intermediate: int = 2048
    dense_intermediate: int = 16384
    heads: int = 40
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 151552


def _nvfp4(module: str, out_features: int, in_features: int) -> list[TensorSpec]:
    return [
        TensorSpec(f"{module}.weight_packed", "U8", (out_features, in_features // 2)),
        TensorSpec(f"{module}.weight_scale", "F8_E4M3", (out_features, in_features // 16)),
        TensorSpec(f"{module}.weight_global_scale", "F32", (1,)),
    ]


def _mlp(prefix: str, hidden: int, intermediate: int) -> list[TensorSpec]:
    return [
        *_nvfp4(f"{prefix}.gate_proj", intermediate, hidden),
        *_nvfp4(f"{prefix}.up_proj", intermediate, hidden),
        *_nvfp4(f"{prefix}.down_proj", hidden, intermediate),
    ]


def layer_specs(s: MoeShape, i: int) -> list[TensorSpec]:
    """Every tensor of decoder layer `i`: layer 0 dense, the rest sparse."""
    p = f"model.layers.{i}"
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    specs = [
        TensorSpec(f"{p}.input_layernorm.weight", "BF16", (s.hidden,)),
        TensorSpec(f"{p}.post_attention_layernorm.weight", "BF16", (s.hidden,)),
        TensorSpec(f"{p}.self_attn.q_proj.weight", "BF16", (q, s.hidden)),
        TensorSpec(f"{p}.self_attn.k_proj.weight", "BF16", (kv, s.hidden)),
        TensorSpec(f"{p}.self_attn.v_proj.weight", "BF16", (kv, s.hidden)),
        TensorSpec(f"{p}.self_attn.o_proj.weight", "BF16", (s.hidden, q)),
        TensorSpec(f"{p}.self_attn.g_proj.weight", "BF16", (s.heads, s.hidden)),
        TensorSpec(f"{p}.self_attn.q_norm.weight", "BF16", (s.head_dim,)),
        TensorSpec(f"{p}.self_attn.k_norm.weight", "BF16", (s.head_dim,)),
        TensorSpec(f"{p}.self_attn.k_scale", "F32", ()),
        TensorSpec(f"{p}.self_attn.v_scale", "F32", ()),
    ]
    if i == 0:
        return specs + _mlp(f"{p}.mlp", s.hidden, s.dense_intermediate)
    specs += [
        TensorSpec(f"{p}.mlp.gate.weight", "BF16", (s.experts, s.hidden)),
        TensorSpec(f"{p}.mlp.experts.e_score_correction_bias", "F32", (s.experts,)),
        *_mlp(f"{p}.mlp.shared_expert", s.hidden, s.shared_intermediate),
    ]
    for e in range(s.experts):
        specs += _mlp(f"{p}.mlp.experts.{e}", s.hidden, s.moe_intermediate)
    return specs


def outer_specs(s: MoeShape) -> list[TensorSpec]:
    return [
        TensorSpec("model.embed_tokens.weight", "BF16", (s.vocab, s.hidden)),
        TensorSpec("model.norm.weight", "BF16", (s.hidden,)),
        TensorSpec("lm_head.weight", "BF16", (s.vocab, s.hidden)),
    ]


def config(s: MoeShape) -> dict:
    nvfp4 = {
        "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
        "symmetric": True, "dynamic": False, "scale_dtype": "torch.float8_e4m3fn",
    }  # fmt: skip
    return {
        "architectures": ["LagunaForCausalLM"],
        "model_type": "laguna",
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "num_experts": s.experts,
        "moe_intermediate_size": s.moe_intermediate,
        "shared_expert_intermediate_size": s.shared_intermediate,
        "intermediate_size": s.dense_intermediate,
        "vocab_size": s.vocab,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": nvfp4,
                    "input_activations": None,
                    "output_activations": None,
                    "format": "nvfp4-pack-quantized",
                }
            },
            "ignore": ["lm_head", "re:.*self_attn\\..*", "re:.*mlp\\.gate$"],
            "kv_cache_scheme": {
                "num_bits": 8,
                "type": "float",
                "strategy": "tensor",
                "dynamic": False,
                "symmetric": True,
            },
        },
    }


def build_checkpoint(root: Path, s: MoeShape = MoeShape()) -> Path:
    """Write the checkpoint: one sparse shard per layer plus one for embeddings, norm and lm_head."""
    root.mkdir(parents=True, exist_ok=True)
    groups = [layer_specs(s, i) for i in range(s.layers)] + [outer_specs(s)]
    weight_map: dict[str, str] = {}
    total = 0
    for n, specs in enumerate(groups, 1):
        shard = f"model-{n:05d}-of-{len(groups):05d}.safetensors"
        writer = ShardWriter(root, shard, specs, {"format": "pt"})
        for spec in specs:  # the few small tensors get real values; the rest stays a hole of zeros
            if spec.name.endswith(("_scale", "weight_global_scale")) and spec.dtype == "F32":
                writer.write(spec.name, np.full(spec.shape, 0.05, dtype=np.float32))
        writer.close(sync=False)
        for spec in specs:
            weight_map[spec.name] = shard
            total += spec.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps(config(s), indent=2))
    return root


@dataclass
class CommandTimes:
    """One command's runs: wall and CPU seconds of each, the largest peak RSS (MiB), its last output."""

    walls: list[float]
    cpus: list[float]
    peak_mib: float = 0.0
    output: str = ""

    def line(self, name: str) -> str:
        return (
            f"`weightsmith {name}` as a command, {len(self.walls)} runs: wall median "
            f"{statistics.median(self.walls):.2f} s (best {min(self.walls):.2f}), CPU median "
            f"{statistics.median(self.cpus):.2f} s (interpreter start and imports included), "
            f"peak RSS {self.peak_mib:,.0f} MiB"
        )


def run_command(args: list[str], times: CommandTimes) -> None:
    """`weightsmith ARGS` in a fresh process, its own times and peak RSS added to `times`.

    `verify` exits 1 when it finds something, which is not a failure here.
    """
    run = measured([sys.executable, "-m", "weightsmith", *args], ok=(0, 1))
    times.walls.append(run.wall)
    times.cpus.append(run.cpu)
    times.peak_mib = max(times.peak_mib, run.rss_mib)
    times.output = run.stdout


def time_in_process(root: Path, repeats: int) -> tuple[list[float], list[float], InspectReport]:
    """Wall and CPU seconds of `inspect()` itself (no interpreter start), `repeats` times."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        report = inspect(root)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls, cpus, report


def time_commands(root: Path, runs: int) -> tuple[CommandTimes, CommandTimes, tuple[float, float]]:
    """`inspect` and `verify` on `root`, alternating so that both see the same load, `runs` times each;
    with the 1-minute load average before and after."""
    inspected, verified = CommandTimes([], []), CommandTimes([], [])
    before = os.getloadavg()[0]
    for _ in range(runs):
        run_command(["inspect", str(root)], inspected)
        run_command(["verify", str(root)], verified)
    return inspected, verified, (before, os.getloadavg()[0])


@contextmanager
def one_core_busy() -> Iterator[None]:
    """A process spinning on the CPU for the duration: another job sharing the machine."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it reach its loop
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _record(times: CommandTimes, loads: tuple[float, float]) -> dict[str, Any]:
    return {
        "wall": statistics.median(times.walls),
        "best": min(times.walls),
        "cpu": statistics.median(times.cpus),
        "rss_mib": times.peak_mib,
        "runs": times.walls,
        "load": [round(x, 2) for x in loads],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=MoeShape.layers)
    parser.add_argument("--experts", type=int, default=MoeShape.experts)
    parser.add_argument("--repeats", type=int, default=3, help="in-process timing runs")
    parser.add_argument("--runs", type=int, default=5, help="runs of each command")
    parser.add_argument("--keep", type=Path, help="build the checkpoint here and keep it")
    parser.add_argument("--results", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    shape = MoeShape(layers=args.layers, experts=args.experts)
    with tempfile.TemporaryDirectory(prefix="inspect-speed-") as tmp:
        root = args.keep or Path(tmp) / "moe"
        started = time.perf_counter()
        build_checkpoint(root, shape)
        built = time.perf_counter() - started
        apparent = sum(p.stat().st_size for p in root.iterdir())
        on_disk = sum(p.stat().st_blocks * 512 for p in root.iterdir())
        inspected, verified, loads = time_commands(root, args.runs)
        with one_core_busy():
            busy_inspected, busy_verified, busy_loads = time_commands(root, args.runs)
        walls, cpus, report = time_in_process(root, args.repeats)
    print(inspected.output, end="")
    print(
        f"checkpoint: {apparent / 1e9:,.1f} GB apparent, {on_disk / 1e6:,.1f} MB on disk, "
        f"{report.shards} shards, {report.tensors:,} tensors (built in {built:.1f} s)"
    )
    print(f"headline: {report.bits_per_param:.3f} bits per parameter over {report.params / 1e9:,.1f} B parameters")
    print(
        f"inspect() in process, {args.repeats} runs: wall best {min(walls):.2f} s, "
        f"median {statistics.median(walls):.2f} s; CPU best {min(cpus):.2f} s"
    )
    print(inspected.line("inspect"))
    print(verified.line("verify"))
    print(f"machine: {os.cpu_count()} CPUs, load average {loads[0]:.2f} before the command runs, {loads[1]:.2f} after")
    busy_load = f"load average {busy_loads[0]:.2f} before, {busy_loads[1]:.2f} after"
    print(f"with one core kept busy by another process ({busy_load}):")
    for name, first, busy in (("inspect", inspected, busy_inspected), ("verify", verified, busy_verified)):
        ratio = statistics.median(busy.walls) / statistics.median(first.walls)
        print(f"  {busy.line(name)}; {ratio:.2f}x the wall time without it (target: at most 2x)")
    if args.results:
        results = {
            "gb": apparent / 1e9,
            "shards": report.shards,
            "tensors": report.tensors,
            "cores": os.cpu_count(),
            "in_process": {"wall": statistics.median(walls), "best": min(walls), "cpu": min(cpus)},
            "inspect": _record(inspected, loads),
            "verify": _record(verified, loads),
            "inspect_busy": _record(busy_inspected, busy_loads),
            "verify_busy": _record(busy_verified, busy_loads),
        }
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
