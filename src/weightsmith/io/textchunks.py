"""Whether two texts share passages, told from a short record of one of them: hashes of its chunks.

A model scored on the text it was calibrated on looks better than it is. A calibration record
(`Provenance.text_chunks`) keeps the hashes of its text's chunks, not the text, so `eval` can cut
its own text the same way and count the characters in chunks both have.

Chunks are cut by content, not by offset: a chunk ends after a line whose hash is a multiple of
BOUNDARY once it holds MIN_CHARS characters (or at MAX_CHARS). A passage therefore cuts into the same
chunks wherever it stands, after the first boundary inside it: a text that holds a calibration file
at any offset shares that file's chunks. A chunk is hundreds of characters of consecutive lines, so
two unrelated texts that both have common short lines (`return None`) share none. Lines are compared
without trailing spaces and blank lines are left out, so line endings and blank lines do not count.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

#: The first word of a record: how its chunks were cut. A record of another form is not compared.
FORM = "lines-v1"
#: A chunk ends after a line whose 64-bit hash this divides, once it holds MIN_CHARS characters:
#: about 500 characters a chunk, 3 in eval's default 512 tokens, 17 bytes of record per chunk.
BOUNDARY = 8
MIN_CHARS = 256
#: A chunk ends here whatever its lines (a long file without a boundary line, minified text).
MAX_CHARS = 4096
_HASH = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class Chunk:
    digest: str  # 16 hex digits
    chars: int  # characters of its lines, trailing spaces left out


def chunks(text: str) -> list[Chunk]:
    """`text` cut into content-defined chunks (see the module's docstring), in order."""
    out: list[Chunk] = []
    digest, chars = hashlib.blake2b(digest_size=8), 0
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        line_hash = hashlib.blake2b(line.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        digest.update(line_hash)
        chars += len(line)
        if chars >= MAX_CHARS or (chars >= MIN_CHARS and int.from_bytes(line_hash, "big") % BOUNDARY == 0):
            out.append(Chunk(digest.hexdigest(), chars))
            digest, chars = hashlib.blake2b(digest_size=8), 0
    if chars:
        out.append(Chunk(digest.hexdigest(), chars))
    return out


def record(text: str) -> str:
    """What a calibration record keeps of `text`: FORM, then each chunk's hash, space-separated."""
    return " ".join([FORM, *(c.digest for c in chunks(text))])


def read_record(kept: str) -> frozenset[str] | None:
    """The chunk hashes of a `record`, or None when it is not one this version reads."""
    form, *digests = kept.split(" ")
    if form != FORM or not all(_HASH.fullmatch(d) for d in digests):
        return None
    return frozenset(digests)


@dataclass(frozen=True)
class Shared:
    """How much of a text lies in chunks a record also has."""

    chars: int  # characters of the text in shared chunks
    total: int  # characters of the text in all its chunks
    chunks: int  # shared chunks of the text

    @property
    def fraction(self) -> float:
        return self.chars / self.total if self.total else 0.0


def shared(text: str, digests: frozenset[str]) -> Shared:
    """How much of `text` is in chunks whose hashes are `digests` (`read_record` of another text)."""
    cut = chunks(text)
    common = [c for c in cut if c.digest in digests]
    return Shared(sum(c.chars for c in common), sum(c.chars for c in cut), len(common))
