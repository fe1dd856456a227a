"""What a header of a million tiny tensors costs: `verify` and `quantize --dry-run`, beside the safetensors library.

A stranger's shard may declare 1.15 M one-byte tensors in an 87 MB header. weightsmith refuses more
than `MAX_TENSORS` (500,000) per checkpoint, counted in the raw header bytes before any JSON is
parsed; below the limit, the cost per tensor is what a real large checkpoint pays. The peer is the
safetensors library reading the same header (`safe_open(...).keys()`), in a fresh process too.

    python benchmarks/hostile_header.py [--tensors 1150000] [--tensors 450000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER = "import sys; from safetensors import safe_open; f = safe_open(sys.argv[1], 'np'); print(len(list(f.keys())))"


def build(folder: Path, count: int) -> Path:
    """A checkpoint whose one shard holds `count` U8 tensors of shape [1]."""
    folder.mkdir(parents=True)
    header = {f"l.{i}.weight": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(count)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    (folder / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + bytes(count))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return folder


def run(cmd: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MiB and exit status of one fresh process (any status is a result here)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, action="append", help="tensors in the shard (repeatable)")
    ap.add_argument("--build", nargs=2, metavar=("DIR", "COUNT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:  # in its own process: Linux counts a parent's resident pages in a child's peak RSS
        build(Path(args.build[0]), int(args.build[1]))
        return
    ws = [sys.executable, "-m", "weightsmith"]
    with tempfile.TemporaryDirectory() as tmp:
        for count in args.tensors or [1_150_000, 450_000]:
            src = Path(tmp) / f"n{count}"
            subprocess.run([sys.executable, __file__, "--build", str(src), str(count)], check=True)
            shard = src / "model.safetensors"
            print(f"{count:,} one-byte tensors, header {shard.stat().st_size / 1e6:.1f} MB")
            peer_s, peer_mib, _ = run([sys.executable, "-c", PEER, str(shard)])
            print(f"  {'safetensors keys (peer)':30} {peer_s:6.2f} s {peer_mib:8.0f} MiB")
            for name, cmd in (
                ("weightsmith verify", [*ws, "verify", str(src)]),
                ("weightsmith quantize --dry-run", [*ws, "quantize", str(src), str(Path(tmp) / "out"), "--dry-run",
                                                    "--json"]),
            ):
                wall, mib, code = run(cmd)
                print(f"  {name:30} {wall:6.2f} s {mib:8.0f} MiB  exit {code}  ({wall / peer_s:.1f}x the peer's time)")


if __name__ == "__main__":
    main()
