"""Hostile `--scale-search` and recipe `scale_search` values: one line, exit 2, nothing written.

`none` (plain round-to-nearest) is a name like the searches, spelled exactly; the default search is
no licence for GPTQ to take a named one.
"""

from __future__ import annotations

import pytest

from hostile.harness import Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint

TINY = dict(LLAMA_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=64, num_hidden_layers=1)  # fmt: skip


def _refused(sandbox: Sandbox, capsys, monkeypatch, *extra: object, recipe: str | None = None) -> str:
    """Run quantize on a tiny checkpoint: exit 2, one line, no output, nothing else touched."""
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY), TINY)
    if recipe is None:
        args: list[object] = ["--group-size", "32", *extra]
    else:  # a recipe sets the group size itself
        (sandbox.root / "recipe.toml").write_text(recipe)
        args = [*extra, "--recipe", sandbox.root / "recipe.toml"]
    sandbox.freeze()
    out = sandbox.root / "out"
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, *args)
    assert result.code == 2, result
    assert not out.exists()
    sandbox.assert_untouched()
    return result.error_line


@pytest.mark.parametrize("value", ["bogus", "NONE", "", "none "])
def test_unknown_search_names_the_choices(sandbox: Sandbox, capsys, monkeypatch, value: str) -> None:
    line = _refused(sandbox, capsys, monkeypatch, "--scale-search", value)
    assert f"unknown scale search {value!r} (choose from none, wmse, mse, noclip, hqq, memoryless_mse, qkx2)" in line


def test_none_with_a_recipe_is_refused_naming_the_recipe(sandbox: Sandbox, capsys, monkeypatch) -> None:
    line = _refused(sandbox, capsys, monkeypatch, "--scale-search", "none",
                    recipe="[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\n")  # fmt: skip
    assert "recipe.toml" in line and "--scale-search and --recipe both set the scheme" in line


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("'bogus'", "rule 1: unknown scale search 'bogus' (choose from none,"),
        ("3", "rule 1: scale_search must be a string"),
        ("'noclip'\nscheme = 'w4a16-asym'", "rule 1: scale_search noclip sets a symmetric scale"),
    ],
)
def test_recipe_search_is_one_line_naming_the_file_and_rule(
    sandbox: Sandbox, capsys, monkeypatch, value: str, message: str
) -> None:
    scheme = "" if "scheme" in value else "scheme = 'w4a16'\n"
    recipe = f"[[rule]]\ntargets = ['Linear']\n{scheme}scale_search = {value}\n"
    line = _refused(sandbox, capsys, monkeypatch, recipe=recipe)
    assert "recipe.toml" in line and message in line, line
