"""File names a checkpoint hands us, and the only ways we open files they name.

An index's `weight_map` is a stranger's text, and its shard names are joined onto folders we read
and write. Joined unchecked, `../model.safetensors` or `/home/me/notes.txt` makes a writer truncate
the source or a neighbour, and a FIFO named like a shard makes every reader hang. So:
- every name joined onto a folder passes `name_problem` (the one rule for names) and `outside`;
- every read opens through `open_regular`, which refuses anything but a regular file (after
  following a final link: a hub-cache snapshot's shards are links into its blob store);
- every output file is made by `create_new`: inside its folder, never over an existing file and
  never through a link; a file replaced in place (`replace_file`) is written beside it that way and
  renamed over it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
from pathlib import Path

from weightsmith.core.errors import OutputError, WeightsmithError

#: Flags for a file we create: fail rather than reuse or follow whatever is already there.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


#: The most bytes a JSON file we read whole may hold (config.json, the index, hf_quant_config.json,
#: weightsmith.json, a bench results file): the reference reader's cap on one shard header, which
#: an index of 500,000 tensors (`MAX_TENSORS`) stays well below.
MAX_JSON_BYTES = 100_000_000

#: Linux's NAME_MAX, and a bound on a whole relative name that leaves room for its folder in PATH_MAX.
MAX_PART_BYTES = 255
MAX_NAME_BYTES = 1024


class NotRegularFile(OSError):
    """A path that names a folder, FIFO, device or socket where a file's bytes were expected."""


def name_problem(name: object) -> str | None:
    """Why `name` is not a relative file path below a folder, or None when it is.

    A name is a plain file name, or plain names joined by `/`. Refused: anything but a non-empty
    string; an absolute path; `.`, `..` or empty parts (`a//b`, a trailing `/`); a backslash (a
    separator on Windows, a trick here); NUL and other control characters (they also break a
    one-line message); a lone surrogate (not a file name any filesystem can hold); a part longer
    than Linux allows (NAME_MAX) or a whole name long enough to overflow a path.
    """
    if not isinstance(name, str):
        return f"is {type(name).__name__}, not a file name"
    if not name:
        return "is empty"
    if name.startswith("/"):
        return "is an absolute path"
    if "\\" in name:
        return "holds a backslash"
    if any(ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF for c in name):
        return "holds a control character or a lone surrogate"
    parts = name.split("/")
    if len(name.encode()) > MAX_NAME_BYTES or any(len(p.encode()) > MAX_PART_BYTES for p in parts):
        return "is longer than a file name can be"
    if ".." in parts:
        return "climbs out of its folder (..)"
    if "." in parts or "" in parts:
        return "is not a plain path (an empty or '.' part)"
    return None


def outside(root: Path, name: str) -> str | None:
    """Why `root/name` leaves `root` once its folders' links are resolved, or None when it stays inside.

    The last part may be a link to a file anywhere (a hub cache's blob store); the folders on the
    way to it may not lead out of `root`. `name` must already pass `name_problem`.
    """
    parent = (root / name).parent
    if parent == root:
        return None
    try:
        real, real_root = parent.resolve(), root.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a link loop
        return "lies in a folder that cannot be resolved (a link loop?)"
    if real != real_root and real_root not in real.parents:
        return f"lies in a folder that leads out of the checkpoint (to {real})"
    return None


