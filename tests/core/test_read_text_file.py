"""`files.read_text_file`: the one size-capped text reader, one line per way a named file is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import read_text_file


def _line(path: Path, limit: int = 8) -> str:
    with pytest.raises(WeightsmithError) as info:
        read_text_file(path, limit, "arms file")
    line = str(info.value)
    assert "\n" not in line and str(path) in line
    return line


def test_each_failure_is_one_line_naming_the_file(tmp_path: Path) -> None:
    assert "cannot read arms file: No such file or directory" in _line(tmp_path / "missing.toml")
    assert "cannot read arms file: is a directory, not a regular file" in _line(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "is a FIFO" in _line(fifo)  # never opened, so never a hang
    big = tmp_path / "big.toml"
    big.write_text("x" * 9)
    assert "arms file is larger than 8 bytes" in _line(big)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"ab\xe9")
    assert "arms file is not UTF-8 text (byte 2)" in _line(latin)


def test_a_file_at_the_limit_is_read_whole(tmp_path: Path) -> None:
    ok = tmp_path / "ok.toml"
    ok.write_text("é" * 4)
    assert read_text_file(ok, 8, "arms file") == "é" * 4


def test_a_recipe_is_read_through_it(tmp_path: Path) -> None:
    """`--recipe` keeps its cap and its error code; the failures are worded as every capped file's."""
    from weightsmith.quantization.recipe import MAX_RECIPE_BYTES, load_recipe

    big = tmp_path / "big.toml"
    big.write_text("#" * (MAX_RECIPE_BYTES + 1))
    with pytest.raises(WeightsmithError, match=f"recipe file is larger than {MAX_RECIPE_BYTES} bytes") as info:
        load_recipe(big)
    assert info.value.code == "recipe.invalid" and info.value.file == str(big)
    with pytest.raises(WeightsmithError, match="cannot read recipe file: No such file"):
        load_recipe(tmp_path / "missing.toml")
