"""Whose folder `--out` is, and which of its files bench may replace: only what it provably wrote.

A run empties `cache/<arm>/`, appends to `logs/` and replaces results.json, `report.md` and the
plots; in a folder someone else filled, that would destroy their files. A name proves nothing (an
empty `.weightsmith-bench` is as easy to make as any file), so bench's marker is a record: the
folder's own device and inode (a copied marker names another folder) and every entry bench wrote
into it. An entry is written only when it is absent (and then recorded first) or recorded; a file
or folder the record does not name is never replaced, emptied or appended to, `--force` or not.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from weightsmith.core.errors import OutputError
from weightsmith.core.files import read_regular, replace_file

#: Written into every output folder before anything else: `{"device", "inode", "files": [...]}`.
MARKER = ".weightsmith-bench"
#: A record listing more entries than any run writes is not one of ours.
_MAX_MARKER_BYTES = 1 << 24


def _record(out: Path) -> set[str] | None:
    """The entries bench wrote into `out`, from a marker that names this very folder; None without one."""
    try:
        st = os.lstat(out)
        if not stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(os.lstat(out / MARKER).st_mode):
            return None
        data = json.loads(read_regular(out / MARKER, _MAX_MARKER_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or (data.get("device"), data.get("inode")) != (st.st_dev, st.st_ino):
        return None
    written = data.get("files")
    if not isinstance(written, list) or not all(isinstance(name, str) for name in written):
        return None
    return set(written)


def _write_record(out: Path, written: set[str]) -> None:
    st = os.stat(out)
    record = {"device": st.st_dev, "inode": st.st_ino, "files": sorted(written)}
    replace_file(out / MARKER, (json.dumps(record, indent=1) + "\n").encode())


def written_by_bench(out: Path) -> bool:
    """True for a folder carrying bench's record of itself."""
    return _record(out) is not None


def claim(out: Path, will_write: tuple[str, ...] = (), *, besides: Path | None = None) -> None:
    """Make `out` ours to write, or refuse with one line before anything is written.

    A missing or empty folder is created and given bench's record; a folder carrying that record is
    kept as it is; `besides`, a file in `out` (the results file `report` reads), may be all it holds.
    Any other folder (or a link to one) is refused. Then each of `will_write` must be one bench may
    write (`own`), so a run is refused before it starts rather than at its end.
    """
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputError("--out exists and is not a folder", file=out)
    if out.is_dir() and _record(out) is None:
        try:
            held = sorted(os.listdir(out))
        except OSError as exc:
            raise OutputError(f"cannot read --out: {exc.strerror}", file=out) from None
        foreign = sorted((name for name in held if besides is None or name != besides.name), key=lambda n: n == MARKER)
        if foreign:
            raise OutputError(
                f"holds {foreign[0]!r}, which bench did not write (the folder carries no record of bench's); "
                "choose an empty folder or one bench wrote",
                file=out,
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        if _record(out) is None:
            _write_record(out, set())
    except OSError as exc:
        raise OutputError(f"cannot write into --out: {exc.strerror}", file=out) from None
    written = _record(out) or set()
    for name in will_write:  # all checked before any is recorded
        if name not in written and os.path.lexists(out / name):
            raise _not_ours(out / name)
    for name in will_write:
        own(out, name)


def _not_ours(path: Path) -> OutputError:
    return OutputError("was not written by bench; not replaced (move it away or choose another --out)", file=path)


def own(out: Path, name: str) -> Path:
    """`out/name`, made bench's to write: recorded when absent, refused with one line when it exists
    and bench's record does not name it (someone else's file, or one bench never wrote)."""
    written = _record(out)
    if written is None:
        raise OutputError("carries no record of bench's; bench writes only into a folder it claimed", file=out)
    path = out / name
    if name not in written:
        if os.path.lexists(path):
            raise _not_ours(path)
        written.add(name)
        _write_record(out, written)
    return path


def write_owned(out: Path, name: str, data: bytes) -> Path:
    """Write `data` whole to `out/name`, a file bench may write (`own`), never through a link there."""
    path = own(out, name)
    replace_file(path, data)
    return path
