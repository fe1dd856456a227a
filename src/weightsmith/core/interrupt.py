"""SIGTERM ends a command as Ctrl-C does, so that whatever Ctrl-C cleans up is cleaned up either way.

A scheduler, `timeout` or `kill` sends SIGTERM, whose default action ends the process at once: a
partial output folder would stay behind until the next run, a server bench started (in its own
process group) would keep running, and nothing measured would be written.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, the first SIGTERM raises KeyboardInterrupt where the command is.

    Later ones are ignored, so that they cannot cut short the clean-up the first one started. The
    previous handler is restored on leaving, so a caller in the same process is left as it was.
    """
    received = False

    def handler(signum: int, frame: object) -> None:
        nonlocal received
        if not received:
            received = True
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
