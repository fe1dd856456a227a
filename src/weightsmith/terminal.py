"""The one place a string from a checkpoint (or any other stranger's file) is made safe to print.

Tensor and shard names, metadata and config strings are a stranger's bytes. Printed raw, an escape
sequence can clear the screen or rewrite earlier lines, and a right-to-left override or a stray
carriage return can make one name read as another. Every text line the commands print passes
through `printable`; JSON output keeps the real strings.
"""

from __future__ import annotations


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
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
