"""`files.read_text_file`: the one size-capped text reader, one line per way a named file is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weightsmith.errors import WeightsmithError
from weightsmith.files import read_text_file


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
