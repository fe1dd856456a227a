"""Output folders that appear whole or not at all.

Work happens in `OUT.partial-<pid>` beside OUT (same filesystem, so the final rename is atomic);
only a verified result is renamed into place. Any failure, Ctrl-C included, removes the partial
folder, and an existing OUT is only replaced when asked.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from weightsmith.errors import OutputError


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


@contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """Yield a fresh partial folder; on success rename it to `out`, on any failure remove it."""
    out = out.resolve()
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        if not force:
            shutil.rmtree(partial, ignore_errors=True)
            raise OutputError("appeared while we were writing; not replaced", file=out, code="output.exists")
        old = out.with_name(f"{out.name}.replaced-{os.getpid()}")
        os.rename(out, old)
        os.rename(partial, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(partial, out)
