"""Hostile inputs to `quantize --method gptq`: one line, exit 2, nothing written."""

from __future__ import annotations

import pytest

from hostile.harness import Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = dict(LLAMA_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=64, num_hidden_layers=2)  # fmt: skip


def _run(sandbox: Sandbox, capsys, monkeypatch, *extra: object):
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    sandbox.freeze()
    out = sandbox.root / "out"
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, "--group-size", "32", *extra)
    assert result.code == 2
    assert not out.exists()
    sandbox.assert_untouched()
    return src, result.error_line


def test_unknown_method(sandbox: Sandbox, capsys, monkeypatch) -> None:
    _, line = _run(sandbox, capsys, monkeypatch, "--method", "awq")
    assert "unknown method 'awq'" in line and "gptq" in line


def test_gptq_with_a_scale_search(sandbox: Sandbox, capsys, monkeypatch) -> None:
    _, line = _run(sandbox, capsys, monkeypatch, "--method", "gptq", "--scale-search", "mse")
    assert "--method gptq" in line and "--scale-search" in line


def test_calibration_text_without_gptq(sandbox: Sandbox, capsys, monkeypatch) -> None:
    _, line = _run(sandbox, capsys, monkeypatch, "--builtin", "code")
    assert "--method gptq" in line


@pytest.mark.parametrize("value", ["-0.1", "1", "nan"])
def test_dampening_out_of_range(sandbox: Sandbox, capsys, monkeypatch, value: str) -> None:
    _, line = _run(sandbox, capsys, monkeypatch, "--method", "gptq", "--dampening", value)
    assert "--dampening" in line


def test_checkpoint_without_a_tokenizer(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src, line = _run(sandbox, capsys, monkeypatch, "--method", "gptq", "--builtin", "code")
    assert str(src) in line and "tokenizer" in line


def test_missing_text_file(sandbox: Sandbox, capsys, monkeypatch) -> None:
    missing = sandbox.root / "nowhere.txt"
    _, line = _run(sandbox, capsys, monkeypatch, "--method", "gptq", "--text", missing)
    assert str(missing) in line
