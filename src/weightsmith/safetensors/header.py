"""Strict safetensors header parsing.

The format (huggingface/safetensors README, `tensor.rs`): an 8-byte little-endian header length N,
N bytes of JSON mapping names to `{dtype, shape, data_offsets}` plus an optional string-to-string
`__metadata__`, then the data buffer. We enforce every rule the reference reader enforces, and
some it lets slip (duplicate names, which it silently collapses), before any offset is trusted.
Its JSON parser (serde_json) is stricter than Python's: anywhere in the header it refuses the
`NaN`/`Infinity` literals and an escaped half of a UTF-16 surrogate pair without its other half
(Python decodes it to a lone surrogate, which is not Unicode text), so we refuse both too.
Each violation raises `HeaderError` with a stable `code`, naming the file and tensor.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from weightsmith.core.errors import HeaderError
from weightsmith.core.files import NotRegularFile, open_regular
from weightsmith.core.lfs import parse_pointer, pointer_message
from weightsmith.safetensors.dtypes import DTYPES, DType

#: The reference reader's limit (`MAX_HEADER_SIZE` in tensor.rs).
MAX_HEADER_BYTES = 100_000_000
#: Tensors a checkpoint may hold, over all its shards. Every tensor costs Python objects (its
#: entry, its plan decision) of several hundred bytes against ~70 bytes of header, so a header of
#: a million one-byte tensors once took gigabytes; the largest real checkpoints hold about 250,000
#: (a 223 GB MoE: 109,345). Counted from the header text before it is parsed, so a header over the
#: limit costs its bytes and nothing more. Callers reading several shards pass what is left.
MAX_TENSORS = 500_000
METADATA_KEY = "__metadata__"
#: A `\uD800`-`\uDFFF` escape: the only way a lone surrogate gets into the parsed header (raw
#: surrogate bytes are not UTF-8). Headers without one skip the string-by-string search.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_U64_MAX = 2**64 - 1


@dataclass(slots=True)
class TensorInfo:
    """One tensor's entry: where its bytes are and what they mean."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int  # relative to the data buffer
    end: int
    data_start: int  # absolute file offset of the data buffer

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def offset(self) -> int:
        """Absolute file offset of the first byte."""
        return self.data_start + self.begin


@dataclass(frozen=True)
class Header:
    """A validated header: tensors in file order, metadata, and where the data buffer lies."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    header_len: int = 0
    #: Bytes of the data buffer: where the last tensor ends (offsets are contiguous from 0).
    data_len: int = 0

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def file_size(self) -> int:
        """The file size the header declares."""
        return self.data_start + self.data_len


def _fail(path: Path, code: str, message: str, tensor: str | None = None) -> HeaderError:
    return HeaderError(message, file=path, tensor=tensor, code=code)


def _printable(text: str) -> str:
    """`text` with any lone surrogate written as its escape, so that it can be printed and encoded."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _no_duplicates(path: Path) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        doc = dict(pairs)
        if len(doc) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise _fail(path, "header.duplicate-name", "appears twice in the header", _printable(key))
                seen.add(key)
        return doc

    return hook


class _NegativeZero(int):
    """The literal -0: serde_json reads it as the float -0.0, so it is not a shape or an offset."""


def _int_or_negative_zero(literal: str) -> int:
    return _NegativeZero(0) if literal == "-0" else int(literal)


def _no_constants(path: Path) -> Callable[[str], object]:
    def hook(literal: str) -> object:
        raise _fail(path, "header.not-json", f"header is not valid JSON ({literal} is not a JSON value)")

    return hook


