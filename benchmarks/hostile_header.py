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
import sys
import tempfile
from pathlib import Path

from common import measured

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, action="append", help="tensors in the shard (repeatable)")
    args = ap.parse_args()
    ws = [sys.executable, "-m", "weightsmith"]
    with tempfile.TemporaryDirectory() as tmp:
        for count in args.tensors or [1_150_000, 450_000]:
            src = Path(tmp) / f"n{count}"
            build(src, count)
            shard = src / "model.safetensors"
            print(f"{count:,} one-byte tensors, header {shard.stat().st_size / 1e6:.1f} MB")
            peer = measured([sys.executable, "-c", PEER, str(shard)])
            print(f"  {'safetensors keys (peer)':30} {peer.wall:6.2f} s {peer.rss_mib:8.0f} MiB")
            for name, cmd in (
                ("weightsmith verify", [*ws, "verify", str(src)]),
                ("weightsmith quantize --dry-run", [*ws, "quantize", str(src), str(Path(tmp) / "out"), "--dry-run",
                                                    "--json"]),
            ):
                run = measured(cmd, ok=(0, 1, 2))  # a finding (1) or a refusal (2) is the result measured here
                print(f"  {name:30} {run.wall:6.2f} s {run.rss_mib:8.0f} MiB  exit {run.code}  "
                      f"({run.wall / peer.wall:.1f}x the peer's time)")  # fmt: skip


if __name__ == "__main__":
    main()
