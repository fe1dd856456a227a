"""`--processes P`: one command line run as P ranks of one world on this machine, as torchrun would.

Each rank is `python -m weightsmith ARGS` with torchrun's variables set (RANK, WORLD_SIZE, a free
localhost port as MASTER_PORT), so a rank cannot tell this launcher from torchrun. The launcher
watches them: when one ends badly it stops the rest (they would otherwise wait in a collective until
the timeout) and reports one line that names that rank. Ranks run in sessions of their own, so a
Ctrl-C reaches the launcher alone, which stops them and prints one line, not one per rank; on Linux
each rank is also killed if the launcher itself dies.

What the ranks print goes to files without a name (`tempfile.TemporaryFile`), which the kernel frees
when the launcher and its ranks are gone, `kill -9` included: a folder of logs would outlive a killed
launcher, and nothing could prove later whose it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from enum import Enum
from pathlib import Path
from typing import IO, NamedTuple

from typer._click.globals import get_current_context  # typer carries its own copy of click

from weightsmith.core import cores
from weightsmith.core.errors import WeightsmithError
from weightsmith.engine.distributed import PEER_LOST, Job

#: Seconds the other ranks get to end after SIGTERM before SIGKILL.
GRACE = 5.0
#: Seconds between looks at the ranks.
POLL = 0.02
#: Options the ranks of one run may give differently: how a rank runs or reports, not what is written.
PER_RANK = frozenset({"workers", "peer_timeout", "processes", "json_out"})
#: How a line that already names its rank begins (a lost peer, a job the ranks disagree on).
NAMES_A_RANK = re.compile(r"rank \d+ of \d+\b")


class Shown(NamedTuple):
    """What rank 0 printed: the command's report, which the launcher prints as its own."""

    out: str
    err: str


def launching(processes: int) -> bool:
    """Whether this command line is to start `processes` ranks of itself: more than one asked for, and
    it is not itself a rank (torchrun's or this launcher's)."""
    return processes > 1 and "WORLD_SIZE" not in os.environ


def job(command: str, src: Path, out: Path) -> Job:
    """This command line's `Job`, for the ranks to compare when they join: `command`, SRC and OUT as
    absolute paths, and every option of the running command as parsed (so neither their order nor
    their spelling matters), less those in `PER_RANK`.

    The options come from click's context, so one added to a command is compared without a word here;
    called outside a command line (a test calling the command's function) there are none.
    """
    context = get_current_context(silent=True)
    options: list[tuple[str, str]] = []
    if context is not None:
        for param in context.command.params:
            if param.param_type_name == "option" and param.name in context.params and param.name not in PER_RANK:
                options.append((param.opts[0], _shown(context.params[param.name])))
    return Job(command, Path(os.path.abspath(src)), Path(os.path.abspath(out)), tuple(options))


def _shown(value: object) -> str:
    """An option's parsed value as a refusal names it (paths absolute: the ranks may start elsewhere)."""
    if value is None:
        return "(not given)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, Path):
        return os.path.abspath(value)
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, list | tuple):
        return json.dumps([_shown(item) for item in value])  # ["a, b"] is not ["a", "b"]
    return str(value)


def relay(processes: int) -> None:
    """This command line run as `processes` ranks, rank 0's output printed as this process's own."""
    shown = ranks(sys.argv[1:], processes)
    sys.stdout.write(shown.out)
    sys.stderr.write(shown.err)