def exists(path: Path) -> bool:
    """Whether `path` leads to something; an error other than "no such file" counts as yes, so that
    the read that follows reports it (`Path.exists` raises on most of them)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file at `path` (a final link is followed).

    `stat` comes first, so a FIFO or device is never opened; the open itself is non-blocking and
    re-checked, so one swapped in between cannot hang us either.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(errno.EINVAL, f"is {kind(mode)}, not a regular file", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"is {kind(mode)}, not a regular file", str(path))
    return fd


class TooLarge(OSError):
    """A regular file larger than its reader's cap."""


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path` (see `open_regular`), refused past `limit` bytes.

    Every file we read whole is a stranger's, and its size is theirs to choose: a 3 GiB config.json
    read whole costs gigabytes of memory before its first byte is parsed. So the size is checked
    before anything is read (`TooLarge`), and no more than `limit + 1` bytes are ever read, so a
    file that grows meanwhile costs no more.
    """
    with os.fdopen(open_regular(path), "rb") as f:
        if os.fstat(f.fileno()).st_size > limit:
            raise TooLarge(errno.EFBIG, f"is larger than {limit:,} bytes", str(path))
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(errno.EFBIG, f"is larger than {limit:,} bytes", str(path))
    return data


def read_text_file(path: Path, limit: int, what: str, *, code: str | None = None) -> str:
    """The UTF-8 text of the regular file at `path`, read no further than `limit` bytes.

    A user names these files, so each failure is one line naming `path` and `what` it is meant to be:
    missing or unreadable (`cannot read {what}: ...`, a folder or FIFO included: see `open_regular`),
    larger than `limit`, or not UTF-8. Only `limit + 1` bytes are ever read, so a huge file costs nothing.
    `code` is the errors' code (`WeightsmithError.code`).
    """
    try:
        data = read_regular(path, limit)
    except TooLarge:
        raise WeightsmithError(f"{what} is larger than {limit} bytes", file=path, code=code) from None
    except OSError as exc:
        raise WeightsmithError(f"cannot read {what}: {exc.strerror}", file=path, code=code) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WeightsmithError(f"{what} is not UTF-8 text (byte {exc.start})", file=path, code=code) from None


def create_new(folder: Path, name: str) -> int:
    """A write descriptor of the new file `folder/name`, making the folders below `folder` it needs.

    Refuses a name that is not a relative path below `folder`, an existing file, and a link (at
    the file or at any folder on the way), so nothing outside `folder` can be written through it.
    """
    _make_folders(folder, name)
    return os.open(folder / name, CREATE_FLAGS, 0o644)


def _make_folders(folder: Path, name: str) -> None:
    """Check `name` (`name_problem`) and make the folders below `folder` it needs, refusing a link among them."""
    why = name_problem(name)
    if why is not None:
        raise OutputError(f"refusing to write {name!r}: the name {why}", file=folder, code="output.unsafe-name")
    parent = folder
    for part in name.split("/")[:-1]:
        parent = parent / part
        try:
            os.mkdir(parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(parent).st_mode):
                raise OutputError(
                    f"refusing to write {name!r}: {part} is a link or not a folder",
                    file=folder,
                    code="output.unsafe-name",
                ) from None


def open_append(folder: Path, name: str) -> int:
    """A descriptor appending to the regular file `folder/name`, created when missing (a log).

    The rules of `create_new`, except that an existing regular file is appended to: a link (at the
    file or a folder on the way) is refused, and a FIFO or device is never written to or waited on.
    """
    _make_folders(folder, name)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(folder / name, flags, 0o644)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"is {kind(mode)}, not a regular file", str(folder / name))
    return fd


def write_new(folder: Path, name: str, data: bytes) -> None:
    """Write `data` to the new file `folder/name` (see `create_new`)."""
    with os.fdopen(create_new(folder, name), "wb") as f:
        f.write(data)


def write_json_new(folder: Path, name: str, doc: object) -> None:
    """Write `doc` as indented JSON to the new file `folder/name` (see `create_new`)."""
    write_new(folder, name, (json.dumps(doc, indent=2) + "\n").encode())


def copy_new(source: Path, folder: Path, name: str) -> None:
    """Copy the regular file `source` to the new file `folder/name` (see `open_regular`, `create_new`)."""
    with os.fdopen(open_regular(source), "rb") as src, os.fdopen(create_new(folder, name), "wb") as dst:
        shutil.copyfileobj(src, dst)


def temporary_name(path: Path) -> str:
    """A fresh, unpredictable name for a file written beside `path` before it is renamed over it.

    Never derived from the pid or anything else a user could hold a file under: the caller creates
    it with `write_new` (`O_EXCL`, so an existing entry of that name is never reused or removed) and
    removes only the file it created. The visible part is cut short, so the name always fits.
    """
    return f".{path.name[:100]}.{secrets.token_hex(8)}.partial"


def check_file_name(path: Path) -> None:
    """Refuse, before any work, an output file whose name no filesystem here can hold."""
    if len(os.fsencode(path.name)) > MAX_PART_BYTES:
        raise OutputError(
            f"the file name is longer than {MAX_PART_BYTES} bytes", file=path, code="output.name-too-long"
        )


def replace_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all: into a new file beside it, then renamed over it.

    A reader (or a crash) never sees half a file, and a link at `path` is replaced rather than
    followed, so nothing outside the folder is written through it. The file written first has a
    fresh name (`temporary_name`): a file of the user's is never opened or removed in its stead.
    The mode of a file replaced is kept. A failure (a full disk, a read-only folder) is one line
    naming `path`, with the previous file, if any, left as it was.
    """
    try:
        check_file_name(path)
        for _ in range(8):  # another name on the unlikely clash; an existing entry is never reused
            partial = path.parent / temporary_name(path)
            try:
                write_new(path.parent, partial.name, data)
            except FileExistsError:
                continue
            except BaseException:
                partial.unlink(missing_ok=True)  # ours: `write_new` made it, under a name no one else held
                raise
            break
        else:
            raise FileExistsError(errno.EEXIST, "no fresh temporary name could be made", str(path))
        try:
            _keep_mode(path, partial)
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OutputError(
                "could not be written: the disk is full; the previous file, if any, is as it was",
                file=path,
                code="output.no-space",
            ) from None
        raise OutputError(f"could not be written ({exc.strerror or exc})", file=path, code="output.io") from None


def _keep_mode(path: Path, partial: Path) -> None:
    """Give the new file `partial` the permission bits of the regular file at `path`, when there is one."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        os.chmod(partial, stat.S_IMODE(st.st_mode))


#: Bytes kept as they are in a file-name part made from a name (`file_part`); every other is `~XX`.
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-.")


def file_part(text: str) -> str:
    """`text` (an arm name, a sweep value: anything from an input) as one safe file-name part.

    Letters, digits and `_+-.` stay; every other UTF-8 byte, `~` itself and a leading `.` become
    `~XX`, so the part never holds `/`, is never `.`, `..` or hidden, and distinct texts give distinct
    parts. One too long for a file name is cut and ends in a digest of the whole text.
    """
    raw = text.encode("utf-8", "surrogatepass")
    part = "".join(chr(b) if b in _PLAIN and not (i == 0 and b == ord(".")) else f"~{b:02X}" for i, b in enumerate(raw))
    if len(part) > 200:
        part = part[:180] + "~" + hashlib.sha256(raw).hexdigest()[:16]
    return part or "~"
