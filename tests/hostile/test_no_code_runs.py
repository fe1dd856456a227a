"""A checkpoint's own code is data: quantize, verify and inspect never import or run it."""

from __future__ import annotations

import json
from pathlib import Path

from hostile.harness import Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint

EVIL = """
from pathlib import Path
Path({canary!r}).write_text("remote code ran")
"""


def _remote_code_checkpoint(root: Path, canary: Path) -> Path:
    config = {**LLAMA_CONFIG, "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}
    src = write_checkpoint(root / "src", llama_tensors(LLAMA_CONFIG), config)
    (src / "modeling_evil.py").write_text(EVIL.format(canary=str(canary)))
    (src / "__init__.py").write_text(EVIL.format(canary=str(canary)))
    return src


def test_remote_code_is_copied_never_run(sandbox: Sandbox, capsys, monkeypatch) -> None:
    canary = sandbox.root / "canary"
    src = _remote_code_checkpoint(sandbox.root, canary)
    out = sandbox.root / "out"
    sandbox.freeze()
    for args in (["inspect", src], ["verify", src], ["quantize", src, out, "--no-hash"], ["inspect", out]):
        result = run_inprocess(capsys, monkeypatch, *args)
        assert result.code == 0, (args, result.err)
    assert not canary.exists()
    assert (out / "modeling_evil.py").read_bytes() == (src / "modeling_evil.py").read_bytes()
    assert json.loads((out / "config.json").read_text())["auto_map"] == {
        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"
    }
    sandbox.assert_untouched("out")
