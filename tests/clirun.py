"""Running the command line in-process from tests, as a user would from a shell."""

from __future__ import annotations

import signal
import sys

import pytest

from weightsmith import cli


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: object) -> tuple[int, str, str]:
    """`weightsmith ARGS...`: exit status, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["weightsmith", *map(str, args)])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def sigint_default() -> None:
    """`preexec_fn` of a child a test interrupts: SIGINT back to its default disposition.

    An ignored signal stays ignored across exec, and a background `make test` starts with SIGINT
    ignored: a child left with that would never see the interrupt the test sends it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_error_line(err: str) -> str:
    """The single `error: ...` line a bad input must produce."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]
