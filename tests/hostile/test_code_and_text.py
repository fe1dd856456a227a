"""Nothing runs that was not asked for: a checkpoint's own code, and the prompt that would run it.

A checkpoint whose config.json or tokenizer_config.json has an `auto_map` (modules of its own for
transformers to import): `calibrate`, `eval` and `quantize --method gptq` without
`--trust-remote-code` run none of it and ask nothing, whatever stdin is (a terminal, or a pipe
that would answer `y`): one line naming the file and the key, exit 2. (Before, `eval` let
transformers ask `[y/N]` and import the code on `y`.)
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from hostile.harness import Result, Sandbox, copies, run_inprocess, tiny_pair

EVIL = "from pathlib import Path\nPath({canary!r}).write_text('remote code ran')\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


# ---- remote code ----------------------------------------------------------------------------------


def _ships_code(root: Path, where: str) -> Path:
    """Give the checkpoint at `root` code of its own that writes `root/../canary` when imported."""
    canary = root.parent / "canary"
    for module in ("configuration_evil", "modeling_evil", "tokenization_evil"):
        (root / f"{module}.py").write_text(EVIL.format(canary=str(canary)))
    if where == "config.json":
        config = json.loads((root / "config.json").read_text())
        # an unknown model_type: transformers has no code of its own for it, so left to decide it asks
        auto_map = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.Evil"}
        config.update(model_type="evil", auto_map=auto_map)
        (root / "config.json").write_text(json.dumps(config))
    else:
        auto_map = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        (root / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map}))
    return canary


def _run_answering_yes(args: list[object], tty: bool, home: Path, timeout: float = 180) -> Result:
    """`weightsmith ARGS...` in a child whose stdin (a terminal, or a pipe) already holds `y`: any
    question asked is answered yes."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(home)}
    command = [sys.executable, "-m", "weightsmith", *map(str, args)]
    if tty:
        leader, follower = pty.openpty()
        os.write(leader, b"y\n")
        try:
            proc = subprocess.run(command, stdin=follower, capture_output=True, text=True, timeout=timeout, env=env)
        finally:
            os.close(follower)
            os.close(leader)
    else:
        proc = subprocess.run(command, input="y\n", capture_output=True, text=True, timeout=timeout, env=env)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def _commands(orig: Path, quant: Path, sandbox: Sandbox) -> dict[str, list[object]]:
    return {
        "calibrate": ["calibrate", orig, "--out", sandbox.root / "stats.safetensors"],
        "eval": ["eval", orig, quant],
        "gptq": ["quantize", orig, sandbox.root / "out", "--method", "gptq", "--no-hash"],
    }


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize(
    ("command", "tty"),
    # stdin a terminal for each command; a pipe for eval, whose transformers load read it before
    [("calibrate", True), ("eval", True), ("gptq", True), ("eval", False)],
    ids=["calibrate-terminal", "eval-terminal", "gptq-terminal", "eval-pipe"],
)
def test_auto_map_runs_nothing_and_asks_nothing(
    sandbox: Sandbox, tiny, tmp_path: Path, where: str, command: str, tty: bool
) -> None:
    pytest.importorskip("transformers")
    orig, quant = copies(sandbox, tiny)
    canary = _ships_code(orig, where)
    sandbox.freeze()
    result = _run_answering_yes(_commands(orig, quant, sandbox)[command], tty, tmp_path / "hf")
    assert result.code == 2, result
    line = result.error_line
    assert line == (
        f"error: {orig / where}: 'auto_map' names Python code shipped with the checkpoint, which transformers "
        "would run; pass --trust-remote-code to allow it"
    )
    assert "[y/N]" not in result.out + result.err
    assert not canary.exists()
    sandbox.assert_untouched()


def test_trust_remote_code_is_an_eval_flag(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """`eval` takes the flag the refusal names; with --no-logits nothing is loaded, so nothing is refused."""
    orig, quant = copies(sandbox, tiny)
    _ships_code(orig, "config.json")
    sandbox.freeze()
    for flags in (["--trust-remote-code", "--no-logits"], ["--no-logits"]):
        result = run_inprocess(capsys, monkeypatch, "eval", orig, quant, *flags, "--json")
        assert result.code == 0, result.err
    sandbox.assert_untouched()
