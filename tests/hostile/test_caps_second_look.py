"""Quoting, caps and scans, the second look.

- `card` read README.md and the JSON files beside it whole: a 3 GiB README.md or inspect.json was
  a MemoryError traceback under `card --check`;
- `verify --scan-values` read an MX format's E8M0 scales (stored as uint8) as plain bytes, so a
  scale of 0xFF (NaN) passed as clean;
- transformers read a tokenizer file whole, whatever its size or kind: a 2 GB tokenizer.json held
  4.7 GB; each tokenizer file is now a regular file within a cap, checked before it is opened.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hostile.harness import TINY_LLAMA, Result, Sandbox, copies, run_inprocess, run_subprocess, tiny_pair
from synth import llama_tensors, write_checkpoint
from weightsmith.api import quantize
from weightsmith.card.check import MAX_CARD_BYTES
from weightsmith.checkpoint import MAX_TOKENIZER_BYTES
from weightsmith.files import MAX_JSON_BYTES

_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
sys.argv = ["weightsmith", *sys.argv[1:]]
from weightsmith.cli import main
main()
"""


def limited(*args: object, timeout: float = 120) -> Result:
    """`weightsmith ARGS` in a child under a 3 GiB address-space limit and a time limit."""
    proc = subprocess.run(
        [sys.executable, "-c", _LIMITED, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def sparse(path: Path, size: int) -> None:
    """Make `path` a file of `size` bytes that uses no disk."""
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


def _carded(sandbox: Sandbox, tiny, capsys, monkeypatch) -> Path:
    """A copy of the tiny quantized checkpoint with its card written, which `card --check` passes."""
    _, quant = copies(sandbox, tiny)
    assert run_inprocess(capsys, monkeypatch, "card", quant).code == 0
    assert run_inprocess(capsys, monkeypatch, "card", quant, "--check").code == 0
    return quant


# --- 3d. the card and the files beside it are read under a cap ---------------------------------


@pytest.mark.parametrize(("name", "cap"), [("README.md", MAX_CARD_BYTES), ("inspect.json", MAX_JSON_BYTES)])
def test_a_3_gib_card_or_kept_file_is_refused_by_its_size(
    name: str, cap: int, sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """Read whole, each was a MemoryError traceback under a 3 GiB address space."""
    quant = _carded(sandbox, tiny, capsys, monkeypatch)
    sparse(quant / name, 3 << 30)
    sandbox.freeze()
    r = limited("card", quant, "--check")
    assert r.code == 2 and f"{quant / name}: is larger than {cap:,} bytes" in r.error_line, r.err
    if name == "README.md":  # writing a card reads the README.md it would replace
        r = limited("card", quant)
        assert r.code == 2 and f"{quant / name}: is larger than {cap:,} bytes" in r.error_line, r.err
    sandbox.assert_untouched()


# --- 5a. every scale dtype's NaN is found ------------------------------------------------------


def _fill(shard: Path, name: str, byte: int) -> str:
    """Set every byte of tensor NAME in the shard to BYTE, in place; its dtype."""
    data = bytearray(shard.read_bytes())
    (size,) = struct.unpack_from("<Q", data)
    entry = json.loads(data[8 : 8 + size])[name]
    begin, end = entry["data_offsets"]
    data[8 + size + begin : 8 + size + end] = bytes([byte]) * (end - begin)
    shard.write_bytes(bytes(data))
    return str(entry["dtype"])


@pytest.mark.parametrize(
    ("scheme", "byte"),
    [("mxfp4a16", 0xFF), ("mxfp8a16", 0xFF), ("nvfp4a16", 0x7F), ("nvfp4a16", 0xFF), ("fp8-dynamic", 0xFF)],
)
def test_scan_values_finds_a_nan_in_every_scale_dtype(
    scheme: str, byte: int, sandbox: Sandbox, capsys, monkeypatch
) -> None:
    """0xFF is NaN in E8M0 (an MX scale, stored as uint8); 0x7F and 0xFF in FP8 E4M3; all ones in F32."""
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY_LLAMA), TINY_LLAMA)
    quant = quantize(src, sandbox.root / "q", scheme, workers=1).output
    name = "model.layers.0.mlp.down_proj.weight_scale"
    dtype = _fill(quant / "model.safetensors", name, byte)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "verify", quant, "--scan-values", "--json")
    sandbox.assert_untouched()
    found = [(f["check"], f["tensor"]) for f in json.loads(result.out)["findings"] if f["severity"] == "error"]
    assert result.code == 1 and ("values.non-finite", name) in found, (dtype, found)


# --- 3c. tokenizer files are checked before transformers reads them ----------------------------


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.json", "special_tokens_map.json"])
def test_a_tokenizer_file_past_its_cap_is_refused_unread(
    name: str, sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """transformers reads a tokenizer file whole: a 2 GB tokenizer.json held 4.7 GB before failing."""
    pytest.importorskip("transformers")
    orig, _ = copies(sandbox, tiny)
    sparse(orig / name, MAX_TOKENIZER_BYTES + 1)
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "calibrate", orig, "--out", sandbox.root / "s.safetensors")
    assert r.code == 2, r
    assert r.error_line == (
        f"error: {orig / name}: is larger than {MAX_TOKENIZER_BYTES:,} bytes, the cap on a tokenizer file"
    )
    sandbox.assert_untouched()


def test_a_tokenizer_file_that_is_a_fifo_is_refused_unopened(sandbox: Sandbox, tiny) -> None:
    pytest.importorskip("transformers")
    orig, quant = copies(sandbox, tiny)
    os.mkfifo(orig / "tokenizer.json")
    sandbox.freeze()
    r = run_subprocess("eval", orig, quant, timeout=300)
    assert r.code == 2, r
    assert r.error_line == f"error: {orig / 'tokenizer.json'}: is a FIFO (named pipe), not a regular file"
    sandbox.assert_untouched()
