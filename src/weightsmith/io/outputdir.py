"""Output folders that appear whole or not at all, and what counts as ours to remove or replace.

Work happens in `OUT.partial-<pid>` beside OUT (same filesystem, so the final rename is atomic);
only a verified result is renamed into place. Any failure, Ctrl-C included, removes the partial
folder, and an existing OUT is only replaced when asked, and only when weightsmith wrote it.

A run killed outright (`kill -9`, a power cut) cannot clean up after itself, so every partial folder
holds a lock file that its run keeps locked (`flock`) while it works: the kernel drops that lock when
the process dies, however it dies. The folder is made and locked under a private name and only then
renamed to its own, so under that name it holds a taken lock from the first instant its run lives.
The same holds for a run's scratch folder (`OUT.partial-gptq-<pid>`, GPTQ's values). To replace OUT,
a run first writes a marker into it recording the run and the folder's own identity (device and
inode), then renames it aside to `OUT.replaced-<pid>`.
The next run for the same OUT removes what provably came from a killed run: a partial folder holding
our lock file that it can take, and a replaced folder carrying a marker that names that very folder
and a process that is gone (putting it back as OUT when the new one never took its place). A name
alone proves nothing: a user's folder called `OUT.partial-1` (the source of this very run, say) is
never touched.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from weightsmith.core.errors import OutputError, WeightsmithError
from weightsmith.core.files import open_regular, replace_file

#: Inside a partial folder; locked for as long as the run that made the folder is alive.
LOCK_FILE = ".weightsmith-partial.lock"
#: Inside an OUT a run is replacing: `{"pid", "device", "inode"}` of that run and of the folder itself.
REPLACED_MARKER = ".weightsmith-replaced.json"
#: What every weightsmith checkpoint output holds (manifest.MANIFEST_FILE, which imports far more than this).
MANIFEST_FILE = "weightsmith.json"


def refuse_inside(out: Path, *sources: Path) -> None:
    """Refuse an output that is a source, lies inside one, or contains one: no command writes into its input."""
    out_r = out.resolve()
    for src in sources:
        src_r = src.resolve()
        if out_r == src_r or src_r in out_r.parents:
            raise OutputError(
                f"is inside the source {src}; choose a place outside it", file=out, code="output.inside-source"
            )
        if out_r in src_r.parents:
            raise OutputError(
                f"contains the source {src}; choose another folder", file=out, code="output.contains-source"
            )


#: What `card` writes beside a checkpoint (card.sources' file names; importing it here would load the card).
CARD_FILES = ("README.md", "inspect.json", "verify.json", "eval.json", "bench.json", "preflight.json",
              ".weightsmith-card.json")  # fmt: skip


def not_ours(folder: Path) -> str | None:
    """Why `folder` is not provably a weightsmith output (naming its first entry no run of ours wrote),
    or None when every entry is accounted for: `--force` replaces only such a folder, or an empty one.

    "Ours" is proved by the folder's `weightsmith.json`, read with the manifest reader (an empty or
    copied-in `{}` proves nothing), and by every entry being one that manifest accounts for: the
    shards (the source's shard names), the index and config, the files the run carried over, the
    files `card` writes beside them, and our replace marker. Anything else is someone's.
    """
    from weightsmith.io.checkpoint import CONFIG_FILE, INDEX_FILE
    from weightsmith.io.manifest import load_manifest

    try:
        with os.scandir(folder) as it:
            first = sorted(e.name for e in it)
    except OSError as exc:
        return f"cannot be listed ({exc.strerror})"
    if not first:
        return None
    try:
        if not stat.S_ISREG(os.lstat(folder / MANIFEST_FILE).st_mode):
            return f"its {MANIFEST_FILE} is not a regular file"
        manifest = load_manifest(folder / MANIFEST_FILE)
    except OSError:
        return f"holds {first[0]!r} and no {MANIFEST_FILE}"
    except WeightsmithError:
        return f"its {MANIFEST_FILE} is not a weightsmith manifest"
    ours = {MANIFEST_FILE, CONFIG_FILE, INDEX_FILE, REPLACED_MARKER, *CARD_FILES, *manifest.source.files,
            *manifest.copied_files}  # fmt: skip
    holding = {"/".join(name.split("/")[:i]) for name in ours for i in range(1, name.count("/") + 1)}
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(folder / rel) as it:
            names = sorted(e.name for e in it)
        for name in names:
            key = f"{rel}/{name}" if rel else name
            if key in holding and stat.S_ISDIR(os.lstat(folder / key).st_mode):
                pending.append(key)
            elif key not in ours:
                return f"holds {key!r}, which its {MANIFEST_FILE} does not account for"
    return None


#: What `check_destination` tells a command that has a `--force` replacing its output.
USE_FORCE = "use --force to replace it"
#: ... and one that never replaces an existing `--out` (transplant, calibrate-kv).
CHOOSE_ANOTHER = "choose another --out"


def check_destination(src: Path, out: Path, force: bool, *others: Path, remedy: str = USE_FORCE) -> None:
    """Refuse an output inside a source (`src` or `others`) or containing one; an existing one without
    force, saying the `remedy` this command offers (not every command's `--force` replaces its output);
    and, even with force, one that is not a folder weightsmith wrote or an empty one."""
    refuse_inside(out, src, *others)
    if not os.path.lexists(out):
        return
    if not force:
        raise OutputError(f"already exists ({remedy})", file=out, code="output.exists")
    if not out.is_dir() or out.is_symlink():
        raise OutputError("exists and is not a folder", file=out, code="output.not-dir")
    why = not_ours(out)
    if why is not None:
        raise OutputError(
            f"{why}; --force replaces only a weightsmith output (everything in it accounted for by its "
            f"{MANIFEST_FILE}) or an empty folder",
            file=out,
            code="output.not-ours",
        )


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


def _lock_is_free(folder: Path) -> bool:
    """Whether `folder` holds our lock file (a regular file, not a link) and its lock can be taken:
    the run that made the folder is gone."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:  # none, a link, or something else that is not our lock file: not ours to judge
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _mark(folder: Path) -> None:
    """Write the marker that proves `folder`, once renamed aside, was set aside by this run."""
    st = os.stat(folder)
    record = {"pid": os.getpid(), "device": st.st_dev, "inode": st.st_ino}
    replace_file(folder / REPLACED_MARKER, (json.dumps(record) + "\n").encode())


def _marked_pid(folder: Path) -> int | None:
    """The pid of the run whose marker `folder` carries, when the marker names this very folder
    (a copy, or a marker moved elsewhere, does not); None when it carries no such marker."""
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(os.lstat(folder / REPLACED_MARKER).st_mode):
            return None
        with os.fdopen(open_regular(folder / REPLACED_MARKER), "rb") as f:
            record = json.loads(f.read(4096))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    pid = record.get("pid")
    if (record.get("device"), record.get("inode")) != (st.st_dev, st.st_ino) or type(pid) is not int:
        return None
    return pid


def _is_or_holds(entry: Path, keep: list[Path]) -> bool:
    real = entry.resolve()
    return any(k == real or real in k.parents for k in keep)


def remove_stale(out: Path, keep: Iterable[Path] = ()) -> list[str]:
    """Remove what killed runs for `out` provably left beside it; returns one sentence per folder dealt with.

    Only real folders (not links) named `OUT.partial-<pid>`, `OUT.partial-<purpose>-<pid>` (a scratch
    folder), `.OUT.partial-[<purpose>-]<pid>.new-<random>` (the private name one is made under) and
    `OUT.replaced-<pid>` are looked at, and never one that is or holds a path in `keep` (the run's
    sources). A partial or scratch folder is stale when it holds our lock file and the lock can be taken;
    a private one only once its process is gone (a live run's holds its lock file unlocked for an
    instant), and then also when it is empty (the run was killed before making its lock file; removing
    an empty folder loses nothing). A replaced folder is stale when it carries our marker naming
    itself, from a process that is gone; if OUT itself is missing, it is the previous OUT and is put back
    (its marker removed). A marker left in OUT itself by a run killed before renaming it aside is removed too.
    """
    out = out.resolve()  # as `staged` names its folders
    parent = out.parent
    if not parent.is_dir():
        return []
    kept = [Path(k).resolve() for k in keep]
    name = re.escape(out.name)
    pattern = re.compile(
        rf"{name}\.(partial(?:-[a-z]+)?|replaced)-([0-9]{{1,10}})"
        rf"|\.{name}\.partial(?:-[a-z]+)?-([0-9]{{1,10}})\.new-\w+"
    )
    said: list[str] = []
    for entry in sorted(parent.iterdir()):
        match = pattern.fullmatch(entry.name)
        if match is None or entry.is_symlink() or not entry.is_dir() or _is_or_holds(entry, kept):
            continue
        private = match.group(3) is not None
        pid = int(match.group(3) if private else match.group(2))
        if private and _pid_alive(pid):
            continue
        if private or match.group(1).startswith("partial"):
            if _lock_is_free(entry):
                shutil.rmtree(entry, ignore_errors=True)
            elif not private:
                continue
            else:
                try:
                    os.rmdir(entry)  # fails unless empty: a run killed before making its lock file
                except OSError:
                    continue
            said.append(f"removed {entry.name}, left by an interrupted run (process {pid} is gone)")
            continue
        if _marked_pid(entry) != pid or _pid_alive(pid):
            continue
        if not os.path.lexists(out):
            os.rename(entry, out)
            os.unlink(out / REPLACED_MARKER)
            said.append(f"restored {out.name} from {entry.name}: a run replacing it died before finishing")
        else:
            shutil.rmtree(entry, ignore_errors=True)
            said.append(f"removed {entry.name}, the previous {out.name} left by a run that died replacing it")
    marked = _marked_pid(out)
    if marked is not None and not _pid_alive(marked):
        os.unlink(out / REPLACED_MARKER)
    return said


def _in_the_way(path: Path) -> OutputError:
    return OutputError(
        f"{path.name} is in the way, and is not a leftover of ours; move it elsewhere",
        file=path,
        code="output.in-the-way",
    )


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Create `folder` holding our lock file, taken until the block ends; remove the folder if the block fails.

    The folder is made and locked under a private name beside it and then renamed to `folder`, the
    lock going with the open file: a folder under its own name is never without a taken lock while its
    run lives, so one whose lock is free (or that has none) is never a live run's. The rename replaces
    at most an empty folder that appeared in the meantime, never anyone's files.
    """
    if os.path.lexists(folder):
        raise _in_the_way(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.new-{secrets.token_hex(8)}")
    os.mkdir(staging)  # as `mkdir` would make it (the umask's mode): it becomes OUT
    lock, placed = -1, False
    try:
        lock = os.open(staging / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            os.rename(staging, folder)
        except OSError:
            raise _in_the_way(folder) from None
        placed = True
        yield
    except BaseException:
        shutil.rmtree(folder if placed else staging, ignore_errors=True)
        raise
    finally:
        if lock >= 0:
            os.close(lock)


@contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """Yield a fresh partial folder; on success rename it to `out`, on any failure remove it.

    An existing `out` (only with `force`) is marked and renamed aside, the new one renamed in, and
    the old one removed; a folder already bearing either name and not provably a stale one of ours
    (`remove_stale` ran first) is refused, never removed or renamed over.
    """
    out = out.resolve()
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    old = out.with_name(f"{out.name}.replaced-{os.getpid()}")
    if os.path.lexists(old):
        raise _in_the_way(old)
    with _locked(partial):
        yield partial
        os.unlink(partial / LOCK_FILE)  # the finished folder carries no lock; ours is held until we return
        if os.path.lexists(out):
            if not force:
                raise OutputError("appeared while we were writing; not replaced", file=out, code="output.exists")
            _replace(out, partial, old)
        else:
            os.rename(partial, out)


@contextmanager
def scratch(out: Path, purpose: str) -> Iterator[Path]:
    """Yield a folder beside `out` for what a run computes before writing `out` (`OUT.partial-PURPOSE-<pid>`,
    PURPOSE in lower-case letters), removed however the run ends: locked as a partial folder is, so if
    the run is killed the next run for `out` removes it (`remove_stale`)."""
    out = out.resolve()
    folder = out.with_name(f"{out.name}.partial-{purpose}-{os.getpid()}")
    with _locked(folder):
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _replace(out: Path, partial: Path, old: Path) -> None:
    """Swap `partial` in for `out`: mark `out`, rename it to `old`, rename `partial` to `out`, remove `old`."""
    _mark(out)
    try:
        os.rename(out, old)
    except BaseException:
        os.unlink(out / REPLACED_MARKER)
        raise
    try:
        os.rename(partial, out)
    except BaseException:
        os.rename(old, out)
        os.unlink(out / REPLACED_MARKER)
        raise
    shutil.rmtree(old, ignore_errors=True)
