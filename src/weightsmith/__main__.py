"""The `weightsmith` command (and `python -m weightsmith`), answering Ctrl-C at any moment with one line.

The command line imports typer, rich and the named command's modules before click installs its own
interrupt handling; an interrupt during those imports would otherwise print a traceback. This module
imports nothing heavy itself, so the whole start-up sits inside the handler. Python 3.11 wraps an
exception raised in a `__set_name__` (e.g. functools.cached_property's, while a class body of typer or
rich is being built) in a RuntimeError, so an interrupt landing there arrives as that RuntimeError
caused by KeyboardInterrupt; it is answered the same way.
"""

from __future__ import annotations

import gc
import signal
import sys
from typing import NoReturn


def main() -> None:
    try:
        try:
            from weightsmith.cli import main as run

            run()
        finally:  # inside the handler: an interrupt landing here, as the command ends, is one line too
            ending()
    except KeyboardInterrupt:
        interrupted()
    except Exception as error:
        if not _caused_by_interrupt(error):
            raise
        interrupted()


def interrupted() -> NoReturn:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None


def _caused_by_interrupt(error: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in the exception's explicit cause chain (bounded: chains can loop)."""
    seen: set[int] = set()
    cause = error.__cause__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False


def ending() -> None:
    """Called as the process ends: ignores Ctrl-C from here on (the command's work is over, and an
    interrupt during interpreter shutdown would print a traceback no handler can catch), and freezes
    the gc, so that shutdown does not walk every object numba loaded (0.1-0.2 s of a 1.5 s quantize;
    the OS frees the memory either way). Not in `cli.main`, which tests call in-process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()


if __name__ == "__main__":
    main()