def _has_lone_surrogate(value: object) -> bool:
    """True when a string anywhere in `value` (object keys included) holds a lone UTF-16 surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _no_lone_surrogates(path: Path, doc: dict[str, object]) -> None:
    """Refuse a lone surrogate in a tensor name, its entry or `__metadata__`, naming where it is.

    Names are reported with the surrogate escaped (`a\\ud800`), so that the error can be printed.
    """
    why = "a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which the reference reader refuses"
    for key, value in doc.items():
        if key == METADATA_KEY:
            if _has_lone_surrogate(value):
                raise _fail(path, "header.metadata", f"__metadata__ holds {why}")
        elif _has_lone_surrogate(key):
            raise _fail(path, "header.entry", f"the name holds {why}", _printable(key))
        elif _has_lone_surrogate(value):
            raise _fail(path, "header.entry", f"entry holds {why}", key)


def _without_duplicates(text: str) -> dict[str, object] | None:
    """The decoded header when it is a JSON object without a repeated key in any object, else None.

    The plain decoder, with no Python call per object, then a count that proves no key repeats:
    each member of an object is written with one `:` outside strings, so when the members of the
    top-level object and of the objects it holds add up to every `:` in the text, no object lost a
    member to a repeated key (and none deeper has members at all). A `:` inside a name only makes
    the count disagree, which sends the header to `_strict_json`.
    """
    try:
        doc = json.loads(text, parse_constant=_refuse, parse_int=_int_or_negative_zero if "-0" in text else None)
    except (ValueError, RecursionError):  # JSONDecodeError, or a NaN/Infinity literal
        return None
    if type(doc) is not dict:
        return None
    members = len(doc)
    for value in doc.values():
        if type(value) is dict:
            members += len(value)
    return doc if members == text.count(":") else None


def _refuse(literal: str) -> object:
    raise ValueError(literal)


def _strict_json(path: Path, text: str) -> object:
    """Decode with a hook on every object that names a repeated key; one line for any other fault."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates(path),
            parse_constant=_no_constants(path),
            # a hook on every integer costs time; only a header that holds "-0" somewhere needs it
            parse_int=_int_or_negative_zero if "-0" in text else None,
        )
    except HeaderError:
        raise
    except (json.JSONDecodeError, RecursionError) as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise _fail(path, "header.not-json", f"header is not valid JSON ({msg})") from None
    except ValueError:  # the only other thing json.loads raises: an integer longer than Python will convert
        raise _fail(path, "header.not-json", "header is not valid JSON (an integer of more than 4300 digits)") from None


def _by_offsets(t: TensorInfo) -> tuple[int, int]:
    return t.begin, t.end


