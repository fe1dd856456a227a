"""The `weightsmith` command (and `python -m weightsmith`), answering Ctrl-C at any moment with one line.

The command line imports typer, rich and the named command's modules before click installs its own
interrupt handling; an interrupt during those imports would otherwise print a traceback. This module
imports nothing heavy itself, so the whole start-up sits inside the handler. Python 3.11 wraps an
exception raised in a `__set_name__` (e.g. functools.cached_property's, while a class body of typer or
rich is being built) in a RuntimeError, so an interrupt landing there arrives as that RuntimeError
caused by KeyboardInterrupt; it is answered the same way. An interrupt that a compiled library
swallowed (see `_redelivering`) is raised again.
"""

import gc
import os
import sys

#: `typing.TYPE_CHECKING` without importing typing (as in `weightsmith/__init__`): what this module
#: imports runs before `main` can answer Ctrl-C, so it is only what the interpreter already holds
#: (not `__future__` either, hence the quoted annotation below).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from sys import UnraisableHookArgs
    from typing import NoReturn


def main() -> None:
    try:
        sys.unraisablehook = _redelivering(sys.unraisablehook)
        try:
            from weightsmith.cli import main as run

            try:
                run()
            except SystemExit as stop:
                if _rank_of_several():
                    _leave(stop.code)
                raise
            if _rank_of_several():
                _leave(0)
        finally:  # inside the handler: an interrupt landing here, as the command ends, is one line too
            ending()
    except KeyboardInterrupt:
        interrupted()
    except Exception as error:
        if not _caused_by_interrupt(error):
            raise
        interrupted()


def interrupted() -> "NoReturn":
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


def _redelivering(hook: "Callable[[UnraisableHookArgs], object]") -> "Callable[[UnraisableHookArgs], None]":
    """An unraisable-exception hook that delivers a swallowed Ctrl-C again instead of printing it.

    Code called back from a compiled extension cannot raise into it: an interrupt landing there
    (pydantic-core building typer's parameter validators at start-up, say) is written out as
    "Exception ignored in: ..." with its traceback, and the command went on to finish with exit 0.
    Raised again in the main thread once this hook has returned (from inside the hook, it would be
    swallowed once more), it reaches `main` like any other; so another thread asks for it."""

    def answer(unraisable: "UnraisableHookArgs") -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            import _thread  # built in, already loaded by the interpreter

            _thread.start_new_thread(_thread.interrupt_main, ())
        else:
            hook(unraisable)

    return answer


def _rank_of_several() -> bool:
    """Whether this process is one rank of a run of several (torchrun's or `--processes`')."""
    size = os.environ.get("WORLD_SIZE", "").strip()
    return size.isdigit() and int(size) > 1


def _leave(code: object) -> "NoReturn":
    """End a rank now, its streams flushed, without the interpreter's teardown.

    Its work is done (the output written and renamed by rank 0, the process group destroyed), but
    torch's gloo threads can still be joinable while the interpreter tears down, and C++ then aborts
    ("terminate called without an active exception", SIGABRT): 1 run in 6 of a test that ran two
    ranks, turning a finished run into a failed one."""
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  (contextlib is not among what the interpreter has loaded)
            stream.flush()
        except (OSError, ValueError):
            pass
    if code is not None and not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        sys.stderr.flush()
        code = 1
    os._exit(code or 0)


def ending() -> None:
    """Called as the process ends: ignores Ctrl-C from here on (the command's work is over, and an
    interrupt during interpreter shutdown would print a traceback no handler can catch), and freezes
    the gc, so that shutdown does not walk every object numba loaded (0.1-0.2 s of a 1.5 s quantize;
    the OS frees the memory either way). Not in `cli.main`, which tests call in-process."""
    import signal  # here, inside main's handler: imported at the top, it would run before it

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()


if __name__ == "__main__":
    main()
