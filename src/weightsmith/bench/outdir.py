"""Whose folder `--out` is: bench writes only into a folder it made, or an empty one.

A run empties `cache/<arm>/`, appends to `logs/` and replaces `report.md` and the plots; in a
folder someone else filled, that would destroy their files. So bench marks every folder it writes
into, and treats a non-empty folder without the mark (or a results file of its own) as not its own,
`--force` or not: `--force` only lets `run` replace results bench wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from weightsmith.bench.report import RESULTS_FILE
from weightsmith.bench.results import SCHEMA
from weightsmith.errors import OutputError
from weightsmith.files import MAX_JSON_BYTES, read_regular, write_new

#: Written into every output folder before anything else.
MARKER = ".weightsmith-bench"


def _has_bench_results(out: Path) -> bool:
    """A results.json of bench's schema (runs before the mark existed left only that)."""
    try:
        data = json.loads(read_regular(out / RESULTS_FILE, MAX_JSON_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def written_by_bench(out: Path) -> bool:
    """True for a folder that bench wrote (its mark, or its results file)."""
    return (out / MARKER).is_file() or _has_bench_results(out)


def claim(out: Path) -> None:
    """Make `out` ours to write, or refuse with one line before anything is written.

    A missing or empty folder is created and marked; a folder bench wrote is kept as it is; any
    other folder (or a link to one) is refused.
    """
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputError("--out exists and is not a folder", file=out)
    if out.is_dir() and not written_by_bench(out):
        try:
            used = next(out.iterdir(), None) is not None
        except OSError as exc:
            raise OutputError(f"cannot read --out: {exc.strerror}", file=out) from None
        if used:
            raise OutputError(
                "--out holds files bench did not write; choose an empty folder or one bench wrote", file=out
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not (out / MARKER).is_file():
            write_new(out, MARKER, b"")
    except OSError as exc:
        raise OutputError(f"cannot write into --out: {exc.strerror}", file=out) from None
