"""Output folders that appear whole or not at all.

Work happens in `OUT.partial-<pid>` beside OUT (same filesystem, so the final rename is atomic);
only a verified result is renamed into place. Any failure, Ctrl-C included, removes the partial
folder, and an existing OUT is only replaced when asked.

A run killed outright (`kill -9`, a power cut) cannot clean up after itself, so every partial folder
holds a lock file that its run keeps locked (`flock`) while it works: the kernel drops that lock when
the process dies, however it dies. The next run for the same OUT removes partial folders whose lock
it can take, and `OUT.replaced-<pid>` folders (the previous OUT, renamed aside during a replace) whose
process is gone, putting the previous OUT back when the run died before the new one took its place.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from weightsmith.errors import OutputError

#: Inside a partial folder; locked for as long as the run that made the folder is alive.
LOCK_FILE = ".weightsmith-partial.lock"


def check_destination(src: Path, out: Path, force: bool) -> None:
    """Refuse an output inside the source (or the source itself), or an existing one without force."""
    src_r, out_r = src.resolve(), out.resolve()
    if out_r == src_r or src_r in out_r.parents:
        raise OutputError(
            "is inside the source checkpoint; choose a folder outside it", file=out, code="output.inside-source"
        )
    if out_r in src_r.parents:
        raise OutputError(
            "contains the source checkpoint; choose another folder", file=out, code="output.contains-source"
        )
    if out.exists() and not force:
        raise OutputError("already exists (use --force to replace it)", file=out, code="output.exists")
    if out.exists() and not out.is_dir():
        raise OutputError("exists and is not a folder", file=out, code="output.not-dir")


def check_space(out: Path, needed: int) -> None:
    """Fail before writing anything when the output filesystem cannot hold `needed` bytes."""
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    if free < needed:
        raise OutputError(
            f"needs {needed / 2**30:.2f} GiB but its filesystem has {free / 2**30:.2f} GiB free",
            file=out,
            code="output.no-space",
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _lock_is_free(folder: Path) -> bool | None:
    """Whether the partial folder's lock can be taken (its run is gone); None when it has no lock file."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:  # a link or something else that is not our lock file: not ours to judge
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def remove_stale(out: Path) -> list[str]:
    """Remove what killed runs for `out` left beside it; returns one sentence per folder dealt with.

    Only folders named exactly `OUT.partial-<pid>` / `OUT.replaced-<pid>` (real folders, not links)
    are considered. A partial folder is stale when its lock can be taken, or, having no lock file
    (killed in the instant after its creation), when its process is gone. A replaced folder is stale
    when its process is gone; if OUT itself is missing, it is the previous OUT and is put back.
    """
    out = out.resolve()  # as `staged` names its folders
    parent = out.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(re.escape(out.name) + r"\.(partial|replaced)-([0-9]{1,10})")
    said: list[str] = []
    for entry in sorted(parent.iterdir()):
        match = pattern.fullmatch(entry.name)
        if match is None or entry.is_symlink() or not entry.is_dir():
            continue
        kind, pid = match.group(1), int(match.group(2))
        if pid == os.getpid():
            continue
        if kind == "partial":
            free = _lock_is_free(entry)
            if free is False or (free is None and _pid_alive(pid)):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            said.append(f"removed {entry.name}, left by an interrupted run (process {pid} is gone)")
        elif not _pid_alive(pid):
            if not out.exists() and not out.is_symlink():
                os.rename(entry, out)
                said.append(f"restored {out.name} from {entry.name}: a run replacing it died before finishing")
            else:
                shutil.rmtree(entry, ignore_errors=True)
                said.append(f"removed {entry.name}, the previous {out.name} left by a run that died replacing it")
    return said


@contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """Yield a fresh partial folder; on success rename it to `out`, on any failure remove it."""
    out = out.resolve()
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    if partial.exists():
        shutil.rmtree(partial)
    try:  # an interrupt landing between creating the folder and locking it must not leave it behind
        partial.mkdir(parents=True)
        lock = os.open(partial / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield partial
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        try:
            os.unlink(partial / LOCK_FILE)  # the finished folder carries no lock; ours is held until we return
            if out.exists():
                if not force:
                    raise OutputError("appeared while we were writing; not replaced", file=out, code="output.exists")
                old = out.with_name(f"{out.name}.replaced-{os.getpid()}")
                os.rename(out, old)
                try:
                    os.rename(partial, out)
                except BaseException:
                    os.rename(old, out)
                    raise
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(partial, out)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    finally:
        os.close(lock)
