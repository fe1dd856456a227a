"""Numbers that carry their source: written into the card, and found again by `card --check`.

A cited value is written as `VALUE<!-- FILE: FIELD -->`. VALUE is either a plain token (digits,
letters, `.,+-%`) or a code span (`` `text` ``) for quoted text such as a serve command or a hash.
The comment is invisible on the Hub but stays in the Markdown, which is where the check reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: A plain-token value may only start where a run of token characters starts (the lookbehind):
#: without it every position inside a long run retries the whole rest of the run, which makes a
#: 200,000-character line take minutes. Each remaining part is bounded by a character it cannot
#: contain (a backtick, `:`, `<`, `>`), so finding every anchor is linear in the line's length.
_TOKEN = r"[\w.,+%-]"
#: What, right after an anchor, a reader would read as part of the number: `14<!-- ... -->0` shows
#: as 140. Captured (without consuming it, so a next anchor is still found) for `card --check`.
_GLUED = r"(?=(\w|[.,]\d)?)"
_ANCHOR = re.compile(rf"(`[^`\n]+`|(?<!{_TOKEN}){_TOKEN}+)<!-- ([^:<>]+?): ([^<>]+?) -->{_GLUED}")


@dataclass(frozen=True)
class Cited:
    """One number (or quoted text) and where it came from."""

    value: str
    file: str
    field: str
    line: int = 0
    #: A character after the anchor that a reader takes as part of the value ("" when none).
    glued: str = ""

    @property
    def source(self) -> str:
        return f"{self.file}: {self.field}"


@dataclass
class Citations:
    """The registry a card is rendered with: every value written, keyed by its source."""

    by_source: dict[str, Cited] = field(default_factory=dict)

    def num(self, value: str, file: str, path: str) -> str:
        """`value` with its source anchor; the same source must always show the same text."""
        if not re.fullmatch(rf"{_TOKEN}+", value):
            raise ValueError(f"not a plain token: {value!r}")
        return self._add(value, file, path)

    def text(self, value: str, file: str, path: str) -> str:
        """Quoted text (a command, a hash) as a code span with its source anchor."""
        return self._add("`" + value.replace("`", "'") + "`", file, path)

    def _add(self, shown: str, file: str, path: str) -> str:
        cited = Cited(shown, file, path)
        known = self.by_source.get(cited.source)
        if known is not None and known.value != shown:
            raise ValueError(f"{cited.source} shown as both {known.value} and {shown}")
        self.by_source[cited.source] = cited
        return f"{shown}<!-- {file}: {path} -->"


def find_cited(markdown: str) -> list[Cited]:
    """Every anchored value in a card, with its line number."""
    found = []
    for number, line in enumerate(markdown.splitlines(), start=1):
        for m in _ANCHOR.finditer(line):
            found.append(Cited(m.group(1), m.group(2), m.group(3), number, m.group(4) or ""))
    return found
