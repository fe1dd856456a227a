"""Numbers that carry their source: written into the card, and found again by `card --check`.

A cited value is written as `VALUE<!-- FILE: FIELD -->`. VALUE is either a plain token (digits,
letters, `.,+-%`) or a code span for quoted text such as a serve command or a hash, fenced by as
many backquotes as CommonMark needs to show the text exactly (`terminal.code_span`).
The comment is invisible on the Hub but stays in the Markdown, which is where the check reads it.
"""

from __future__ import annotations

import html
import re
import unicodedata
from bisect import bisect_left
from dataclasses import dataclass, field

from weightsmith.core.terminal import markdown_code, printable

#: What a plain-token value is made of.
_TOKEN = r"[\w.,+%-]"
_TOKEN_CHAR = re.compile(_TOKEN)
#: The source comment. Each part is bounded by a character it cannot contain (`:`, `<`, `>`), so
#: finding every anchor is linear in the line's length; the value before it is found by scanning
#: back no further than the previous anchor, which keeps the whole line linear too.
_ANCHOR = re.compile(r"<!-- ([^:<>]+?): ([^<>]+?) -->")
#: Markup a reader does not see as text: an HTML tag, and the characters of emphasis and code.
_TAG = re.compile(r"</?[A-Za-z][^<>\n]*>")
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_MARKERS = frozenset("*_~`")


@dataclass(frozen=True)
class Cited:
    """One number (or quoted text) and where it came from."""

    value: str
    file: str
    field: str
    line: int = 0
    #: What a reader sees right after the anchor and takes as part of the value ("" when nothing).
    glued: str = ""
    #: What a reader sees right before a plain value and takes as part of it ("" when nothing).
    glued_before: str = ""

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

    def text(self, value: str, file: str, path: str, cell: bool = False) -> str:
        """Quoted text (a command, a hash) as a code span with its source anchor, shown exactly as it is:
        a command with a backquote in it is still that command when pasted. Characters a terminal would
        act on are written as escapes, and `cell` escapes `|` for a table cell (`markdown_code`)."""
        return self._add(markdown_code(value, cell), file, path)

    def _add(self, shown: str, file: str, path: str) -> str:
        cited = Cited(shown, file, anchor_field(path))
        known = self.by_source.get(cited.source)
        if known is not None and known.value != shown:
            raise ValueError(f"{cited.source} shown as both {known.value} and {shown}")
        self.by_source[cited.source] = cited
        return f"{shown}<!-- {file}: {cited.field} -->"


def anchor_field(path: str) -> str:
    """`path` (which may hold an arm's, a shard's or a category's name) as it is written in its anchor:
    `printable`, with `<`, `>`, `|` and the second `-` of `--` written as escapes: the comment then
    ends where it should, `find_cited` finds it again, a table row keeps its cells around it, and
    GitHub reads it as a comment (its CommonMark 0.29 parser shows a comment holding `--` as text)."""
    escaped = printable(path).replace("<", "\\x3c").replace(">", "\\x3e").replace("|", "\\x7c")
    return re.sub("(?<=-)-", r"\\x2d", escaped)


def find_cited(markdown: str) -> list[Cited]:
    """Every anchored value in a card, with its line number and what a reader sees glued to it."""
    found = []
    for number, line in enumerate(markdown.splitlines(), start=1):
        seen: _Visible | None = None
        start = 0  # where the previous anchor ended: no value reaches back past it
        for m in _ANCHOR.finditer(line):
            begin = _value_start(line, start, m.start())
            start = m.end()
            if begin is None:
                continue
            seen = seen or _Visible(line)
            value = line[begin : m.start()]
            before = "" if value.startswith("`") else seen.before(begin)
            found.append(Cited(value, m.group(1), m.group(2), number, seen.after(m.end()), before))
    return found


def _value_start(line: str, floor: int, end: int) -> int | None:
    """Where the value ending at `end` starts (not before `floor`), or None when there is none."""
    if end > floor and line[end - 1] == "`":  # a code span: find the opening run as long as the closing one
        close = end
        while close > floor and line[close - 1] == "`":
            close -= 1
        fence = "`" * (end - close)
        right = close
        while True:
            at = line.rfind(fence, floor, right)
            if at < 0:
                return None
            run = at
            while run > floor and line[run - 1] == "`":
                run -= 1
            if at + len(fence) - run == len(fence):
                return at if at + len(fence) < close else None
            right = run
    begin = end
    while begin > floor and _TOKEN_CHAR.match(line[begin - 1]):
        begin -= 1
    return begin if begin < end else None


class _Visible:
    """The characters of a line a reader sees once it is rendered, each with its place in the line.

    Comments, HTML tags, emphasis and code markers and format characters (zero-width spaces, joiners)
    are not seen; an entity (`&#48;`) is seen as the character it stands for. So `7<!-- c -->**0**`
    and `7<!-- c -->&#48;` read 70, and `9<!-- x -->7<!-- c -->` reads 97.
    """

    def __init__(self, line: str) -> None:
        self.chars: list[str] = []
        self.where: list[int] = []
        i, closes = 0, True  # closes: a later `-->` may still exist
        while i < len(line):
            if closes and line.startswith("<!--", i):
                end = line.find("-->", i + 4)
                if end >= 0:
                    i = end + 3
                    continue
                closes = False
            tag = _TAG.match(line, i) if line[i] == "<" else None
            if tag:
                i = tag.end()
                continue
            entity = _ENTITY.match(line, i) if line[i] == "&" else None
            if entity:
                for ch in html.unescape(entity.group()):
                    self._see(ch, i)
                i = entity.end()
                continue
            self._see(line[i], i)
            i += 1

    def _see(self, ch: str, at: int) -> None:
        if ch not in _MARKERS and unicodedata.category(ch) != "Cf":
            self.chars.append(ch)
            self.where.append(at)

    def after(self, at: int) -> str:
        """What, seen from place `at` on, extends a number: a letter or digit, or `.`/`,` and a digit."""
        i = bisect_left(self.where, at)
        return _extends(self.chars[i : i + 2])

    def before(self, at: int) -> str:
        """What, seen just before place `at`, extends a number: a letter or digit, or a digit and `.`/`,`."""
        i = bisect_left(self.where, at)
        return _extends(self.chars[max(0, i - 2) : i][::-1])[::-1]


def _extends(chars: list[str]) -> str:
    """`chars` (the nearest first) that a reader would take as part of a neighbouring number."""
    if chars and chars[0].isalnum():
        return chars[0]
    if len(chars) == 2 and chars[0] in ".," and chars[1].isdigit():
        return chars[0] + chars[1]
    return ""
