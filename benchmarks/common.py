"""Shared pieces of the benchmarks: a synthetic Llama-shaped checkpoint and timed child processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from weightsmith.safetensors.writer import ShardWriter, TensorSpec

HIDDEN, INTER = 4096, 11008
IGNORE = ["lm_head", "model.embed_tokens"]


def layer_specs(layer: int, hidden: int = HIDDEN, inter: int = INTER) -> list[TensorSpec]:
    p = f"model.layers.{layer}"
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (hidden // 4, hidden),
        "self_attn.v_proj": (hidden // 4, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }
    specs = [TensorSpec(f"{p}.{m}.weight", "BF16", s) for m, s in shapes.items()]
    specs += [TensorSpec(f"{p}.{n}.weight", "BF16", (hidden,)) for n in ("input_layernorm", "post_attention_layernorm")]
    return specs


def build(
    folder: Path,
    gib: float,
    shards: int = 4,
    hidden: int = HIDDEN,
    inter: int = INTER,
    vocab: int = 32000,
    tied: bool = False,
    config_extra: dict | None = None,
    layers: int | None = None,
) -> int:
    """A Llama-shaped BF16 checkpoint (7B-wide by default) of about `gib` GiB; returns its tensor bytes.

    `tied` leaves out `lm_head` (the embeddings serve as the head); `config_extra` adds config keys
    (head counts, vocabulary) for runs that execute the model rather than only read its tensors;
    `layers` sets the number of decoder layers instead of `gib`.
    """
    per_layer = sum(s.nbytes for s in layer_specs(0, hidden, inter))
    layers = layers or max(1, round(gib * 2**30 / per_layer))
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 25, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)  # 64 MiB of values
    weight_map, total = {}, 0
    per_shard = -(-layers // shards)
    for k in range(shards):
        layer_range = range(k * per_shard, min(layers, (k + 1) * per_shard))
        specs = [s for layer in layer_range for s in layer_specs(layer, hidden, inter)]
        if k == 0:
            specs.append(TensorSpec("model.embed_tokens.weight", "BF16", (vocab, hidden)))
        if k == shards - 1:
            specs.append(TensorSpec("model.norm.weight", "BF16", (hidden,)))
            if not tied:
                specs.append(TensorSpec("lm_head.weight", "BF16", (vocab, hidden)))
        if not specs:
            continue
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        with ShardWriter(folder, name, specs) as w:
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
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "torch_dtype": "bfloat16",
        # heads of 128 with 4 query heads per KV head, as k/v_proj's hidden // 4 rows say (a pre-pass reads them)
        "num_attention_heads": max(1, hidden // 128),
        "num_key_value_heads": max(1, hidden // 512),
        **(config_extra or {}),
    }
    (folder / "config.json").write_text(json.dumps(config))
    os.sync()  # flush it now: its writeback would otherwise compete with the first timed runs
    return total


#: Run first in every measured child (`measured`): at exit it reports its own peak RSS on stderr. The
#: parent's rusage cannot say: Linux carries a process's high-water mark across fork and exec, so every
#: child would report at least this process's peak, even memory freed since (the pool `build` fills:
#: over 400 MiB; a model or tokenizer the benchmark loads itself).
PEAK_RSS = """
import atexit, sys
def _peak():
    kib = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    sys.stderr.write("\\nPEAK_RSS_KIB " + kib + "\\n")
