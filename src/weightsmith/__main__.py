"""The `weightsmith` command (and `python -m weightsmith`), answering Ctrl-C at any moment with one line.

The command line imports typer, rich and the named command's modules before click installs its own
interrupt handling; an interrupt during those imports would otherwise print a traceback. This module
imports nothing heavy itself, so the whole start-up sits inside the handler.
"""

from __future__ import annotations

import gc
import sys


def main() -> None:
    try:
        from weightsmith.cli import main as run

        run()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    finally:
        ending()


def ending() -> None:
    """Called as the process ends: freezes the gc, so that interpreter shutdown does not walk every
    object numba loaded (0.1-0.2 s of a 1.5 s quantize; the OS frees the memory either way).
    Not in `cli.main`, which tests call in-process."""
    gc.freeze()


if __name__ == "__main__":
    main()
