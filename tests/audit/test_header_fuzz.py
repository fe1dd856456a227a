"""Property tests of the header parser: any bytes give a header or a HeaderError, never anything else.

Three sources of input: arbitrary bytes; a plausible length prefix followed by JSON-ish text; and
random corruptions (byte flips, cuts, extensions) of a real shard. Each example must finish within
the deadline, so a hang (or a quadratic blow-up) fails the test.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path

from doctor_builders import tiny_moe, write_shard
from hypothesis import given, settings
from hypothesis import strategies as st

from weightsmith.core.errors import HeaderError
from weightsmith.safetensors.header import Header, parse_header, read_header

FUZZ = settings(max_examples=400, deadline=timedelta(seconds=2), database=None)
PATH = Path("fuzz.safetensors")


def parses_or_header_error(data: bytes) -> None:
    try:
        header = parse_header(PATH, data, len(data))
    except HeaderError as exc:
        assert exc.code and str(exc).startswith(str(PATH))
        return
    assert isinstance(header, Header)
    assert header.file_size == len(data)


def _valid_shard() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_moe(layers=1, experts=1, hidden=32, moe_intermediate=16, dense_intermediate=16, vocab=16)
        tensors = {n: a for n, a in list(model.tensors.items())[:12]}
        return write_shard(Path(tmp) / "v.safetensors", tensors, {"format": "pt"}).read_bytes()


VALID = _valid_shard()
JSONISH = st.text(alphabet=st.sampled_from(list('{}[]":,. 0123456789-eE_abcdefnrstuxFIUBOL\\\n\t')), max_size=300)


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data: bytes) -> None:
    parses_or_header_error(data)


@FUZZ
@given(JSONISH, st.integers(-8, 8), st.binary(max_size=64))
def test_length_prefix_and_jsonish_text(text: str, length_delta: int, tail: bytes) -> None:
    body = text.encode()
    n = max(0, len(body) + length_delta)
    parses_or_header_error(n.to_bytes(8, "little") + body + tail)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=6), st.integers(-64, 64))
def test_corrupted_real_shard(flips: list[tuple[int, int]], resize: int) -> None:
    data = bytearray(VALID)
    for pos, value in flips:
        data[pos] = value
    data = data[:resize] if resize < 0 else data + bytes(resize)
    parses_or_header_error(bytes(data))


def test_the_valid_shard_parses() -> None:
    assert len(parse_header(PATH, VALID, len(VALID)).tensors) == 12


@settings(max_examples=60, deadline=timedelta(seconds=2), database=None)
@given(st.binary(max_size=512))
def test_read_header_on_files(tmp_path_factory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    path.write_bytes(data)
    with contextlib.suppress(HeaderError):
        read_header(path)


def test_deep_nesting_is_a_header_error() -> None:
    body = b'{"a":' * 50_000
    try:
        parse_header(PATH, len(body).to_bytes(8, "little") + body, 8 + len(body))
    except HeaderError as exc:
        assert exc.code == "header.not-json"
    else:
        raise AssertionError("accepted")
