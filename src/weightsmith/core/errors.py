"""Errors a user can act on.

Every problem with the user's input or environment is raised as a `WeightsmithError` that renders as
one line naming the file and, where there is one, the tensor. The command line prints that line and
exits non-zero; nothing else should reach the user as a traceback.
"""

from __future__ import annotations

from pathlib import Path

from weightsmith.core.terminal import printable


class WeightsmithError(Exception):
    """A problem the user can fix, rendered as `file: tensor 'name': what is wrong`.

    `file`, `tensor` and `message` keep the real strings (JSON output and findings carry them);
    `str()` is the terminal line, with control characters from a hostile name shown escaped.
    """

    #: A stable identifier for the kind of problem (used by `verify` and in JSON output).
    code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        tensor: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = str(file) if file is not None else None
        self.tensor = tensor
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file)
        if self.tensor is not None:
            parts.append(f"tensor '{self.tensor}'")
        parts.append(self.message)
        return printable(": ".join(parts))


class CheckpointError(WeightsmithError):
    """The input checkpoint is missing, unreadable or malformed."""

    code = "checkpoint"


class HeaderError(CheckpointError):
    """A safetensors file violates the format; `code` says which rule."""

    code = "header"


class OutputError(WeightsmithError):
    """The output cannot be written where or as asked."""

    code = "output"
