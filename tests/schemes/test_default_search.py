"""The default scale search: wmse for w4a16 and w4a16-asym, round-to-nearest for every other scheme.

`--scale-search none` (recipe `scale_search = "none"`, API `scale_search="none"`) is plain
round-to-nearest, the bytes of llm-compressor's `model_free_ptq` (tests/quantize/test_reference_llmcompressor.py
checks those bytes). GPTQ starts from the same grid: the default search's unless one is named
(`none`: llm-compressor's GPTQ grid); memoryless_mse, whose factors need a first pass, is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import weightsmith
from clirun import one_error_line, run
from synth import llama_tensors, write_checkpoint
from weightsmith.core.errors import WeightsmithError
from weightsmith.quantization.request import GptqOptions, gptq_options, rules_for
from weightsmith.safetensors.reader import ShardReader
from weightsmith.schemes import REGISTRY, make_scheme
from weightsmith.schemes import int4 as int4_scheme
from weightsmith.schemes.int4 import Int4
from weightsmith.searches import NONE

INT4 = ("w4a16", "w4a16-asym")
SHARD = "model.safetensors"


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-shaped weights with a few outliers per row, as trained weights have: clipping pays there."""
    tensors = llama_tensors(seed=5)
    rng = np.random.default_rng(5)
    for name, w in tensors.items():
        if name.endswith("_proj.weight"):
            x = w.astype(np.float32)
            x[rng.random(x.shape) < 0.01] *= 6.0
            tensors[name] = x.astype(ml_dtypes.bfloat16)
    return write_checkpoint(tmp_path_factory.mktemp("default") / "src", tensors)


def _quantize(src: Path, out: Path, scheme: str, search: str | None) -> Path:
    weightsmith.quantize(
        weightsmith.QuantizeRequest(src, out, scheme=scheme, scale_search=search, workers=1, hash_sources=False)
    )
    return out


def test_the_default_lives_on_the_int4_scheme() -> None:
    assert Int4.DEFAULT_SEARCH == "wmse"
    for name in INT4:
        assert make_scheme(name).scale_search == Int4.DEFAULT_SEARCH
        assert make_scheme(name, 64, NONE).scale_search is None
        assert make_scheme(name, 64, NONE) == make_scheme(name, 64, NONE)
        assert make_scheme(name).describe().endswith(", wmse scale search")
        assert "scale search" not in make_scheme(name, None, NONE).describe()


@pytest.mark.parametrize("name", [n for n in REGISTRY if n not in INT4])
def test_other_schemes_default_to_round_to_nearest_and_take_none(name: str) -> None:
    default = make_scheme(name)
    assert default.scale_search is None
    assert make_scheme(name, None, NONE) == default  # `none` is accepted, and means their RTN


def test_an_unknown_search_names_none_among_the_choices() -> None:
    with pytest.raises(WeightsmithError, match=r"choose from none, wmse, mse"):
        make_scheme("w4a16", None, "bogus")


@pytest.mark.parametrize("scheme", INT4)
def test_default_output_is_wmse_and_none_is_plain_rtn(src: Path, tmp_path: Path, scheme: str) -> None:
    default = _quantize(src, tmp_path / "default", scheme, None)
    wmse = _quantize(src, tmp_path / "wmse", scheme, "wmse")
    plain = _quantize(src, tmp_path / "none", scheme, NONE)
    assert (default / SHARD).read_bytes() == (wmse / SHARD).read_bytes()
    assert (default / SHARD).read_bytes() != (plain / SHARD).read_bytes()
    searches = {p.name: json.loads((p / "weightsmith.json").read_text())["recipe"]["scale_search"]
                for p in (default, wmse, plain)}  # fmt: skip
    assert searches == {"default": "wmse", "wmse": "wmse", "none": None}

    # `none` is round-to-nearest: each module decodes to int4's RTN of its source weight
    symmetric = scheme == "w4a16"
    module = "model.layers.0.mlp.down_proj"
    with ShardReader(src / SHARD) as r:
        w = r.read(f"{module}.weight")
    with ShardReader(plain / SHARD) as r:
        params = {p: r.read(f"{module}.{p}") for p in ("weight_packed", "weight_scale", "weight_zero_point")
                  if f"{module}.{p}" in r.header.tensors}  # fmt: skip
    rtn = int4_scheme.quantize(w, 128, symmetric)
    assert np.array_equal(params["weight_packed"], rtn.packed)
    assert np.array_equal(params["weight_scale"].view(np.uint16), rtn.scale.view(np.uint16))
    if not symmetric:
        assert np.array_equal(params["weight_zero_point"], rtn.zero_point)


