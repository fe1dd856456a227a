"""Bad patterns wherever a module list is matched: `transplant --select`, `--ignore`, a recipe, a config's groups.

Every list goes through `targets.Targets`, so each is one line naming the entry and where it came
from, exit 2, no traceback, and nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostile.harness import Sandbox, copies, run_inprocess, tiny_pair

BAD = "re:("


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


def test_transplant_select_with_an_unclosed_group(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, quant = copies(sandbox, tiny)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "transplant", orig, quant, "--select", BAD)
    line = result.error_line
    assert result.code == 2 and "--select 're:('" in line and "not a valid regular expression" in line, line
    sandbox.assert_untouched()


def test_quantize_ignore_with_an_unclosed_group(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, _ = copies(sandbox, tiny)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", orig, sandbox.root / "out", "--ignore", BAD)
    line = result.error_line
    assert result.code == 2 and "--ignore 're:('" in line and "not a valid regular expression" in line, line
    sandbox.assert_untouched()
    assert not (sandbox.root / "out").exists()


@pytest.mark.parametrize("where", ["ignore", "target"])
def test_a_recipe_with_an_unclosed_group(sandbox: Sandbox, tiny, capsys, monkeypatch, where: str) -> None:
    orig, _ = copies(sandbox, tiny)
    recipe = sandbox.root / "recipe.toml"
    targets = [BAD] if where == "target" else ["Linear"]
    ignore = [BAD] if where == "ignore" else []
    recipe.write_text(f"ignore = {json.dumps(ignore)}\n[[rule]]\ntargets = {json.dumps(targets)}\nscheme = 'w4a16'\n")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", orig, sandbox.root / "out", "--recipe", recipe)
    line = result.error_line
    assert result.code == 2 and "recipe.toml" in line and "'re:('" in line, line
    assert ("rule 1: target" if where == "target" else "ignore") in line, line
    sandbox.assert_untouched()
    assert not (sandbox.root / "out").exists()


def test_eval_names_the_group_of_a_bad_target(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """The bad target sits in a second group: the line says which group holds it."""
    orig, quant = copies(sandbox, tiny)
    config = json.loads((quant / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    (first,) = groups.values()
    groups["extra"] = dict(first, targets=[BAD])
    (quant / "config.json").write_text(json.dumps(config))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "eval", orig, quant, "--no-logits")
    line = result.error_line
    assert result.code == 2 and "quant/config.json" in line and "config group 'extra' target 're:('" in line, line
    sandbox.assert_untouched()


def test_verify_reports_a_bad_ignore_pattern_as_a_finding(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """verify goes on: the bad entry is an error finding naming it, the rest of the config is still checked."""
    _, quant = copies(sandbox, tiny)
    config = json.loads((quant / "config.json").read_text())
    config["quantization_config"]["ignore"].append(BAD)
    (quant / "config.json").write_text(json.dumps(config))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "verify", quant)
    assert result.code == 1 and "'re:(' is not a valid regular expression" in result.out, result.out
    assert "Traceback" not in result.err
    sandbox.assert_untouched()
