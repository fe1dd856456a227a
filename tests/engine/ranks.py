"""Ranks in tests: a free port for a world to meet on, and one rank among the processes `--processes`
started, found from /proc, to kill it at a chosen point."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def rank_pid(launcher: int, rank: int, *, reading: str = "") -> int:
    """The pid of the launcher's child that is rank `rank`, once it holds a socket (it has joined the
    world, the first thing a rank does) and, with `reading`, a file whose name ends so (a shard: it runs
    the model)."""
    mark = f"RANK={rank}".encode()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for pid in map(int, Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()):
            try:
                if mark not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    continue
                fds = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
            except OSError:  # it ended, or an fd closed while listed
                continue
            if any(f.startswith("socket:") for f in fds) and (not reading or any(f.endswith(reading) for f in fds)):
                return pid
        time.sleep(0.01)
    raise AssertionError(f"rank {rank} never got there")


def free_port() -> int:
    """A TCP port free on localhost now, for a world's MASTER_PORT."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
