"""`card --check`: find every cited number in an existing card and compare it with its source now.

Beyond the cited values it compares what a reader copies whole: the front matter as
`huggingface_hub` reads it, and the commands in the card's code blocks. It also fails on any local
absolute path in the card or in the files the card wrote beside it, since those get published too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from weightsmith.bench.paths import local_paths
from weightsmith.card import front
from weightsmith.card.cite import find_cited
from weightsmith.card.render import render_card
from weightsmith.card.sources import (
    BENCH_FILE,
    EVAL_FILE,
    INSPECT_FILE,
    PREFLIGHT_FILE,
    VERIFY_FILE,
    disagreements,
    reload,
)
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import MAX_JSON_BYTES, TooLarge, read_regular
from weightsmith.io.serving import CARD_FILE, read_metadata

#: The files `card` writes beside the card: published with it, so held to the same rule about paths.
WRITTEN = (INSPECT_FILE, VERIFY_FILE, EVAL_FILE, BENCH_FILE, PREFLIGHT_FILE)
_DOWNLOAD = re.compile(r"^hf download (\S+) --local-dir ")


@dataclass
class CheckResult:
    checked: int
    mismatches: list[str] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


#: The most bytes a card may hold. A card `card` writes is a few KB and an upstream model card rarely
#: passes 100 KB; a README.md of gigabytes is a stranger's, read whole only to fail.
MAX_CARD_BYTES = 16 * 1024 * 1024


def _read_capped(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, refused with one line naming it when over `limit` or unreadable."""
    try:
        return read_regular(path, limit)
    except TooLarge:
        raise WeightsmithError(f"is larger than {limit:,} bytes, the cap on this file", file=path,
                               code="file.too-large") from None  # fmt: skip
    except OSError as exc:
        raise WeightsmithError(f"cannot be read ({exc.strerror or exc})", file=path, code="file.unreadable") from None


def read_card(card: Path, strict: bool = True) -> str:
    """The card's Markdown, at most `MAX_CARD_BYTES`; not UTF-8 is a one-line error (or, when not
    `strict`, replaced characters)."""
    data = _read_capped(card, MAX_CARD_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not strict:
            return data.decode("utf-8", errors="replace")
        raise WeightsmithError(f"is not UTF-8 text (byte {exc.start:,})", file=card, code="card.not-utf8") from None


def published_repo(markdown: str) -> str | None:
    """The ORG/NAME the card's Serving it section downloads from, if it has one."""
    for line in markdown.splitlines():
        m = _DOWNLOAD.match(line)
        if m:
            return m.group(1)
    return None


def _fenced(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of every line inside a ``` code block."""
    out, inside = [], False
    for number, line in enumerate(markdown.splitlines(), start=1):
        if line.startswith("```"):
            inside = not inside
        elif inside:
            out.append((number, line))
    return out


def _paths(folder: Path, markdown: str) -> list[str]:
    found = []
    for number, line in enumerate(markdown.splitlines(), start=1):
        found += [
            f"{CARD_FILE}:{number}: names the local path {p!r}; a published card must not" for p in local_paths(line)
        ]
    for name in WRITTEN:
        path = folder / name
        if path.is_file():
            text = _read_capped(path, MAX_JSON_BYTES).decode(errors="replace")
            found += [f"{name}: names the local path {p!r}; it is published with the card" for p in
                      dict.fromkeys(local_paths(text))]  # fmt: skip
    return found


def check_card(folder: Path) -> CheckResult:
    """Re-derive every source of `folder`'s card and compare each cited value with what it gives now."""
    card = folder / CARD_FILE
    if not card.is_file():
        raise WeightsmithError("has no README.md to check; write one with `weightsmith card`", file=folder)
    text = read_card(card)
    cited = find_cited(text)
    if not cited:
        raise WeightsmithError("cites no numbers; was it written by `weightsmith card`?", file=card)
    meta = read_metadata(text, card)
    base, license_id = meta.get("base_model"), meta.get("license")
    repo = published_repo(text)
    src = reload(folder)
    result = CheckResult(len(cited), provenance=src.provenance)
    if repo is not None and not front.is_repo_id(repo):
        result.mismatches.append(f"{CARD_FILE}: `hf download` names {repo!r}, which is not a Hub repository id")
        repo = None
    markdown, now = render_card(
        src, base if isinstance(base, str) else None, license_id if isinstance(license_id, str) else None, repo
    )
    result.mismatches += disagreements(src)
    for item in cited:
        expected = now.by_source.get(item.source)
        if item.glued or item.glued_before:
            where = f"is followed by {item.glued!r}" if item.glued else f"is preceded by {item.glued_before!r}"
            result.mismatches.append(
                f"{CARD_FILE}:{item.line}: {item.value} citing {item.source} {where}, "
                "so a reader sees another value than the one cited"
            )
        elif expected is None:
            result.mismatches.append(
                f"{CARD_FILE}:{item.line}: {item.value} cites {item.source}, which no longer gives a value"
            )
        elif expected.value != item.value:
            result.mismatches.append(
                f"{CARD_FILE}:{item.line}: {item.value} does not match {item.source}, which gives {expected.value}"
            )
    meta_now = read_metadata(markdown)
    for key in dict.fromkeys([*meta, *meta_now]):
        if meta.get(key) != meta_now.get(key):
            result.mismatches.append(
                f"{CARD_FILE}: front matter {key} is {meta.get(key)!r}; the sources give {meta_now.get(key)!r}"
            )
    card_lines, lines_now = _fenced(text), [line for _, line in _fenced(markdown)]
    for i, (number, line) in enumerate(card_lines):
        should = lines_now[i] if i < len(lines_now) else None
        if line != should:
            result.mismatches.append(f"{CARD_FILE}:{number}: command `{line}` is not what the sources give: `{should}`")
    for missing in lines_now[len(card_lines) :]:
        result.mismatches.append(f"{CARD_FILE}: a command the sources give is missing: `{missing}`")
    result.mismatches += _paths(folder, text)
    return result
