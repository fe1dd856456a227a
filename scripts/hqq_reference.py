"""HQQ as published, written as a dense checkpoint: the reference for our integer-zero-point variant.

Every weight `weightsmith quantize` would quantize (its own plan decides, through `quantize --dry-run`
under the w4a16-asym scheme: every decoder Linear, not lm_head, embeddings or norms) is replaced by the
weight the published HQQ library (`hqq` 0.2.8.post1, mobiusml/hqq) reconstructs from its 4-bit codes:
groups of G along the input dimension (axis=1, as our int4), `optimize=True` (its half-quadratic
solver for the zero point) and the library's other defaults (`hqq_base_quant_config`). Its zero
points stay floats, which compressed-tensors cannot store, so the output is fake-quant: a dense
checkpoint of the source's dtype, tensor names and shard layout, which transformers loads as it
loads the original. Scale and zero are rounded to float16, the dtype `HQQLinear` keeps them in by
default, so the format costs 4 + 32/G bits per quantized weight; the rest is computed in float32 on
the CPU (the dtype the library's CPU path optimizes in) and cast back to the source dtype.

The library needs torch and its own pins, so this runs in a venv of its own (`make hqq-venv`), and
asks the repository's .venv which tensors weightsmith quantizes:

    .cache/hqq-venv/bin/python scripts/hqq_reference.py ORIG OUT --group-size 64 [--json]

One tensor is in memory at a time: each shard is rewritten with its source header, every kept
tensor's bytes copied as they are. `--json` prints what was done: the tensors and bytes quantized,
the seconds, the bits per parameter of the published format over the whole checkpoint (as
`quantize` reports its own), and the weight error over the quantized weights (as `eval` reports it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, BinaryIO

import torch
from hqq import __version__ as hqq_version
from hqq.core.quantize import Quantizer, hqq_base_quant_config
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[1]
#: The interpreter that runs weightsmith's planner (the repository's own venv), not this one.
WEIGHTSMITH_PYTHON = REPO / ".venv" / "bin" / "python"
NBITS = 4
#: The dtype HQQLinear stores scale and zero in by default (its compute dtype).
META_DTYPE = torch.float16
FLOATS = {"F32", "F16", "BF16"}


def fail(message: str) -> SystemExit:
    """One line naming the file or tensor at fault, exit status 1."""
    return SystemExit(f"hqq_reference: {message}")


def targets(src: Path, out: Path, group: int) -> set[str]:
    """The tensors `weightsmith quantize` would quantize under w4a16-asym with this group size."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    args = ["quantize", str(src), str(out), "--dry-run", "--json", "--scheme", "w4a16-asym", "--group-size", str(group)]
    proc = subprocess.run(
        [str(WEIGHTSMITH_PYTHON), "-m", "weightsmith.cli", *args], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        raise fail(f"weightsmith's plan for {src} failed: {lines[-1]}")
    plan = json.loads(proc.stdout)["tensors"]
    odd = [t for t in plan if t["action"] not in ("quantize", "keep")]
    if odd:
        raise fail(f"{src}: {odd[0]['name']} would be {odd[0]['action']}d: only dense float checkpoints are handled")
    chosen = {t["name"] for t in plan if t["action"] == "quantize"}
    if not chosen:
        raise fail(f"{src}: no weight weightsmith would quantize with groups of {group}: nothing to compare")
    return chosen


def read_header(path: Path) -> tuple[bytes, dict[str, Any]]:
    """A shard's header as stored (length prefix included) and as parsed."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        raw = f.read(length)
    return struct.pack("<Q", length) + raw, json.loads(raw)


def hqq_fake_quant(weight: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """The weight HQQ reconstructs from its codes, float16 scale and zero, in the weight's dtype."""
    codes, meta = Quantizer.quantize(weight, device="cpu", compute_dtype=torch.float32, **params)
    meta["scale"], meta["zero"] = meta["scale"].to(META_DTYPE), meta["zero"].to(META_DTYPE)
    meta["compute_dtype"] = torch.float32
    return Quantizer.dequantize(codes, meta).to(weight.dtype)


class Tally:
    """What the run quantized and the squared error it left, summed as `eval` sums them."""

    def __init__(self) -> None:
        self.layers = self.numel = self.bytes = 0
        self.sq_error = self.sq_norm = 0.0

    def add(self, weight: torch.Tensor, fake: torch.Tensor) -> None:
        w = weight.double()
        self.layers += 1
        self.numel += weight.numel()
        self.bytes += weight.numel() * weight.element_size()
        self.sq_error += float((fake.double() - w).square().sum())
        self.sq_norm += float(w.square().sum())

    def summary(self) -> dict[str, Any]:
        rel = self.sq_error / self.sq_norm if self.sq_norm else math.nan
        return {
            "name": "overall",
            "layers": self.layers,
            "numel": self.numel,
            "sq_error": self.sq_error,
            "sq_norm": self.sq_norm,
            "rel_mse": rel,
            "sqnr_db": -10 * math.log10(rel) if rel > 0 else math.inf,
        }


def rewrite_shard(src: Path, dst: Path, chosen: set[str], params: dict[str, Any], tally: Tally) -> tuple[int, int]:
    """Write DST with SRC's header and data, the chosen tensors replaced; (parameters, data bytes) of SRC."""
    header_bytes, header = read_header(src)
    tensors = sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"])
    params_total = data_bytes = 0
    with safe_open(str(src), framework="pt") as reader, open(src, "rb") as raw, open(dst, "wb") as out:
        out.write(header_bytes)
        for name, info in tensors:
            begin, end = info["data_offsets"]
            params_total += math.prod(info["shape"])
            data_bytes += end - begin
            if name not in chosen:
                raw.seek(len(header_bytes) + begin)
                _copy(raw, out, end - begin)
                continue
            if info["dtype"] not in FLOATS:
                raise fail(f"{src}: {name} is {info['dtype']}: only F32, F16 and BF16 weights are handled")
            weight = reader.get_tensor(name)
            fake = hqq_fake_quant(weight, params)
            tally.add(weight, fake)
            out.write(fake.contiguous().view(torch.uint8).numpy().tobytes())
    return params_total, data_bytes


def _copy(src: BinaryIO, dst: BinaryIO, size: int, chunk: int = 64 << 20) -> None:
    while size:
        block = src.read(min(chunk, size))
        dst.write(block)
        size -= len(block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="original checkpoint folder (config.json, *.safetensors, tokenizer)")
    parser.add_argument("out", type=Path, help="folder to write (must not exist, or be empty)")
    parser.add_argument("--group-size", type=int, required=True, help="weights per scale and zero (a multiple of 8)")
    parser.add_argument("--json", action="store_true", help="print what was done as JSON")
    opts = parser.parse_args()
    src, out, group = opts.src, opts.out, opts.group_size
    if not (src / "config.json").is_file():
        raise fail(f"{src}: no config.json: not a checkpoint folder")
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise fail(f"{src}: no .safetensors files")
    if out.exists() and any(out.iterdir()):
        raise fail(f"{out}: exists and is not empty")
    if group <= 0 or group % 8:
        raise fail(f"--group-size {group}: HQQ takes a positive multiple of 8")

    started = time.perf_counter()
    chosen = targets(src, out, group)
    params = hqq_base_quant_config(nbits=NBITS, group_size=group, axis=1)["weight_quant_params"]
    out.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out / path.name)
    tally, params_total, source_bytes = Tally(), 0, 0
    for shard in shards:
        n, size = rewrite_shard(shard, out / shard.name, chosen, params, tally)
        params_total, source_bytes = params_total + n, source_bytes + size
    seconds = time.perf_counter() - started

    bits_quantized = NBITS + 2 * 16 / group
    if opts.json:
        bits_total = (8 * (source_bytes - tally.bytes) + bits_quantized * tally.numel) / params_total
        made = {
            "source": str(src),
            "out": str(out),
            "hqq": hqq_version,
            "weight_quant_params": params,
            "scale_zero_dtype": str(META_DTYPE).removeprefix("torch."),
            "tensors_quantized": tally.layers,
            "params_quantized": tally.numel,
            "params_total": params_total,
            "bytes_quantized": tally.bytes,
            "source_bytes": source_bytes,
            "seconds": round(seconds, 2),
            "bits_per_quantized_weight": bits_quantized,
            "bits_per_parameter": round(bits_total, 4),
            "weights": tally.summary(),
        }
        print(json.dumps(made, indent=2))


if __name__ == "__main__":
    main()