def ranks(args: list[str], processes: int) -> Shown:
    """Run `python -m weightsmith ARGS` as `processes` ranks; rank 0's stdout and stderr once all succeeded.

    Each rank gets an equal part of this machine's cores as its torch threads (OMP_NUM_THREADS, unless
    set; torchrun gives each 1): P ranks of all cores each would fight over them. Raises a
    `WeightsmithError` naming the first rank that failed.
    """
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(processes))
    env.update(LOCAL_WORLD_SIZE=str(processes))
    env.setdefault("OMP_NUM_THREADS", str(cores.per_rank(processes)))
    dying = _die_with_parent()
    with ExitStack() as files:
        errs = [files.enter_context(tempfile.TemporaryFile()) for _ in range(processes)]
        out = files.enter_context(tempfile.TemporaryFile())  # rank 0's: what the command prints
        children: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(processes):
                children.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "weightsmith", *args],
                        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                        stdin=subprocess.DEVNULL,
                        stdout=out if rank == 0 else subprocess.DEVNULL,
                        stderr=errs[rank],
                        start_new_session=True,
                        preexec_fn=dying,
                    )
                )
            failed = _watch(children)
            suspended = _suspended(children)  # now: stopping the ranks ends their stops
        finally:
            _stop(children)
        lines, printed = [_read(err) for err in errs], _read(out)
    if failed:
        raise WeightsmithError(_culprit(children, failed, lines, suspended), code="distributed.rank")
    return Shown(printed, lines[0])


def _read(log: IO[bytes]) -> str:
    """All a rank wrote to `log` (its offset is the rank's, now at the end)."""
    log.seek(0)
    return log.read().decode(errors="replace")


def _free_port() -> int:
    """A TCP port free on localhost now (the OS's pick), for rank 0's rendezvous store."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> Callable[[], None] | None:
    """What a child runs before exec so that Linux sends it SIGKILL when the launcher ends, however it
    ends (None elsewhere). libc is loaded here, in the launcher: between fork and exec a child may
    not import (another thread may hold the import lock)."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGKILL)


def _watch(children: list[subprocess.Popen[bytes]]) -> list[int]:
    """Wait until every rank succeeded (returns []) or some failed (returns those ended badly so far)."""
    while True:
        codes = [child.poll() for child in children]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed or all(code == 0 for code in codes):
            return failed
        time.sleep(POLL)


def _suspended(children: list[subprocess.Popen[bytes]]) -> dict[int, str]:
    """The ranks stopped by a signal now (SIGSTOP, SIGTSTP, ...), each with the signal's name.

    Such a rank answers nobody, and it is the rank that timed out waiting for it that fails first:
    the launcher looks, without reaping (WNOWAIT), where the system can say (`os.waitid`)."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return {}
    found: dict[int, str] = {}
    for rank, child in enumerate(children):
        if child.returncode is not None:
            continue
        try:
            state = waitid(os.P_PID, child.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            continue
        if state is not None and state.si_code in (os.CLD_STOPPED, os.CLD_TRAPPED):
            found[rank] = _signal_name(state.si_status)
    return found


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    """End every rank still running: SIGTERM (and SIGCONT, so a stopped rank acts on it), then SIGKILL
    for any still there after `GRACE`."""
    for child in children:
        if child.poll() is None:
            child.terminate()
            child.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + GRACE
    for child in children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _culprit(
    children: list[subprocess.Popen[bytes]], failed: list[int], logs: list[str], suspended: dict[int, str]
) -> str:
    """One line for the rank that ended the run: of those seen failing together, one killed by a
    signal, else one that failed on its own, before one that failed because another rank ended; and a
    rank that was stopped (and so answered nobody) before one that gave up waiting for it."""
    size = len(children)

    def error(rank: int) -> str | None:
        lines = [line for line in logs[rank].splitlines() if line.startswith("error: ")]
        return lines[-1].removeprefix("error: ") if lines else None

    def order(rank: int) -> tuple[int, int]:
        code = children[rank].returncode
        line = error(rank)
        return (0 if code < 0 else 2 if line is not None and PEER_LOST in line else 1, rank)

    rank = min(failed, key=order)
    code, line = children[rank].returncode, error(rank)
    if code < 0:
        return f"rank {rank} of {size} was killed by {_signal_name(-code)}; the other ranks were stopped"
    if suspended and line is not None and PEER_LOST in line:
        stopped = min(suspended)
        why = f"was suspended by {suspended[stopped]} and did not answer"
        return f"rank {stopped} of {size} {why}; the other ranks were stopped"
    if line is not None:
        return line if NAMES_A_RANK.match(line) else f"rank {rank} of {size}: {line}"
    tail = [text for text in logs[rank].splitlines() if text.strip()]
    return f"rank {rank} of {size} exited with status {code}" + (f" ({tail[-1][:200]})" if tail else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"
