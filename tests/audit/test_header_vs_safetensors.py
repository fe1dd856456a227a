"""Our header parser against the real `safetensors` library, file by file.

The claim: whatever our parser rejects, the library rejects too, so `verify` never flags a file the
reference reader would load, except where we are deliberately stricter. Those exceptions are
asserted explicitly below: duplicate tensor names (the library silently keeps one) and a
`__metadata__` of `null` (the library treats it as absent).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from doctor_builders import raw_shard, tiny_moe, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from test_verify_corpus import CASES, LAYER1

from weightsmith.core.errors import HeaderError
from weightsmith.safetensors.dtypes import DTYPES
from weightsmith.safetensors.header import read_header

#: Corpus cases whose defect sits in one shard's bytes.
SHARD_CASES = [
    c
    for c in CASES
    if next(iter(c.errors), "").startswith(("header.", "offsets.", "size.")) or c.id == "lfs-pointer/shard"
]


def library_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="np") as f:
            f.keys()
    except Exception:
        return False
    return True


def ours_accepts(path: Path) -> bool:
    try:
        read_header(path)
    except HeaderError:
        return False
    return True


def test_the_corpus_covers_every_header_rule() -> None:
    codes = {code for c in SHARD_CASES for code in c.errors}
    assert codes >= {
        "header.too-small", "header.too-large", "header.truncated", "header.not-utf8", "header.not-json",
        "header.duplicate-name", "header.metadata", "header.entry", "header.dtype", "header.misaligned",
        "header.size-mismatch", "offsets.gap", "offsets.overlap", "size.truncated", "size.trailing", "lfs-pointer",
    }  # fmt: skip


@pytest.mark.parametrize("case", SHARD_CASES, ids=repr)
def test_library_rejects_what_we_reject(case, tmp_path: Path) -> None:
    shard = case.make(tmp_path) / LAYER1
    assert not ours_accepts(shard)
    if case.id == "header.duplicate-name":
        assert library_accepts(shard), "safetensors started rejecting duplicate names; drop this exception"
    else:
        assert not library_accepts(shard), case.id


def test_both_accept_clean_shards(tmp_path: Path) -> None:
    root = write(tiny_moe(), tmp_path / "ckpt")
    for shard in root.glob("*.safetensors"):
        assert ours_accepts(shard) and library_accepts(shard)


ENTRY = '"dtype":"F32","shape":[1],"data_offsets":[0,4]'


@pytest.mark.parametrize(
    ("header", "code", "tensor"),
    [
        # JSON has no NaN or Infinity; Python's parser takes them, serde_json does not, wherever they are
        ('{"a":{' + ENTRY + ',"amax":NaN}}', "header.not-json", None),
        ('{"a":{' + ENTRY + ',"amax":Infinity}}', "header.not-json", None),
        ('{"a":{' + ENTRY + ',"amax":-Infinity}}', "header.not-json", None),
        ('{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', "header.not-json", None),
        ('{"__metadata__":{"n":NaN},"a":{' + ENTRY + "}}", "header.not-json", None),
        # half a surrogate pair: Python decodes it to a lone surrogate, serde_json refuses it
        (r'{"a\ud800":{' + ENTRY + "}}", "header.entry", r"a\ud800"),
        (r'{"a\udfff":{' + ENTRY + "}}", "header.entry", r"a\udfff"),
        (r'{"a\udc00\ud800":{' + ENTRY + "}}", "header.entry", r"a\udc00\ud800"),  # a pair in the wrong order
        (r'{"a\uD800b":{' + ENTRY + "}}", "header.entry", r"a\ud800b"),
        (r'{"a":{' + ENTRY + r',"note\ud800":"x"}}', "header.entry", "a"),
        (r'{"a":{' + ENTRY + r',"note":["\udbff"]}}', "header.entry", "a"),
        (r'{"__metadata__":{"k\ud800":"v"},"a":{' + ENTRY + "}}", "header.metadata", None),
        (r'{"__metadata__":{"format":"pt\udc00"},"a":{' + ENTRY + "}}", "header.metadata", None),
        (r'{"a\ud800":{' + ENTRY + r'},"a\ud800":{' + ENTRY + "}}", "header.duplicate-name", r"a\ud800"),
        # serde_json reads -0 as the float -0.0, and a shape or offset must fit a u64
        ('{"a":{' + ENTRY + '},"z":{"dtype":"F32","shape":[-0,1],"data_offsets":[4,4]}}', "header.entry", "z"),
        ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[-0,4]}}', "header.entry", "a"),
        (
            '{"a":{' + ENTRY + '},"z":{"dtype":"F32","shape":[18446744073709551616,0],"data_offsets":[4,4]}}',
            "header.entry",
            "z",
        ),
    ],
)
def test_library_rejects_non_finite_literals_and_lone_surrogates(
    header: str, code: str, tensor: str | None, tmp_path: Path
) -> None:
    shard = raw_shard(tmp_path / "x.safetensors", header, b"\0" * 4)
    with pytest.raises(HeaderError) as err:
        read_header(shard)
    # a lone surrogate in a name is shown escaped, so that the error can be printed
    assert (err.value.code, err.value.tensor) == (code, tensor)
    str(err.value).encode("utf-8")
    assert not library_accepts(shard)


@pytest.mark.parametrize(
    "header",
    [
        r'{"a\ud83d\ude00":{' + ENTRY + "}}",  # a whole surrogate pair is one character
        r'{"a\\ud800":{' + ENTRY + "}}",  # an escaped backslash, then the letters ud800
        '{"__metadata__":{"amax":"NaN"},"a":{' + ENTRY + ',"note":"Infinity"}}',
        '{"a":{' + ENTRY + ',"note":-0}}',  # -0 outside shape and offsets is ignored by both
        '{"a-0":{' + ENTRY + "}}",
        '{"a":{' + ENTRY + '},"z":{"dtype":"F32","shape":[18446744073709551615,0],"data_offsets":[4,4]}}',  # u64 max
    ],
)
def test_both_accept_what_only_looks_like_those(header: str, tmp_path: Path) -> None:
    shard = raw_shard(tmp_path / "x.safetensors", header, b"\0" * 4)
    assert ours_accepts(shard) and library_accepts(shard)


def test_documented_difference_null_metadata(tmp_path: Path) -> None:
    shard = raw_shard(
        tmp_path / "n.safetensors",
        '{"__metadata__":null,"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        b"\0" * 4,
    )
    assert library_accepts(shard) and not ours_accepts(shard)


# --- generated headers: the same claim over many variations of a valid file ---

VALID_DTYPES = sorted(DTYPES)


@st.composite
def shard_files(draw: st.DrawFn) -> tuple[bytes, str]:
    """A header built from random entries, perhaps made invalid in one of many ways, plus its data."""
    count = draw(st.integers(0, 4))
    names = draw(
        st.lists(
            st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), min_size=1, max_size=8),
            min_size=count,
            max_size=count,
            unique=True,
        )
    )
    doc: dict[str, object] = {}
    if draw(st.booleans()):
        doc["__metadata__"] = draw(
            st.one_of(
                st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
                st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2),
            )
        )
    cursor = 0
    for name in names:
        dtype = draw(st.sampled_from([*VALID_DTYPES, "I4", "F8_E4M3FN", "bf16"]))
        shape = draw(st.lists(st.integers(0, 6), max_size=3))
        bits = DTYPES[dtype].bits if dtype in DTYPES else 8
        size = -(-(bits * _prod(shape)) // 8)
        begin = cursor + draw(st.sampled_from([0, 0, 0, 1, -1]))
        end = begin + size + draw(st.sampled_from([0, 0, 0, 1, -1]))
        cursor = max(cursor, end)
        entry: dict[str, object] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        if draw(st.integers(0, 9)) == 0:
            entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(
                st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.floats(allow_nan=False))
            )
        doc[name] = entry
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    text = draw(st.sampled_from(["", " ", "\n  "])) + text + " " * draw(st.integers(0, 8))
    data = b"\x01" * max(0, cursor + draw(st.sampled_from([0, 0, 0, 2, -2])))
    return data, text


def _prod(shape: list[int]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(shard_files())
def test_generated_files_library_rejects_what_we_reject(case: tuple[bytes, str]) -> None:
    data, text = case
    with tempfile.TemporaryDirectory() as tmp:
        path = raw_shard(Path(tmp) / "g.safetensors", text.encode("utf-8", "surrogatepass"), data)
        ours = ours_accepts(path)
        if not ours:
            assert not library_accepts(path), text


#: Characters for names and strings that may hold halves of surrogate pairs (no astral characters,
#: so that two distinct drawn names never decode to the same one).
TRICKY = st.text(st.sampled_from(["a", "é", "\\", '"', "\ud800", "\udbff", "\udc00", "\udfff"]), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(
    st.lists(TRICKY, min_size=1, max_size=3, unique=True),
    st.one_of(st.none(), TRICKY),
    st.sampled_from([None, float("nan"), float("inf"), float("-inf"), 0.5, "\ud800", "ok"]),
    st.booleans(),
)
def test_generated_surrogates_and_constants_we_agree_with_the_library(
    names: list[str], meta: str | None, extra: object, ascii_only: bool
) -> None:
    doc: dict[str, object] = {} if meta is None else {"__metadata__": {"format": meta}}
    for i, name in enumerate(names):
        doc[name] = {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        if extra is not None:
            doc[name]["note"] = extra
    text = json.dumps(doc, ensure_ascii=ascii_only)
    with tempfile.TemporaryDirectory() as tmp:
        path = raw_shard(Path(tmp) / "g.safetensors", text.encode("utf-8", "surrogatepass"), b"\0" * 4 * len(names))
        assert ours_accepts(path) == library_accepts(path), text
