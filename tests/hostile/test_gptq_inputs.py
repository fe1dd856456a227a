"""Hostile inputs to `quantize --method gptq`: one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


def test_gptq_with_a_search_that_needs_a_first_pass(sandbox: Sandbox, capsys, monkeypatch) -> None:
    _, line = _run(sandbox, capsys, monkeypatch, "--method", "gptq", "--scale-search", "memoryless_mse")
    assert "--method gptq" in line and "--scale-search memoryless_mse" in line


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


@pytest.mark.parametrize("value", ["group", "dynamic", "sideways"])
def test_actorder_not_offered(sandbox: Sandbox, capsys, monkeypatch, value: str) -> None:
    _, line = _run(sandbox, capsys, monkeypatch, "--method", "gptq", "--actorder", value)
    assert f"--actorder {value!r}" in line and line.endswith("choose from static, none")
    grouped = value in ("group", "dynamic")
    assert ("compressed-tensors deprecates it and llm-compressor's GPTQ refuses it" in line) == grouped
    assert ("other name for group" in line) == (value == "dynamic")
    assert ("is not an activation ordering" in line) == (not grouped)


def _with_tokenizer(sandbox: Sandbox, config: dict[str, object]) -> Path:
    """A tiny checkpoint with SmolLM2's tokenizer (GPTQ runs on it in well under a second per layer)."""
    from models import smollm2_fp32

    src = write_checkpoint(sandbox.root / "src", llama_tensors(config), config)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_fp32() / name, src / name)
    return src


def test_too_few_tokens_and_a_singular_hessian(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """6 tokens for 64- and 128-wide inputs with no dampening: the run warns with the count and the
    dampening, every Hessian is singular, each such Linear is named and rounded to nearest instead,
    and the output is whole, verify clean, and records the fallbacks."""
    from fidelity.eval_checkpoints import TINY_LM_CONFIG
    from weightsmith.audit.verify import verify
    from weightsmith.io.manifest import load_manifest

    src = _with_tokenizer(sandbox, TINY_LM_CONFIG)
    sandbox.freeze()
    out = sandbox.root / "out"
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, "--group-size", "32", "--method", "gptq",
                           "--builtin", "code", "--tokens", "6", "--seq-len", "6", "--dampening", "0")  # fmt: skip
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    err = " ".join(result.err.split())
    assert "6 calibration tokens, fewer than the widest quantized input (128 columns)" in err
    assert "dampening (0.0 of its mean diagonal)" in err
    fallback = load_manifest(out / "weightsmith.json").method.rtn_fallback  # type: ignore[union-attr]
    assert fallback, "no Hessian was singular"
    for module, why in fallback.items():
        assert f"{module}: round-to-nearest, {why}" in err
        assert "not positive definite after dampening" in why
    assert verify(out).clean
    sandbox.assert_untouched("out")


def test_tokenizer_of_another_model(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """Token ids past the model's embeddings (a tokenizer that is not the model's): one line, not an
    IndexError from inside torch."""
    src = _with_tokenizer(sandbox, TINY)  # 64 embeddings, SmolLM2's 49,152-token vocabulary
    sandbox.freeze()
    out = sandbox.root / "out"
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, "--group-size", "32", "--method", "gptq",
                           "--tokens", "32", "--seq-len", "16")  # fmt: skip
    assert result.code == 2
    line = result.error_line
    assert str(src) in line and "64 tokens" in line and "tokenizer" in line
    assert not out.exists()
    sandbox.assert_untouched()


def test_dry_run_says_what_gptq_would_do(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    sandbox.freeze()
    args = ["quantize", src, sandbox.root / "out", "--group-size", "32", "--method", "gptq", "--tokens", "512",
            "--actorder", "none", "--dry-run"]  # fmt: skip
    result = run_inprocess(capsys, monkeypatch, *args)
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    assert "method: gptq on at most 512 tokens of the built-in code text" in text and "actorder none" in text
    result = run_inprocess(capsys, monkeypatch, *args, "--json")
    assert json.loads(result.out)["method"] == {"name": "gptq", "text": "builtin:code", "tokens_at_most": 512,
                                                "seq_len": 256, "actorder": "none", "dampening": 0.1,
                                                "all_experts": False}  # fmt: skip
    sandbox.assert_untouched()
