"""`quantize --method gptq` over several processes: the one process's bytes at world sizes 1, 2 and 3.

6,400 tokens in sequences of 256 are 25 sequences, 4 batches (`engine.gptq.BATCH_TOKENS`): 2 ranks
take 2 turns each, 3 ranks leave rank 0 a second turn alone. World size 2 runs under real torchrun,
3 under `--processes`. A rank killed mid-run ends the run with one line naming it, and leaves
nothing beside the destination's parent that looks finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clirun import one_error_line, run, sigint_default
from engine.ranks import rank_pid

ARGS = ("--method", "gptq", "--group-size", "32", "--builtin", "code", "--tokens", "6400", "--seq-len", "256")
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _manifest(out: Path) -> dict:
    """The manifest without the moment it was written."""
    manifest = json.loads((out / "weightsmith.json").read_text())
    manifest.pop("created_utc")
    return manifest


def test_world_sizes_one_two_three_write_the_same_bytes(
    tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = tmp_path / "1"
    code, _, err = run(capsys, monkeypatch, "quantize", tiny_llama, one, *ARGS)
    assert code == 0, err

    two = tmp_path / "2"
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "weightsmith", "quantize", str(tiny_llama),
         str(two), *ARGS],
        capture_output=True, text=True, timeout=600, preexec_fn=sigint_default,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    three = tmp_path / "3"
    code, report, err = run(capsys, monkeypatch, "quantize", tiny_llama, three, *ARGS, "--processes", "3", "--json")
    assert code == 0, err
    assert json.loads(report)["output"] == str(three)  # rank 0's report reaches the launcher's stdout

    for out in (two, three):
        assert (out / "model.safetensors").read_bytes() == (one / "model.safetensors").read_bytes()
        assert _manifest(out) == _manifest(one)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "3"]  # no scratch folder left


def test_a_killed_rank_ends_the_run_with_one_line_and_no_output(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "weightsmith", "quantize", str(tiny_llama), str(out), *ARGS, "--processes", "2"],
        stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default,
    )  # fmt: skip
    try:
        rank = rank_pid(launcher.pid, 1, reading=".safetensors")  # mid-run
        os.kill(rank, signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 2
    assert one_error_line(err) == "error: rank 1 of 2 was killed by SIGKILL; the other ranks were stopped"
    assert list(tmp_path.iterdir()) == []  # no output, no partial one, no scratch folder


@pytest.mark.parametrize("all_experts", [False, True], ids=["routed", "all-experts"])
def test_moe_experts_write_the_same_bytes_on_two_ranks(
    smollm2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    all_experts: bool,
) -> None:  # fmt: skip
    """An MoE's experts across ranks: 3 batches of 32 sequences of 64 tokens, rank 0 two of them. Routed as
    the model routes, an expert's rows in a batch are none (nothing is sent), fewer than its width (the
    rows go) or more (their product goes), and some expert has fewer in all than its width; the output
    is one process's, byte for byte, as with every token through every expert (products only)."""
    from engine.tiny_models import MOE_FAMILIES, save_tiny

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    src = save_tiny(tmp_path / "src", "qwen2_moe", tokenizer=smollm2, shapes=MOE_FAMILIES["qwen2_moe"])
    args = ("--method", "gptq", "--group-size", "32", "--builtin", "code", "--tokens", "6144", "--seq-len", "64",
            *(["--all-experts"] if all_experts else []))  # fmt: skip
    one, two = tmp_path / "1", tmp_path / "2"
    code, _, err = run(capsys, monkeypatch, "quantize", src, one, *args)
    assert code == 0, err
    code, _, err = run(capsys, monkeypatch, "quantize", src, two, *args, "--processes", "2")
    assert code == 0, err
    assert (two / "model.safetensors").read_bytes() == (one / "model.safetensors").read_bytes()
    assert _manifest(two) == _manifest(one)
    method = _manifest(one)["method"]
    assert method["all_experts"] is all_experts and (method["few_tokens"] == {}) is all_experts
