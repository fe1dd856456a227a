"""The library entry point: what the command line runs, callable from code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import weightsmith
from synth import llama_tensors, write_checkpoint
from weightsmith.core.errors import WeightsmithError
from weightsmith.quantize.pipeline import QuantizeResult


def test_quantize_from_code_equals_the_command_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from clirun import run

    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    result = weightsmith.quantize(src, tmp_path / "lib", "w4a16-asym", group_size=64, workers=2, hash_sources=False)
    assert isinstance(result, QuantizeResult) and result.output == tmp_path / "lib"
    assert result.manifest.recipe.rules and result.manifest.recipe.rules[0].config_group == "W4A16_ASYM"
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "cli", "--scheme", "w4a16-asym",
                       "--group-size", "64", "--no-hash")
    assert code == 0, err
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert (tmp_path / "lib" / shard).read_bytes() == (tmp_path / "cli" / shard).read_bytes()
    assert json.loads((tmp_path / "lib" / "config.json").read_text()) == json.loads(
        (tmp_path / "cli" / "config.json").read_text()
    )


def test_plan_quantize_writes_nothing_and_errors_are_one_line(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors())
    plan = weightsmith.plan_quantize(src, "nvfp4a16")
    assert plan.count("quantize") == 14 and plan.bytes_out < plan.bytes_in
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    with pytest.raises(WeightsmithError, match="unknown scheme 'w5a16'"):
        weightsmith.plan_quantize(src, "w5a16")
