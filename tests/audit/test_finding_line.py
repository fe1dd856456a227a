"""A finding's line is printed to a terminal: a hostile tensor name must not act on it."""

from __future__ import annotations

from weightsmith.audit.findings import ERROR, Finding


def test_finding_line_escapes_control_characters_in_names() -> None:
    f = Finding("bad-shape", ERROR, "shape is wrong", "model.safetensors", "w\x1b[31m\nx")
    line = f.line()
    assert "\x1b" not in line and "\n" not in line
    assert line == "model.safetensors: tensor 'w\\x1b[31m\\nx': shape is wrong"
