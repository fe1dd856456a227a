"""Run model-written Python in a separate, fenced-off process (the `python_tests` check).

A model's completion is untrusted code: it may loop forever, eat memory, fork without end, reach
for the network, read the user's secrets or write over their files. Each program runs:

- in a fresh temporary folder, with an empty environment, under `python -I -S` (no site
  packages, no PYTHON* variables, no user site);
- in new user, network and PID namespaces (`unshare -rn --pid --fork --kill-child`): no
  network interface but a loopback that is down, no other process to see or signal, and every
  process it started dies with it;
- under rlimits: CPU seconds, address space, open files, file size, no core dumps, and a process
  count (RLIMIT_NPROC; for root, whom the kernel exempts from that limit, a `pids` cgroup);
- under Landlock: it may write only inside its folder, and read only there, in the interpreter's
  own installation and in the system's libraries (`/usr`, `/lib`);
- killed at a wall-clock limit.

Without the namespaces or Landlock, `python_tests` refuses to run unless the user allows it
(`--allow-unsandboxed`); the rlimits, the folder, the empty environment and the time limit apply
either way. What this does not guard against is written in docs/bench.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from weightsmith.core.errors import WeightsmithError

#: What the program may use; generous for a unit test, small enough that a runaway stops soon.
TIME_LIMIT_S = 10.0
MEMORY_BYTES = 1 << 30
MAX_PROCESSES = 32
MAX_FILE_BYTES = 16 << 20
MAX_OPEN_FILES = 64
#: How much of the program's output is kept for the one-line detail.
_OUTPUT_TAIL = 4000
_PROGRAM = "program.py"
_CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")

#: The harness's exit status once the whole program ran: a program that exits 0 early (`exit()`,
#: `sys.exit(0)` before its tests) must not pass, so 0 is not the success status.
DONE = 77

#: Runs inside the sandbox before the program (stdlib only: it starts under `-I -S`). It applies
#: Landlock (when asked), then the rlimits, then runs the program as `__main__`.
_HARNESS = r"""
import ctypes, os, resource, sys
landlock, cpu, mem, nproc, fsize, nofile, done = (int(a) for a in sys.argv[1:8])
readable = sys.argv[8:]
here = os.getcwd()

def lock():
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(444, None, 0, 1)
    if abi < 1:
        raise SystemExit("sandbox: Landlock is not available")
    write = 0b1_1111_1111_0010 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    read = 0b1101  # execute, read file, read dir
    handled = ctypes.c_uint64(write | read)
    ruleset = libc.syscall(444, ctypes.byref(handled), 8, 0)
    if ruleset < 0:
        raise SystemExit("sandbox: cannot create a Landlock ruleset")

    class Beneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]

    def allow(path, rights):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        if not os.path.isdir(path):
            rights &= 0b100_0000_0000_0111  # a file takes file rights only
        rule = Beneath(rights, fd)
        if libc.syscall(445, ruleset, 1, ctypes.byref(rule), 0) != 0:
            raise SystemExit("sandbox: cannot add a Landlock rule for " + path)
        os.close(fd)

    allow(here, write | read)
    for path in readable:
        allow(path, read)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, ruleset, 0) != 0:
        raise SystemExit("sandbox: cannot apply Landlock")

if landlock:
    lock()
