"""The one place a string from a checkpoint (or any other stranger's file) is made safe to print.

Tensor and shard names, metadata and config strings are a stranger's bytes. Printed raw, an escape
sequence can clear the screen or rewrite earlier lines, and a right-to-left override or a stray
carriage return can make one name read as another. Every text line the commands print passes
through `printable`; JSON output keeps the real strings.
"""

from __future__ import annotations

import re
import shlex
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping

#: What a shell takes as a variable name in `NAME=value` before a command. Anything else (`A;B`,
#: `X=$(cmd)`) is not an assignment there but words of a command line, so an env key must be one.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def printable(text: str) -> str:
    """`text` with each character a terminal would act on or not show written as its escape.

    Control characters, format characters (bidi overrides, zero-width marks), separators other than
    the plain space, surrogates and unassigned code points become `\\x1b`, `\\u202e`, ...; everything
    else, backslashes included, is kept, so an already printable string comes back unchanged.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def short_repr(value: object, limit: int = 40) -> str:
    """`value` as Python writes it (escaped, so one line), cut to `limit` characters: a value from a
    stranger's file may be of any length, and a message quoting it must stay one readable line.

    An integer past Python's 4,300-digit conversion limit (TOML's `0xfff...` is read without one)
    cannot be written at all: it is described instead, so that the message quoting it is still made."""
    try:
        text = repr(value)
    except ValueError:
        if isinstance(value, int):
            return f"an integer of {value.bit_length():,} bits"
        return f"a {type(value).__name__} holding an integer too large to write"
    return cut(text, limit)


def cut(text: str, limit: int) -> str:
    """`text`, at most `limit` characters: cut with `...` in the last three."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str, limit: int = 200) -> str:
    """`text` on one line (whitespace runs, newlines included, become one space), cut to `limit`."""
    return cut(" ".join(text.split()), limit)


#: The most characters of a stranger's string one message quotes: a recipe target, key or regex of
#: 100,000 characters echoed whole filled 1,259 lines of a terminal.
ECHO_LIMIT = 200


