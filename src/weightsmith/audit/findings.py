"""A finding: one thing wrong (or worth knowing) about a checkpoint, in a form a person can act on.

Every finding carries a stable check id, a severity, the file and tensor it concerns and one
sentence. Errors make `verify` exit 1; warnings are printed but do not change the exit status,
because they describe things a runtime tolerates (a stray shard, a deprecated scale name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.severity import ERROR, INFO, SEVERITY_ORDER, WARNING, Severity
from weightsmith.core.terminal import printable

__all__ = ["ERROR", "INFO", "SEVERITY_ORDER", "WARNING", "Finding", "Severity", "from_error", "relative"]


@dataclass(frozen=True)
class Finding:
    """One result of one check."""

    check: str
    severity: Severity
    message: str
    file: str | None = None
    tensor: str | None = None

    def line(self) -> str:
        """`file: tensor 'name': message`, the same shape as every other error in the project.

        Names come from a stranger's header, so control characters are shown escaped, as in `WeightsmithError`.
        """
        parts = [p for p in (self.file, f"tensor '{self.tensor}'" if self.tensor else None) if p]
        return printable(": ".join([*parts, self.message]))


def relative(path: str | Path | None, root: Path) -> str | None:
    """A path as the user thinks of it: relative to the checkpoint folder when it lies inside."""
    if path is None:
        return None
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def from_error(exc: WeightsmithError, root: Path) -> Finding:
    """An error finding from an error raised by the readers, keeping its code as the check id."""
    return Finding(exc.code, ERROR, exc.message, relative(exc.file, root), exc.tensor)
