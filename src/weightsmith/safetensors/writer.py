"""A safetensors writer whose header is fixed before any data is written.

Because every output tensor's dtype and shape is known from the plan, the whole layout (header,
offsets, file size) is computed up front. Workers then fill tensors with positional writes in any
order, from any thread, and kept tensors are copied file-to-file by the kernel. Layout and header
bytes follow the reference writer (safetensors `prepare`): tensors ordered by descending dtype
position then name, compact JSON with `__metadata__` first, padded with spaces to a multiple of 8.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core.files import create_new
from weightsmith.core.lazy import lazy_module
from weightsmith.safetensors.dtypes import DTYPES, WRITE_ORDER

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


COPY_CHUNK = 64 << 20
_FADVISE = hasattr(os, "posix_fadvise")
#: A write's pages are dropped from the page cache again this many writes later, once on disk.
RECYCLE_AFTER = 4


@dataclass(frozen=True)
class TensorSpec:
    """What one output tensor will be."""

    name: str
    dtype: str  # safetensors code
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = DTYPES[self.dtype].nbytes(math.prod(self.shape))
        if n is None:
            raise ValueError(f"{self.name}: {self.dtype} {self.shape} does not end on a byte boundary")
        return n


def layout(specs: list[TensorSpec], metadata: dict[str, str] | None) -> tuple[bytes, dict[str, int]]:
    """The header bytes (length prefix included) and each tensor's offset in the data buffer."""
    ordered = sorted(specs, key=lambda s: (-WRITE_ORDER[s.dtype], s.name))
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = dict(metadata)
    offsets: dict[str, int] = {}
    cursor = 0
    for s in ordered:
        if s.name in offsets:
            raise ValueError(f"tensor {s.name} specified twice")
        offsets[s.name] = cursor
        doc[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [cursor, cursor + s.nbytes]}
        cursor += s.nbytes
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, offsets


class ShardWriter:
    """One new safetensors file `folder/name`, created at its final size; fill tensors with `write`/`copy`.

    `name` may come from a stranger's index, so it must be a relative path below `folder`, and the
    file must not exist yet: `create_new` refuses anything else rather than write through a link
    or over a file (a source shard, a user's file) that an unchecked name would reach.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        name: str,
        specs: list[TensorSpec],
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(folder) / name
        self.specs = {s.name: s for s in specs}
        head, offsets = layout(specs, metadata)
        self.data_start = len(head)
        self.offsets = offsets
        self.size = self.data_start + sum(s.nbytes for s in specs)
        self._fd = create_new(Path(folder), name)
        _pwrite_all(self._fd, memoryview(head), 0)
        os.ftruncate(self._fd, self.size)
        self._synced = False  # True while nothing was written since the last fsync
        self._written: deque[tuple[int, int]] = deque()  # ranges whose pages may still be cached
        self._written_lock = threading.Lock()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def position(self, name: str, start: int = 0) -> int:
        """Absolute file offset of byte `start` of tensor `name`."""
        return self.data_start + self.offsets[name] + start

    def write(self, name: str, data: np.ndarray | bytes | memoryview, start: int = 0) -> None:
        """Write bytes of tensor `name`, beginning at byte `start` of the tensor."""
        view = byte_view(data) if isinstance(data, np.ndarray) else memoryview(data).cast("B")
        if start + view.nbytes > self.specs[name].nbytes:
            raise ValueError(f"write past the end of {name}")
        self._synced = False
        _pwrite_all(self._fd, view, self.position(name, start))
        self._write_back(self.position(name, start), view.nbytes)

    def copy(self, name: str, src_fd: int, src_offset: int, nbytes: int) -> None:
        """Copy `nbytes` from another file into tensor `name`, in the kernel where it can."""
        if nbytes != self.specs[name].nbytes:
            raise ValueError(f"{name}: copying {nbytes} bytes into a {self.specs[name].nbytes}-byte tensor")
        dst, done = self.position(name), 0
        self._synced = False
        try:
            while done < nbytes:
                got = os.copy_file_range(src_fd, self._fd, nbytes - done, src_offset + done, dst + done)
                if got == 0:
                    break
                done += got
        except OSError as exc:
            if exc.errno not in (18, 22, 38, 95):  # EXDEV, EINVAL, ENOSYS, EOPNOTSUPP: fall back
                raise
        buf = bytearray(min(COPY_CHUNK, max(nbytes - done, 1)))
        while done < nbytes:
            view = memoryview(buf)[: min(len(buf), nbytes - done)]
            got = os.preadv(src_fd, [view], src_offset + done)
            if got == 0:
                raise OSError(f"source ended early while copying {name}")
            _pwrite_all(self._fd, view[:got], dst + done)
            done += got
        self._write_back(dst, nbytes)

    def _write_back(self, pos: int, nbytes: int) -> None:
        """Start writing these bytes to disk now, while the rest is computed, so that `sync` at
        the end finds little left to wait for (Linux starts the writeback on DONTNEED: the pages
        are not read again), and drop the pages of a range written a few writes ago, on disk by
        now. DONTNEED only drops pages already written back, so without the second call the
        output's pages stay cached and every write fills fresh ones, which costs more than the
        copy into them (twice the CPU on a virtual machine that hands free memory back to its
        host). Elsewhere a no-op."""
        if not _FADVISE:
            return
        os.posix_fadvise(self._fd, pos, nbytes, os.POSIX_FADV_DONTNEED)
        with self._written_lock:
            self._written.append((pos, nbytes))
            old = self._written.popleft() if len(self._written) > RECYCLE_AFTER else None
        if old is not None:
            os.posix_fadvise(self._fd, old[0], old[1], os.POSIX_FADV_DONTNEED)

    def sync(self) -> None:
        """Flush the file's data to disk (before the output folder is renamed into place).

        Not concurrent with writes to the same file: call it once they are done.
        """
        if not self._synced:
            os.fsync(self._fd)
            self._synced = True
            if _FADVISE:  # all on disk now: free the file's pages for what is written next
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
                self._written.clear()

    def close(self, sync: bool = True) -> None:
        if self._fd >= 0:
            try:
                if sync:
                    self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1


def byte_view(array: np.ndarray) -> memoryview:
    """A flat byte view of an array of any dtype (bf16 and fp8 arrays export no buffer format)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _pwrite_all(fd: int, view: memoryview, pos: int) -> None:
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], pos + done)
