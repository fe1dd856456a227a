"""Hostile inputs to `calibrate` and `eval --stream`: one line, exit 2, nothing written."""

from __future__ import annotations

import pytest

from hostile.harness import Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = dict(LLAMA_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=64, num_hidden_layers=2)  # fmt: skip
HOLE = "model.layers.1.mlp.down_proj.weight"


def test_existing_stats_file_is_refused_without_force(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    out = sandbox.root / "stats.safetensors"
    out.write_bytes(b"another model's statistics")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2
    line = result.error_line
    assert str(out) in line and "already exists" in line and "--force" in line
    sandbox.assert_untouched()


def test_missing_layer_tensor_is_named(sandbox: Sandbox, capsys, monkeypatch) -> None:
    tensors = llama_tensors(TINY)
    del tensors[HOLE]
    src = write_checkpoint(sandbox.root / "src", tensors, TINY)
    out = sandbox.root / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2
    line = result.error_line
    assert str(src) in line and f"tensor '{HOLE}'" in line and "missing" in line
    assert not out.exists()
    sandbox.assert_untouched()


def test_unknown_architecture_is_named(sandbox: Sandbox, capsys, monkeypatch) -> None:
    config = dict(TINY, model_type="warp_drive", architectures=["WarpDriveForCausalLM"])
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), config)
    out = sandbox.root / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2
    line = result.error_line
    assert str(src / "config.json") in line and "warp_drive" in line
    sandbox.assert_untouched()


def test_layer_tensor_of_the_wrong_shape_is_named(sandbox: Sandbox, capsys, monkeypatch) -> None:
    tensors = llama_tensors(TINY)
    tensors[HOLE] = tensors[HOLE][:, :64].copy()
    src = write_checkpoint(sandbox.root / "src", tensors, TINY)
    out = sandbox.root / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2
    line = result.error_line
    assert f"tensor '{HOLE}'" in line and "[64, 64]" in line and "[64, 128]" in line
    assert not out.exists()
    sandbox.assert_untouched()


def test_out_in_a_missing_folder(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    out = sandbox.root / "nowhere" / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2 and str(out) in result.error_line
    sandbox.assert_untouched()


def test_missing_text_file(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    out = sandbox.root / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out, "--text", sandbox.root / "no.txt")
    assert result.code == 2 and "no.txt" in result.error_line
    sandbox.assert_untouched()


def test_shard_missing_from_disk_is_named(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY, shards=2)
    gone = src / "model-00002-of-00002.safetensors"
    gone.unlink()
    out = sandbox.root / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2 and str(gone) in result.error_line
    sandbox.assert_untouched()


def test_shard_left_out_of_the_index_names_a_tensor_it_held(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """A consistent index without one shard: the layers whose tensors it held cannot be built."""
    import json

    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY, shards=2)
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    gone = "model-00002-of-00002.safetensors"
    held = sorted(n for n, f in index["weight_map"].items() if f == gone)
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != gone}
    index_path.write_text(json.dumps(index))
    (src / gone).unlink()
    out = sandbox.root / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2
    line = result.error_line
    assert "is missing" in line and any(f"tensor '{n}'" in line for n in held), line
    sandbox.assert_untouched()


def test_remote_code_is_not_run_without_trust(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """A checkpoint shipping its own model code: without --trust-remote-code it is refused before
    transformers sees it, even where transformers has a class of its own for the model_type."""
    canary = sandbox.root / "canary"
    evil = f"from pathlib import Path\nPath({str(canary)!r}).write_text('remote code ran')\n"
    config = dict(TINY, auto_map={"AutoConfig": "modeling_evil.EvilConfig",
                                  "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})  # fmt: skip
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), config)
    (src / "modeling_evil.py").write_text(evil)
    out = sandbox.root / "stats.safetensors"
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "calibrate", src, "--out", out)
    assert result.code == 2
    assert result.error_line.startswith(f"error: {src / 'config.json'}: 'auto_map' names Python code")
    assert not canary.exists()
    sandbox.assert_untouched()