for name, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_NPROC, nproc),
                    (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(name, (value, value))
del ctypes, resource
sys.argv = ["program.py"]
try:
    with open("program.py") as f:
        code = compile(f.read(), "program.py", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit as exc:
    if exc.code in (None, 0):
        print("SystemExit: the program exited before its tests finished", file=sys.stderr)
        os._exit(1)
    raise
sys.stdout.flush()
sys.stderr.flush()
os._exit(done)
"""


@dataclass(frozen=True)
class RunOutcome:
    """How one program ended: passed when it ran to its end; `detail` says why not in a few words."""

    passed: bool
    detail: str


def _interpreter() -> str:
    """The interpreter the sandbox runs: this one, resolved (the venv's site is not used: `-S`)."""
    return os.path.realpath(sys.executable)


def _readable_roots() -> list[str]:
    """Where the program may read besides its folder: the interpreter's installation (its
    standard library and extension modules) and the system's shared libraries."""
    roots = {sys.base_prefix, sysconfig.get_paths()["stdlib"], os.path.dirname(_interpreter())}
    roots.update(("/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/dev/null", "/dev/urandom"))
    return sorted(r for r in roots if os.path.exists(r))


@contextlib.contextmanager
def _pids_cgroup() -> Iterator[str | None]:
    """A `pids` cgroup capped at MAX_PROCESSES, for root (whom RLIMIT_NPROC does not bind), or None."""
    if os.geteuid() != 0:
        yield None
        return
    made = None
    for root in _CGROUP_ROOTS:
        path = os.path.join(root, f"weightsmith-sandbox-{uuid.uuid4().hex[:12]}")
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(MAX_PROCESSES))
            made = path
            break
        except OSError:
            os.rmdir(path)
    try:
        yield made
    finally:
        if made is not None:
            for _ in range(50):  # the killed namespace's processes leave the cgroup shortly
                try:
                    os.rmdir(made)
                    break
                except OSError:
                    time.sleep(0.05)


#: `unshare` flags: a new user namespace mapped to root (`-r`), no network (`-n`), and a PID
#: namespace whose processes all die with the test (`--pid --fork --kill-child`).
NAMESPACE_FLAGS = ("-rn", "--pid", "--fork", "--kill-child")


@functools.cache
def _unshare() -> str | None:
    """`unshare` if it can make the namespaces here (it cannot in some containers), else None."""
    tool = shutil.which("unshare")
    if tool is None:
        return None
    probe = [tool, *NAMESPACE_FLAGS, _interpreter(), "-I", "-S", "-c", "pass"]
    try:
        done = subprocess.run(probe, env={}, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tool if done.returncode == 0 else None


@functools.cache
def unavailable() -> str | None:
    """Why the full sandbox cannot run on this machine (None when it can): checked once, by
    running a program that needs each guard in place."""
    if _unshare() is None:
        return "unshare cannot create user, network and PID namespaces here"
    if os.geteuid() == 0:
        with _pids_cgroup() as cgroup:
            if cgroup is None:
                return "running as root and no pids cgroup can be made to cap the number of processes"
    probe = run_program("import socket\nsocket.socket().close()\n", sandboxed=True)
    if not probe.passed:
        return f"a trivial program fails in the sandbox ({probe.detail})"
    return None


def require(allow_unsandboxed: bool) -> bool:
    """Whether programs run sandboxed; refuses (one line) when they cannot be and the user did not
    allow it."""
    reason = unavailable()
    if reason is None:
        return True
    if not allow_unsandboxed:
        raise WeightsmithError(
            f"python_tests would run model-written code without its sandbox ({reason}); "
            "pass --allow-unsandboxed to run it anyway",
            code="usage",
        )
    return False


def _detail(returncode: int, output: str, timed_out: float | None) -> str:
    if timed_out is not None:
        return f"timed out after {timed_out:g} s"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}" + (f": {last}" if last else "")
    if returncode == 0:
        return "the program ended its process before its tests finished"
    return (last or f"exit status {returncode}")[:200]


def _limit_args() -> list[str]:
    return [str(MAX_PROCESSES), str(MAX_FILE_BYTES), str(MAX_OPEN_FILES), str(DONE)]


def run_program(source: str, *, sandboxed: bool, time_limit_s: float = TIME_LIMIT_S) -> RunOutcome:
    """Run `source` as a program in a fresh folder; passed when it runs to its end within the limits."""
    folder = tempfile.mkdtemp(prefix="weightsmith-sandbox-")
    try:
        Path(folder, _PROGRAM).write_text(source, encoding="utf-8")
        cpu = str(max(1, int(time_limit_s)))
        harness = [_interpreter(), "-I", "-S", "-c", _HARNESS, "1" if sandboxed else "0", cpu, str(MEMORY_BYTES)]
        argv = [*harness, *_limit_args(), *(_readable_roots() if sandboxed else [])]
        if sandboxed:
            tool = _unshare()
            if tool is None:
                return RunOutcome(False, "sandbox unavailable: unshare cannot create namespaces")
            argv = [tool, *NAMESPACE_FLAGS, *argv]
        with _pids_cgroup() as cgroup:
            return _run(argv, folder, time_limit_s, cgroup)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(argv: list[str], folder: str, time_limit_s: float, cgroup: str | None) -> RunOutcome:
    def enter_cgroup() -> None:
        if cgroup is not None:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            argv,
            cwd=folder,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=enter_cgroup if cgroup is not None else None,
        )
        timed_out = None
        try:
            proc.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = time_limit_s
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(max(0, out.seek(0, os.SEEK_END) - _OUTPUT_TAIL))
        output = out.read().decode("utf-8", "replace")
    if proc.returncode == DONE and timed_out is None:
        return RunOutcome(True, "")
    return RunOutcome(False, _detail(proc.returncode, output, timed_out))
