"""Calibration text: a user's file, or a built-in corpus every Python installation has.

`code` is Python's own standard library source, starting with the text `eval` reads by default
(`json/decoder.py`); `prose` is the English reference documentation CPython ships as a Python
module (`pydoc_data/topics.py`). Both are read offline, and the label says which Python they came
from, since another version's files give other tokens (the SHA-256 in the provenance pins them).
"""

from __future__ import annotations

import platform
import sysconfig
from pathlib import Path

from weightsmith.errors import WeightsmithError
from weightsmith.fidelity.logits import TextSample, default_text, read_text

BUILTINS = ("code", "prose")
#: The built-in text used when neither `--text` nor `--builtin` is given.
DEFAULT_BUILTIN = "code"
#: Characters read per token wanted: code and English tokenise at 3-4 characters a token.
CHARS_PER_TOKEN = 6


def builtin_text(name: str, tokens: int) -> TextSample:
    """At least about `tokens` tokens of the built-in corpus `name` (all of it if it is shorter)."""
    version = platform.python_version()
    if name == "prose":
        import pydoc_data.topics

        path = Path(pydoc_data.topics.__file__)
        return TextSample(path.read_text(encoding="utf-8"), f"builtin:prose (pydoc_data/topics.py, Python {version})")
    if name != "code":
        raise WeightsmithError(f"unknown built-in text {name!r} (choose from {', '.join(BUILTINS)})", code="usage")
    wanted = tokens * CHARS_PER_TOKEN
    first = default_text()
    parts = [first.text]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if sum(map(len, parts)) < wanted:
        for path in sorted(stdlib.glob("*.py")):
            try:
                parts.append(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                continue
            if sum(map(len, parts)) >= wanted:
                break
    return TextSample("\n".join(parts), f"builtin:code (Python {version} standard library)")


def calibration_text(text: str | Path | None, builtin: str | None, tokens: int) -> TextSample:
    """The text named by `--text FILE` or `--builtin NAME` (default: the built-in code)."""
    if text is not None and builtin is not None:
        raise WeightsmithError("give --text or --builtin, not both", code="usage")
    if text is not None:
        return read_text(text)
    return builtin_text(builtin or DEFAULT_BUILTIN, tokens)
