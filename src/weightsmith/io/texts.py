"""The text models read (calibration, eval): a user's file, or a built-in corpus every Python has.

`code` is Python's own standard library source, `json/decoder.py` then the top-level modules in name
order; `prose` is the English reference documentation CPython ships as a Python module
(`pydoc_data/topics.py`). `eval` reads `json/encoder.py` by default, a file neither built-in text
holds at any length (`builtin_files` leaves out EVAL_FILES), so that a model quantized with the
default calibration is not scored on its own calibration text. All are read offline, and the label
says which Python they came from, since another version's files give other tokens (the SHA-256 in
the provenance pins them).
"""

from __future__ import annotations

import platform
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import read_text_file
from weightsmith.core.terminal import short_repr

#: Below this many calibration tokens a maximum is not stable enough to publish: warn with the count.
MIN_TOKENS = 4096
#: The most tokens `--tokens` takes (calibrate, calibrate-kv, quantize --method gptq, eval): 16,777,216,
#: 16 times llm-compressor's usual GPTQ calibration (512 sequences of 2,048). A bound on what a typo
#: (`--tokens 1000000000000`) can ask for.
MAX_TOKENS = 1 << 24
#: Calibration tokens and tokens per sequence of `calibrate` and `calibrate-kv` unless told.
CALIBRATION_TOKENS = 65536
CALIBRATION_SEQ_LEN = 2048
#: The most bytes of a `--text` file read: far more than the text of MAX_TOKENS tokens (about 64 MiB
#: at 4 bytes a token), far less than a machine's memory.
TEXT_LIMIT = 256 * 2**20
#: What `--text` takes, in the commands' help.
TEXT_HELP = f"a regular file of at most {TEXT_LIMIT // 2**20} MiB"
BUILTINS = ("code", "prose")
#: The built-in text used when neither `--text` nor `--builtin` is given.
DEFAULT_BUILTIN = "code"
#: Characters read per token wanted: code and English tokenise at 3-4 characters a token.
CHARS_PER_TOKEN = 6
#: What `eval` reads by default, relative to the standard library: never part of a built-in text.
EVAL_FILES = ("json/encoder.py",)
#: The built-in code text's first file, before the top-level modules.
CODE_FIRST = "json/decoder.py"


def tokens_option(least: int = 1) -> Callable[[str | int], int]:
    """The parser of a `--tokens` option: a whole number from `least` to MAX_TOKENS, else one line.

    Parsed here, not by typer's range check, so that `--tokens 1e12` or `--tokens 10000000000000` is
    answered with the whole range the command takes (`least` differs between commands).
    """

    def parse(value: str | int) -> int:
        text = str(value).strip()
        count = int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else -1
        if not least <= count <= MAX_TOKENS:
            raise WeightsmithError(
                f"--tokens {short_repr(str(value))}: give a whole number of tokens from {least:,} to {MAX_TOKENS:,}",
                code="usage",
            )
        return count

    return parse


@dataclass(frozen=True)
class TextSample:
    """The text the models read, and where it came from (for the report)."""

    text: str
    source: str


def default_text() -> TextSample:
    """The standard library's JSON encoder source: real code, present wherever Python is, and in no
    built-in calibration text."""
    (name,) = EVAL_FILES
    text = (_stdlib() / name).read_text(encoding="utf-8")
    return TextSample(text, f"{name} from Python {platform.python_version()}")


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read_text(path: str | Path) -> TextSample:
    """A user's `--text` file, or a one-line error naming it: a FIFO or device (`/dev/zero`) is
    refused before it is opened, and no more than TEXT_LIMIT bytes are ever read."""
    path = Path(path)
    return TextSample(read_text_file(path, TEXT_LIMIT, "--text file", code="usage"), str(path))


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
    parts: list[str] = []
    for path in builtin_files():
        try:
            parts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if sum(map(len, parts)) >= wanted:
            break
    return TextSample("\n".join(parts), f"builtin:code (Python {version} standard library)")


def builtin_files() -> list[Path]:
    """The files of the built-in code text, in the order it reads them: CODE_FIRST, then the standard
    library's top-level modules by name, never one of EVAL_FILES."""
    stdlib = _stdlib()
    kept_out = {(stdlib / name).resolve() for name in EVAL_FILES}
    files = [stdlib / CODE_FIRST, *sorted(stdlib.glob("*.py"))]
    return [path for path in files if path.resolve() not in kept_out]


def calibration_text(text: str | Path | None, builtin: str | None, tokens: int) -> TextSample:
    """The text named by `--text FILE` or `--builtin NAME` (default: the built-in code)."""
    if text is not None and builtin is not None:
        raise WeightsmithError("give --text or --builtin, not both", code="usage")
    if text is not None:
        return read_text(text)
    return builtin_text(builtin or DEFAULT_BUILTIN, tokens)
