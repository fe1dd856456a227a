"""A scale search is one registered class: a tiny example search, defined here and nowhere else, is taken by
`make_scheme`, refused where it does not apply, offered to GPTQ, compiled by the warm-up, named in the
command's help, written by the pipeline and described by the card, with no other module touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import weightsmith
from clirun import run
from synth import llama_tensors, write_checkpoint
from weightsmith.core.errors import WeightsmithError
from weightsmith.quantization import warm
from weightsmith.quantization.cli import _search_help
from weightsmith.safetensors.reader import ShardReader
from weightsmith.schemes import int4 as int4_scheme
from weightsmith.schemes import make_scheme
from weightsmith.searches import SEARCHES, ClipSearch, gptq_starts, register, searches_for

NAME = "halfrange"
CARD = "each group's range is halved before its scale is computed (an example search)"


@pytest.fixture
def halfrange() -> Iterator[None]:
    @register
    class HalfRange(ClipSearch):
        NAME = NAME
        SCHEMES = ("w4a16",)
        HELP = "every group's range halved: an example"
        CARD = CARD

        def fill(self, x: np.ndarray, mode: int, group: int, symmetric: bool, shrink: np.ndarray) -> int:
            shrink.fill(0.5)
            return -1

    try:
        yield
    finally:
        del SEARCHES[NAME]


def test_an_unregistered_name_is_unknown() -> None:
    with pytest.raises(WeightsmithError, match=f"unknown scale search '{NAME}'"):
        make_scheme("w4a16", None, NAME)


def test_one_class_is_the_whole_search(halfrange: None, tmp_path: Path, capsys, monkeypatch) -> None:
    scheme = make_scheme("w4a16", 64, NAME)
    assert scheme.search is SEARCHES[NAME] and scheme.describe() == f"W4A16 g64, {NAME} scale search"
    with pytest.raises(WeightsmithError, match=f"--scale-search {NAME} is for w4a16; w4a16-asym takes wmse, mse"):
        make_scheme("w4a16-asym", 64, NAME)
    assert NAME in searches_for("w4a16") and NAME in gptq_starts()
    assert f"{NAME} (every group's range halved: an example)" in _search_help()
    assert make_scheme("w4a16", None, NAME) in warm._variants()

    src = write_checkpoint(tmp_path / "src", llama_tensors())
    request = weightsmith.QuantizeRequest(
        src, tmp_path / "out", scheme="w4a16", group_size=64, scale_search=NAME, pre_pass=None, workers=1
    )
    result = weightsmith.quantize(request)
    assert result.manifest.recipe.scale_search == NAME
    name = "model.layers.0.mlp.down_proj.weight"
    with ShardReader(src / "model.safetensors") as reader:
        w = reader.read(name)
    rows, cols = w.shape
    expected = int4_scheme.quantize(w, 64, True, shrink=np.full((rows, cols // 64), 0.5, np.float32))
    with ShardReader(tmp_path / "out" / "model.safetensors") as reader:
        packed = reader.read(name.removesuffix(".weight") + ".weight_packed")
        scale = reader.read(name.removesuffix(".weight") + ".weight_scale")
    assert np.array_equal(packed, expected.packed) and np.array_equal(scale, expected.scale)
    plain = int4_scheme.quantize(w, 64, True)
    assert not np.array_equal(scale, plain.scale)  # the search did something: half the plain scale

    code, _, err = run(capsys, monkeypatch, "card", tmp_path / "out")
    assert code == 0, err
    assert CARD in (tmp_path / "out" / "README.md").read_text()