def parse_header(path: Path, prefix: bytes, file_size: int, max_tensors: int = MAX_TENSORS) -> Header:
    """Validate a header given the file's first bytes (at least 8 + N of them) and its size.

    `max_tensors` is how many tensors the file may hold (what is left of `MAX_TENSORS` when the
    checkpoint's other shards were read first).
    """
    if len(prefix) < 8:
        pointer = parse_pointer(prefix)
        if pointer is not None:
            raise _fail(path, "lfs-pointer", pointer_message(pointer))
        raise _fail(path, "header.too-small", f"is {file_size} bytes, too small for a safetensors file")
    pointer = parse_pointer(prefix[:1024])
    if pointer is not None:
        raise _fail(path, "lfs-pointer", pointer_message(pointer))
    n = int.from_bytes(prefix[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise _fail(path, "header.too-large", f"declares a {n:,}-byte header (limit {MAX_HEADER_BYTES:,})")
    if 8 + n > file_size:
        raise _fail(path, "header.truncated", f"declares a {n:,}-byte header but the file has {file_size:,} bytes")
    declared = prefix.count(b'"data_offsets"', 8, 8 + n)  # one per tensor (a hostile name may add more)
    if declared > max_tensors:
        raise _fail(
            path,
            "header.too-many-tensors",
            f"declares about {declared:,} tensors, over the limit of {max_tensors:,} "
            f"({MAX_TENSORS:,} per checkpoint; the largest real checkpoints hold about 250,000)",
        )
    raw = prefix[8 : 8 + n]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, "header.not-utf8", f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.lstrip(" \t\r\n").startswith("{"):
        raise _fail(path, "header.not-json", "header does not start with a JSON object")
    doc: object = _without_duplicates(text)
    if doc is None:  # a duplicate name or key, or not JSON: the strict decoder says which, and where
        doc = _strict_json(path, text)
    if not isinstance(doc, dict):
        raise _fail(path, "header.not-json", "header is not a JSON object")
    if _SURROGATE_ESCAPE.search(text):
        _no_lone_surrogates(path, doc)

    metadata = doc.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _fail(path, "header.metadata", "__metadata__ must map strings to strings")

    data_start = 8 + n
    entries: list[TensorInfo] = []
    # This loop runs once per tensor, 100k+ times on a large MoE: the checks are written out inline,
    # with the names they use bound locally, as a function call per check would double its cost.
    append, dtypes, u64 = entries.append, DTYPES, _U64_MAX
    in_order, last = True, (0, 0)  # writers list tensors in offset order: then no sort is needed
    for name, entry in doc.items():
        if type(entry) is not dict:
            raise _fail(path, "header.entry", "entry is not an object", name)
        code = entry.get("dtype")
        dtype = dtypes.get(code) if type(code) is str else None
        if dtype is None:
            raise _fail(path, "header.dtype", f"unknown dtype {code!r}", name)
        # integers that fit a u64 (the reference reader's `usize`); `type(v) is int` also refuses
        # a `_NegativeZero`, as -0 fails the reference reader
        shape = entry.get("shape")
        numel = 1
        if type(shape) is list:
            for v in shape:
                if type(v) is not int or v < 0 or v > u64:
                    numel = -1
                    break
                numel *= v
        if type(shape) is not list or numel < 0:
            raise _fail(path, "header.entry", "shape must be a list of non-negative integers", name)
        offsets = entry.get("data_offsets")
        if type(offsets) is not list or len(offsets) != 2:
            begin = end = -1
        else:
            begin, end = offsets
        if type(begin) is not int or type(end) is not int or begin < 0 or end < begin or end > u64:
            raise _fail(path, "header.entry", "data_offsets must be [begin, end] with begin <= end", name)
        expected = dtype.nbytes(numel)
        if expected is None:
            raise _fail(path, "header.misaligned", f"{dtype.code} {shape} does not end on a byte boundary", name)
        if expected != end - begin:
            raise _fail(
                path,
                "header.size-mismatch",
                f"{dtype.code} {shape} needs {expected:,} bytes but data_offsets span {end - begin:,}",
                name,
            )
        append(TensorInfo(name, dtype, tuple(shape), begin, end, data_start))
        if in_order:
            in_order = last <= (begin, end)
            last = begin, end

    if not in_order:
        entries.sort(key=_by_offsets)
    cursor = 0
    for t in entries:
        if t.begin != cursor:
            if t.begin > cursor:
                raise _fail(
                    path, "offsets.gap", f"starts at {t.begin:,} but the previous tensor ends at {cursor:,}", t.name
                )
            raise _fail(
                path,
                "offsets.overlap",
                f"starts at {t.begin:,}, inside the previous tensor (ends at {cursor:,})",
                t.name,
            )
        cursor = t.end

    header = Header(path, {t.name: t for t in entries}, dict(metadata), n, cursor)
    if header.file_size > file_size:
        raise _fail(
            path,
            "size.truncated",
            f"is truncated: the header declares {header.file_size:,} bytes but the file has {file_size:,} "
            "(an interrupted download?)",
        )
    if header.file_size < file_size:
        raise _fail(
            path,
            "size.trailing",
            f"has {file_size - header.file_size:,} trailing bytes after the declared data end {header.file_size:,}",
        )
    return header


def read_header(path: str | os.PathLike[str], max_tensors: int = MAX_TENSORS) -> Header:
    """Read and validate the header of the safetensors file at `path` (symlinks are followed)."""
    path = Path(path)
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) == 8:
                n = int.from_bytes(head, "little")
                if n <= MAX_HEADER_BYTES and 8 + n <= size:
                    head += f.read(n)
                else:
                    head += f.read(1024 - 8)
    except FileNotFoundError:
        raise HeaderError("does not exist", file=path, code="file.missing") from None
    except NotRegularFile as exc:
        raise HeaderError(exc.strerror or str(exc), file=path, code="file.not-regular") from None
    except OSError as exc:
        raise HeaderError(f"cannot be read ({exc.strerror})", file=path, code="file.unreadable") from None
    return parse_header(path, head, size, max_tensors)