atexit.register(_peak)
"""


@dataclass
class Measured:
    """One child process: wall and CPU seconds (user + system), its own peak RSS, what it printed, its exit code."""

    wall: float
    cpu: float
    rss_mib: float
    stdout: str
    stderr: str
    code: int


def measured(cmd: list[str], ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> Measured:
    """Run `cmd`, a Python child (`python -c CODE ...` or `python -m MODULE ...`), with `PEAK_RSS` first.

    Exits with the child's stderr if its exit code is not in `ok` (`verify` exits 1 on a finding, and a
    refusal is the result a hostile-input benchmark measures). `env`: the child's environment (this one's
    without it).
    """
    exe, flag, target, *rest = cmd
    if flag == "-m":
        target = f"import runpy; runpy.run_module({target!r}, run_name='__main__', alter_sys=True)"
    elif flag != "-c":
        raise ValueError(f"not a Python child: {' '.join(cmd)}")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([exe, "-c", PEAK_RSS + target, *rest], stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # CPU seconds from rusage; peak RSS from the child itself
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    code = os.waitstatus_to_exitcode(status)
    if code not in ok or "PEAK_RSS_KIB" not in stderr:
        raise SystemExit(f"command failed (exit {code}): {' '.join(cmd)}\n{stderr[-2000:]}")
    kib = int(stderr.split("PEAK_RSS_KIB")[-1].split()[0])
    return Measured(wall, usage.ru_utime + usage.ru_stime, kib / 1024, stdout, stderr, code)


def ours(src: Path, out: Path, workers: int, *extra: str, default_search: bool = False) -> dict:
    """One `weightsmith quantize` run in a fresh process: wall and work seconds, peak RSS, its time
    split (`--json`'s `time_split`) and the 1-minute load average when it ended.

    Plain round-to-nearest (`--scale-search none`, what `model_free_ptq` does, so the two compare like
    for like) unless `extra` names a search or `default_search` asks for the scheme's default one; no
    pre-pass unless `extra` names one.
    """
    shutil.rmtree(out, ignore_errors=True)
    search = [] if default_search or "--scale-search" in extra else ["--scale-search", "none"]
    search += [] if "--pre-pass" in extra else ["--pre-pass", "none"]  # the scheme's own speed, unless asked
    cmd = [sys.executable, "-m", "weightsmith.cli", "quantize", str(src), str(out), "--json", "--no-hash", *search,
           *extra]  # fmt: skip
    cmd += [a for i in IGNORE for a in ("--ignore", i)] + (["--workers", str(workers)] if workers else [])
    run = measured(cmd)
    report = json.loads(run.stdout)
    return {"wall": run.wall, "rss_mib": run.rss_mib, "work": report["seconds"], "split": report["time_split"],
            "load": load()}  # fmt: skip


def load() -> float:
    """The machine's 1-minute load average: how many runnable jobs shared its cores."""
    return round(os.getloadavg()[0], 2)


def split_line(split: dict, work: float, workers: int) -> str:
    """A run's time split in one line: fixed costs, then each streaming phase's CPU and wall seconds.

    The CPU seconds are what the work costs the processor; their sum over `workers` cores is the
    quickest the streaming part could go on an idle machine (the bound quoted beside each rate).
    """
    cpu, wall = split["cpu"], split["wall"]
    plan = work - split["before"] - split["workers"] - split["after"]
    phases = ", ".join(f"{k} {cpu[k]:.2f}/{wall[k]:.2f}" for k in ("read", "kernel", "write", "fsync"))
    streaming_cpu = sum(cpu[k] for k in ("read", "kernel", "write", "fsync"))
    return (
        f"fixed: plan {plan:.2f} s, open {split['before']:.2f} s, kernel load {cpu['load']:.2f}/{wall['load']:.2f} s "
        f"(CPU/wall, on one worker while the others copy), close+verify+manifest {split['after']:.2f} s; "
        f"streaming {split['workers']:.2f} s wall, CPU/wall summed over threads: {phases}; "
        f"streaming CPU {streaming_cpu:.2f} s = {streaming_cpu / workers:.2f} s on {workers} idle cores"
    )


REFERENCE = """
import sys, time
from llmcompressor import model_free_ptq
{setup}
started = time.perf_counter()
model_free_ptq(sys.argv[1], sys.argv[2], scheme={scheme}, ignore={ignore!r}, device="cpu")
print("WORK_SECONDS", time.perf_counter() - started)
"""


def reference(src: Path, out: Path, scheme: str = '"W4A16"', setup: str = "") -> dict:
    """One llm-compressor `model_free_ptq` run in a fresh process: wall (imports included), work, peak
    RSS, and the load average when it ended."""
    shutil.rmtree(out, ignore_errors=True)
    script = REFERENCE.format(setup=setup, scheme=scheme, ignore=IGNORE)
    run = measured([sys.executable, "-c", script, str(src), str(out)])
    work = float(run.stdout.split("WORK_SECONDS")[-1].split()[0])
    return {"wall": run.wall, "rss_mib": run.rss_mib, "work": work, "load": load()}
