"""Regular expressions from a user or a checkpoint: a bad one is one line, a catastrophic one never hangs."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest

from hostile.harness import Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.formats.targets import MATCH_TIMEOUT_S, Targets

#: Exponential for a backtracking matcher on a name of many `a`s that does not end where `$` wants.
CATASTROPHIC = "re:(a|aa)+$"
LONG_NAME = "a" * 60 + "b"


def matches(entry: str, module: str) -> bool:
    """One entry against one module name, as every list of targets is matched."""
    return Targets([entry], "pattern").matches(module)


def test_a_catastrophic_pattern_is_stopped_at_the_time_limit() -> None:
    started = time.perf_counter()
    with pytest.raises(Exception, match="backtracks catastrophically") as caught:
        matches(CATASTROPHIC, LONG_NAME)
    # unbounded, this match runs for hours; the bound leaves room for a machine shared by other jobs
    assert time.perf_counter() - started < MATCH_TIMEOUT_S + 20
    assert type(caught.value).__name__ == "WeightsmithError"
    assert matches("re:.*mlp", "model.layers.0.mlp.up_proj") and not matches("re:mlp", "model.layers.0.mlp")


@pytest.mark.parametrize("where", ["--ignore", "config ignore", "config targets"])
def test_quantize_and_verify_stop_a_catastrophic_pattern(sandbox: Sandbox, capsys, monkeypatch, where: str) -> None:
    tensors = llama_tensors()
    tensors[f"model.{LONG_NAME}.weight"] = np.ones((64, 256), ml_dtypes.bfloat16)
    config = dict(LLAMA_CONFIG)
    if where != "--ignore":
        weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
        group = {"targets": ["Linear"], "weights": weights}
        if where == "config targets":
            group["targets"] = [CATASTROPHIC.replace("re:", "re:model\\.")]
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": group},
            "ignore": [CATASTROPHIC.replace("re:", "re:model\\.")] if where == "config ignore" else [],
        }
    src = write_checkpoint(sandbox.root / "src", tensors, config)
    sandbox.freeze()
    started = time.perf_counter()
    if where == "--ignore":
        args = ["quantize", src, sandbox.root / "out", "--ignore", CATASTROPHIC.replace("re:", "re:model\\.")]
    else:
        args = ["verify", src]
    result = run_inprocess(capsys, monkeypatch, *args)
    assert time.perf_counter() - started < 30
    line = result.error_line
    assert result.code == 2 and "backtracks catastrophically" in line and "(a|aa)+$" in line, line
    if where != "--ignore":
        assert "config.json" in line
    sandbox.assert_untouched()
