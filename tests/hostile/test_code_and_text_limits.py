"""Every text input has a limit, and every number a check: one line, never a hang or a traceback.

- `--text` (calibrate, eval, quantize --method gptq) is a regular file of bounded size: a FIFO or
  `/dev/zero` is refused before it is opened (run in a child with a time and memory limit: before,
  one hung and the other read until the OOM killer came), a file over the limit after reading no
  more than the limit.
- `--tokens` is a whole number up to `calibration.MAX_TOKENS` (`1e12` was click's usage text, a
  trillion was accepted).
- A statistics file's counts are ASCII digits (`tokens="²"` was a traceback); an arms file's sweep
  flag and key hold no NUL (a traceback from starting the server).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hostile.harness import Result, Sandbox, copies, run_inprocess, tiny_pair
from weightsmith.calibration.stats_file import CalibrationStats, write
from weightsmith.io.provenance import Provenance
from weightsmith.io.texts import MAX_TOKENS, TEXT_LIMIT


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


# ---- --text: a regular file, of bounded size --------------------------------------------------------


def _limited() -> None:
    """An address-space limit for a child that could read without end (it fails, not the machine)."""
    resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))


def _text_commands(orig: Path, quant: Path, sandbox: Sandbox, text: Path) -> dict[str, list[object]]:
    return {
        "calibrate": ["calibrate", orig, "--out", sandbox.root / "stats.safetensors", "--text", text],
        "eval": ["eval", orig, quant, "--text", text],
        "gptq": ["quantize", orig, sandbox.root / "out", "--method", "gptq", "--no-hash", "--text", text],
    }


@pytest.mark.parametrize(("special", "says"), [("fifo", "is a FIFO (named pipe)"), ("/dev/zero", "is a device")])
@pytest.mark.parametrize("command", ["calibrate", "eval", "gptq"])
def test_text_that_never_ends_is_refused_unread(sandbox: Sandbox, tiny, special: str, says: str, command: str) -> None:
    pytest.importorskip("transformers")
    orig, quant = copies(sandbox, tiny)
    text = sandbox.root / "text"
    if special == "fifo":
        os.mkfifo(text)
    else:
        text = Path(special)
    sandbox.freeze()
    args = [sys.executable, "-m", "weightsmith", *map(str, _text_commands(orig, quant, sandbox, text)[command])]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL, env=env,
                          preexec_fn=_limited)  # fmt: skip
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    assert result.code == 2, result
    assert result.error_line == f"error: {text}: cannot read --text file: {says}, not a regular file"
    sandbox.assert_untouched()


def test_text_over_the_limit_is_refused(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, quant = copies(sandbox, tiny)
    text = sandbox.root / "huge.txt"
    with open(text, "wb") as f:
        f.truncate(TEXT_LIMIT + 1)  # sparse: no disk used
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "eval", orig, quant, "--text", text)
    assert result.code == 2
    assert result.error_line == f"error: {text}: --text file is larger than {TEXT_LIMIT} bytes"
    sandbox.assert_untouched()


def test_text_help_states_the_limit(capsys, monkeypatch) -> None:
    for command in (["calibrate"], ["eval"], ["quantize"], ["calibrate-kv"]):
        result = run_inprocess(capsys, monkeypatch, *command, "--help")
        assert result.code == 0
        flat = " ".join(result.out.replace("│", " ").split())
        assert f"at most {TEXT_LIMIT // 2**20} MiB" in flat and f"{MAX_TOKENS:,}" in flat, command


# ---- numbers: --tokens, a statistics file, a sweep flag ---------------------------------------------


@pytest.mark.parametrize("value", ["1e12", "1000000000000", str(MAX_TOKENS + 1), "²", "0", "-5", "1.5", "9" * 5000])
@pytest.mark.parametrize("command", ["calibrate", "eval", "gptq", "calibrate-kv"])
def test_tokens_beyond_the_limit_is_one_line(
    sandbox: Sandbox, tiny, capsys, monkeypatch, value: str, command: str
) -> None:
    orig, quant = copies(sandbox, tiny)
    args = {
        "calibrate": ["calibrate", orig, "--out", sandbox.root / "stats.safetensors"],
        "eval": ["eval", orig, quant],
        "gptq": ["quantize", orig, sandbox.root / "out", "--method", "gptq"],
        "calibrate-kv": ["calibrate-kv", quant],
    }[command]
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, *args, "--tokens", value)
    assert result.code == 2
    least = 2 if command == "eval" else 1
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    assert result.error_line == (
        f"error: --tokens {shown}: give a whole number of tokens from {least} to {MAX_TOKENS:,}"
    )
    sandbox.assert_untouched()


@pytest.mark.parametrize("count", ["²", "١٢", "12\n", " 12"])
def test_statistics_file_count_that_is_not_ascii_digits(sandbox: Sandbox, tiny, capsys, monkeypatch, count) -> None:
    orig, _ = copies(sandbox, tiny)
    stats = sandbox.root / "stats.safetensors"
    provenance = Provenance("sha256:0", count, 1, 1, "text", "0" * 64, "original")
    write(stats, CalibrationStats(provenance, {}, {"model.layers.0.mlp.down_proj": 1.0}))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", orig, sandbox.root / "out", "--scheme", "nvfp4",
                           "--calibration", stats)  # fmt: skip
    assert result.code == 2
    assert result.error_line.startswith(f"error: {stats}: metadata 'tokens' is ")
    assert result.error_line.endswith(", not a count")
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    ("sweep", "what"),
    [
        ('{ flag = "--num-speculative-tokens\\u0000", values = [1, 2] }', "flag"),
        ('{ flag = "--speculative-config", key = "num_speculative_tokens\\u0000", values = [1, 2] }', "key"),
    ],
)
def test_nul_in_a_sweep_is_one_line(sandbox: Sandbox, capsys, monkeypatch, sweep: str, what: str) -> None:
    arms = sandbox.root / "arms.toml"
    arms.write_text(
        'repeats = 1\n[[arms]]\nname = "a"\n'
        "command = ['true', '--port', '{port}', '--speculative-config', '{\"method\": \"mtp\"}']\n"
        f"sweep = {sweep}\n"
    )
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "bench", "run", arms, "--out", sandbox.root / "out")
    assert result.code == 2
    assert result.error_line == f"error: {arms}: arm 'a': sweep: {what} contains a NUL character"
    sandbox.assert_untouched()
