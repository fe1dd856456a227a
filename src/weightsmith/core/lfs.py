"""Recognise git-LFS pointer files posing as shards, indexes or configs.

A repository cloned without `git lfs pull` (or a file fetched from a `blob/` link instead of a
`resolve/` link) leaves a ~130-byte text file where a multi-GB shard should be. Readers then fail
with baffling messages ("header too large"); we name the real cause instead.
Spec: git-lfs `docs/spec.md` and `lfs/pointer.go`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSIONS = (
    b"version https://git-lfs.github.com/spec/v1\n",
    b"version http://git-media.io/v/2\n",
    b"version https://hawser.github.com/spec/v1\n",
)
MAX_POINTER_BYTES = 1024
_OID = re.compile(rb"^oid sha256:([0-9a-f]{64})$", re.MULTILINE)
_SIZE = re.compile(rb"^size (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class LfsPointer:
    """What a pointer says about the file it stands for."""

    oid: str
    size: int


def parse_pointer(data: bytes) -> LfsPointer | None:
    """The pointer described by `data`, or None if `data` is not a git-LFS pointer."""
    if len(data) >= MAX_POINTER_BYTES or not data.startswith(_VERSIONS):
        return None
    oid, size = _OID.search(data), _SIZE.search(data)
    if oid is None or size is None:
        return None
    return LfsPointer(oid.group(1).decode(), int(size.group(1)))


def pointer_message(pointer: LfsPointer) -> str:
    """One sentence a person can act on."""
    return (
        f"is a git-LFS pointer, not the real file (it stands for {pointer.size:,} bytes, "
        f"sha256 {pointer.oid[:12]}...); download the real file (`git lfs pull`, or the hub's "
        "resolve/ link rather than blob/)"
    )
