"""Content-defined chunk hashes: a passage is found wherever it stands, unrelated text is not; and the
default texts of `eval` and of calibration never share a chunk, at any token count."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from weightsmith.io import textchunks, texts

STDLIB = Path(sysconfig.get_paths()["stdlib"])
DECODER = (STDLIB / texts.CODE_FIRST).read_text()


def _shared(text: str, calibration: str) -> textchunks.Shared:
    digests = textchunks.read_record(textchunks.record(calibration))
    assert digests is not None
    return textchunks.shared(text, digests)


def test_a_passage_is_found_at_any_offset_and_with_other_line_endings() -> None:
    alone = _shared(DECODER, DECODER)
    assert alone.chars == alone.total > 10_000 and alone.chunks == len(textchunks.chunks(DECODER))
    for before in ("", "x = 1\n", "# a note about the decoder that follows, and why it is here\n" * 13):
        found = _shared(before + DECODER.replace("\n", "\r\n") + "\n\ntrailing notes\n", DECODER)
        assert found.chars > 0.8 * len(DECODER.replace("\n", "").replace(" ", "")), before
    # the calibration text holds it after other files, as the built-in code would after another first file
    assert _shared(DECODER, (STDLIB / "abc.py").read_text() + "\n" + DECODER).chars > 0.8 * alone.total


def test_unrelated_code_shares_no_chunk_though_it_shares_common_lines() -> None:
    other = (STDLIB / "json" / "scanner.py").read_text() + "".join(
        f"def f{i}(x):\n    try:\n        return x[{i}]\n    except IndexError:\n        return None\n\n"
        for i in range(200)
    )
    common = {line.strip() for line in other.splitlines()} & {line.strip() for line in DECODER.splitlines()}
    assert len(common - {""}) >= 5  # `import re`, `try:`, `except IndexError:`, ...
    found = _shared(other, DECODER)
    assert found.chars == found.chunks == 0 and found.total > 0 and found.fraction == 0.0


def test_chunks_stay_within_their_bounds() -> None:
    """At least MIN_CHARS but the last; over MAX_CHARS only by the line that reached it."""
    cut = textchunks.chunks(DECODER + "\n" + "y" * 10_000 + "\nz = 1\n")
    assert all(c.chars >= textchunks.MIN_CHARS for c in cut[:-1]) and cut[-1].chars == len("z = 1")
    assert max(c.chars for c in cut[:-2]) < textchunks.MAX_CHARS + max(map(len, DECODER.splitlines()))
    assert cut[-2].chars >= 10_000
    assert textchunks.chunks("") == [] and textchunks.chunks("\n  \n") == []


@pytest.mark.parametrize(
    "kept",
    ["", "lines-v0 0123456789abcdef", "lines-v1 0123456789ABCDEF", "lines-v1 0123", "lines-v1  0123456789abcdef"],
)
def test_a_record_of_another_form_is_not_read(kept: str) -> None:
    assert textchunks.read_record(kept) is None


def test_a_record_of_an_empty_text_is_read_as_no_chunks() -> None:
    assert textchunks.read_record(textchunks.record("")) == frozenset()


def test_the_builtin_code_never_reads_evals_default_files() -> None:
    files = {p.resolve() for p in texts.builtin_files()}
    assert (STDLIB / texts.CODE_FIRST).resolve() in files
    assert not files & {(STDLIB / name).resolve() for name in texts.EVAL_FILES}
    assert texts.default_text().source.startswith(texts.EVAL_FILES[0] + " from Python ")


@pytest.mark.parametrize("builtin", texts.BUILTINS)
def test_evals_default_text_shares_no_chunk_with_any_builtin_at_the_most_tokens(builtin: str) -> None:
    """At MAX_TOKENS the built-in text is all of it; at fewer it is a prefix of those same files."""
    calibration = texts.builtin_text(builtin, texts.MAX_TOKENS).text
    default = texts.default_text().text
    found = _shared(default, calibration)
    assert found.chunks == 0 and found.total > 10_000
    assert default not in calibration and DECODER in texts.builtin_text("code", texts.MAX_TOKENS).text