def echo(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` quoted as Python writes it (escaped, so one line), cut after `limit` characters with the
    count of those left out: a message that quotes an input stays readable whatever its length, and
    says that it was cut."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text) - limit:,} more characters)"


#: The longest error line printed whole: a message naming a path, a tensor and what is wrong fits in a
#: few hundred characters; one past this quotes an input (a 100,000-character path was printed whole).
LINE_LIMIT = 1000


def cut_line(text: str, limit: int = LINE_LIMIT) -> str:
    """`text`, when longer than `limit`, cut in its middle with the count left out: the start names
    the file and the entry, the end says what is wrong, and both stay."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]} ... ({len(text) - head - tail:,} characters left out) ... {text[-tail:]}"


def markup_safe(text: object) -> str:
    """`text` made safe to print on a rich console that reads markup: `printable`, then every `[` that
    could open a tag escaped.

    A stranger's name or path is text, not markup: read as markup, `x[/]y` raises rich's MarkupError
    (a traceback instead of the line), and `[bold]`, `[link=...]` restyle or hide what follows. Consoles
    that print only such strings are made with `markup=False`; the ones that style their own words
    pass every interpolated string through here.
    """
    from rich.markup import escape  # rich is loaded by every command that prints; this module is imported earlier

    return escape(printable(str(text)))


def shell_line(words: Iterable[str], variables: Collection[str] = ()) -> str:
    """`words` as one command line that, pasted into bash, runs exactly that argv: the one spelling
    of every command line we print (preflight's and the card's `vllm serve`, bench's commands).

    A path or a JSON value is a stranger's text: `$(...)`, backquotes, quotes, `;` and spaces in it
    must stay text. Each word is quoted as `shlex.join` quotes it; a word holding a character a
    terminal would act on or hide (a newline, an escape sequence) is written in bash's `$'...'`
    form instead, those characters as escapes, so the line stays one printable line and still
    pastes exactly. A file name's undecodable byte (a lone surrogate from `os.fsdecode`) is
    written as that byte. `$NAME` for a NAME in `variables` (bench's `$MODEL`, which a reader
    sets) is left for the shell to expand, in double quotes; nothing else is.
    """
    if not variables:
        return " ".join(_quoted(w) for w in words)
    names = re.compile(r"\$(" + "|".join(map(re.escape, variables)) + r")(?!\w)")
    line = []
    for word in words:
        parts = names.split(word)  # text, name, text, name, ..., text
        line.append("".join(f'"${part}"' if i % 2 else _quoted(part) for i, part in enumerate(parts) if part) or "''")
    return " ".join(line)


def env_line(env: Mapping[str, str]) -> str:
    """`env` as `NAME=value` words that, pasted before a command, set exactly that environment: each
    value quoted as `shell_line` quotes a word. A name that is not a variable name (`ENV_NAME`) is a
    ValueError: the readers of arms and results files refuse one, so none reaches a printer."""
    for name in env:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"not a variable name: {name!r}")
    return " ".join(f"{name}={_quoted(value)}" for name, value in env.items())


def code_span(text: str) -> str:
    """`text` as a Markdown code span that shows it exactly: fenced by one backquote more than the
    longest run it holds, so a backquote in a stranger's path or command cannot end it early (and
    padded with a space where it starts or ends with one, which CommonMark strips again)."""
    fence = "`" * (_longest_backquotes(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def fenced_block(lines: list[str], info: str = "text") -> list[str]:
    """`lines` as a fenced Markdown code block whose fence is longer than any run of backquotes in
    them (at least three), so no line of a stranger's (a server's log) can end it and have the rest
    read as Markdown."""
    fence = "`" * max(3, _longest_backquotes("\n".join(lines)) + 1)
    return [fence + info, *lines, fence]


def _longest_backquotes(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


def text_file(lines: Iterable[str]) -> str:
    """`lines` as the text of a file a person reads (a model card, a bench report): each `printable`,
    joined by line breaks.

    Such a file is read with `cat` as often as in a viewer, so every string in it is escaped as the
    terminal output is, here, at the one place the file is made: a string from an input (a tensor
    name, an arm name, a server's message) cannot act on the reader's terminal, and a line break in
    one is written `\\n`, so it cannot start a heading or end the front matter. Our own words are
    printable, so they come back as they are.
    """
    return "\n".join(printable(line) for line in lines)


#: Text Markdown shows as it is wherever it stands in a line: words of letters and digits joined by
#: single `.`, `-` or `_` (an underscore between two letters never opens emphasis), one space apart.
_PLAIN_MARKDOWN = re.compile(r"[^\W_]+(?:[._-][^\W_]+)*(?: [^\W_]+(?:[._-][^\W_]+)*)*")


def markdown_code(text: str, cell: bool = False) -> str:
    """`text`, a stranger's string, as a Markdown code span that shows it: `printable` first, then
    `code_span`, so nothing in it is read as Markdown or HTML (`<script>`, `**`, a backquote that
    would end the span). In a table cell (`cell`) each `|` gets a backslash: GitHub splits a row on
    a `|` even inside a code span unless a backslash is right before it, and then drops that one
    backslash alone (cmark-gfm's cell scanner), so the span shows the name as it is."""
    shown = code_span(printable(text))
    return shown.replace("|", "\\|") if cell else shown


def markdown_text(text: str, cell: bool = False) -> str:
    """`text` as it is where Markdown shows it as it is (`_PLAIN_MARKDOWN`: a category, a folder
    name), else as `markdown_code`: a name that is plain words reads as prose, any other is quoted."""
    return text if _PLAIN_MARKDOWN.fullmatch(text) else markdown_code(text, cell)


def _quoted(word: str) -> str:
    return shlex.quote(word) if word.isprintable() else _ansi_c_word(word)


def _ansi_c_word(word: str) -> str:
    """`word` in bash's `$'...'` quoting, every character `str.isprintable` refuses as an escape."""
    out = []
    for ch in word:
        code = ord(ch)
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte the file name holds
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "$'" + "".join(out) + "'"


#: A line for the person running it: a warning, or a progress line. Library calls take one instead of
#: printing (the command passes one that prints).
Say = Callable[[str], None]


def warner(warn: Say | None, depth: int = 2) -> Say:
    """`warn`, or Python's warnings: a library call must not write to a terminal it does not own.

    `depth`: how many of our frames lie between the call that says it and the user's code, so that the
    warning names the user's line."""
    if warn is not None:
        return warn
    return lambda message: warnings.warn(message, UserWarning, stacklevel=depth + 2)