def test_the_card_names_the_search_used(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    for search, words in ((None, "`wmse`"), (NONE, "none: plain round-to-nearest")):
        out = tmp_path / str(search)
        args = ("--scale-search", search) if search else ()
        code, _, err = run(capsys, monkeypatch, "quantize", src, out, *args, "--no-hash")
        assert code == 0, err
        assert run(capsys, monkeypatch, "card", out)[0] == 0
        line = next(x for x in (out / "README.md").read_text().splitlines() if x.startswith("- **Scale search**"))
        assert words in line, line


def test_none_round_trips_through_the_cli_and_a_recipe(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """`--scale-search none`, a recipe's `scale_search = "none"` and the API's `scale_search="none"` write
    the same bytes; a recipe rule without the key takes the default, as `--scheme` does."""
    api = _quantize(src, tmp_path / "api", "w4a16", NONE)
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "cli", "--scheme", "w4a16",
                       "--scale-search", "none", "--no-hash")  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "cli" / SHARD).read_bytes() == (api / SHARD).read_bytes()
    for key, reference in (('scale_search = "none"\n', api), ("", _quantize(src, tmp_path / "dflt", "w4a16", None))):
        recipe = tmp_path / "recipe.toml"
        recipe.write_text(f"[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\n{key}")
        out = tmp_path / f"recipe{len(key)}"
        code, _, err = run(capsys, monkeypatch, "quantize", src, out, "--recipe", recipe, "--no-hash")
        assert code == 0, err
        assert (out / SHARD).read_bytes() == (reference / SHARD).read_bytes()


def test_gptq_starts_from_the_searched_grid(tmp_path: Path) -> None:
    """GPTQ's schemes are those of a plain run: the default search's grid (its clip factors travel with
    it), round-to-nearest's with `none`; memoryless_mse, which needs a first pass, has no grid and is refused."""
    x = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)
    for search in (None, "wmse", "mse", "noclip"):
        scheme = rules_for("w4a16", None, search, None, gptq=True).rules[0].scheme
        grid = scheme.grid(x)
        assert scheme.scale_search == (search or "wmse")
        assert grid is not None and grid.shrink is not None and not np.all(grid.shrink == 1)
    plain = rules_for("w4a16", None, NONE, None, gptq=True).rules[0].scheme.grid(x)
    assert plain is not None and plain.shrink is None
    assert rules_for("w4a16", None, "memoryless_mse", None).rules[0].scheme.grid(x) is None
    for search in (None, NONE, "wmse", "mse", "noclip"):
        assert gptq_options("gptq", GptqOptions(tokens=64, seq_len=32, dampening=0.01), search) is not None
    with pytest.raises(WeightsmithError, match="does not take --scale-search memoryless_mse"):
        gptq_options("gptq", GptqOptions(tokens=64, seq_len=32, dampening=0.01), "memoryless_mse")


def test_gptq_dry_run_plans_the_same_grids(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """What a GPTQ run would do: every module planned as the plain run plans it, search included."""
    reasons = {}
    for method in ("rtn", "gptq"):
        code, out, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "o", "--method", method, "--dry-run",
                             "--json", "--scheme", "w4a16", "--pre-pass", "none")  # fmt: skip
        assert code == 0, err
        reasons[method] = {t["reason"] for t in json.loads(out)["tensors"] if t["action"] == "quantize"}
    assert reasons["rtn"] == reasons["gptq"] == {"Linear weight -> W4A16 g128, wmse scale search"}


def test_gptq_refuses_a_recipe_rule_naming_memoryless_mse(src: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """A recipe's explicit `scale_search = "memoryless_mse"` is refused under GPTQ as the flag is, not
    silently planned without a grid; `"none"` and the other searches stay accepted."""
    recipe = tmp_path / "r.toml"
    rule = "[[rule]]\ntargets = ['Linear']\nscheme = 'w4a16'\n"
    recipe.write_text(rule + "\n[[rule]]\ntargets = ['re:.*']\nscheme = 'w4a16'\nscale_search = 'memoryless_mse'\n")
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "o", "--method", "gptq", "--recipe", recipe,
                       "--dry-run")  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and str(recipe) in line and "rule 2: --method gptq" in line
    assert "scale_search = 'memoryless_mse'" in line
    recipe.write_text(rule + "\n[[rule]]\ntargets = ['re:.*']\nscheme = 'w4a16'\nscale_search = 'mse'\n")
    assert rules_for(None, None, None, recipe, gptq=True).rules[1].scheme.scale_search == "mse"
    recipe.write_text(rule + "scale_search = 'none'\n")
    assert rules_for(None, None, None, recipe, gptq=True).rules[0].scheme.scale_search is None
