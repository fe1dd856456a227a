"""Run model-written Python in a separate, fenced-off process (the `python_tests` check).

A model's completion is untrusted code: it may loop forever, eat memory, fork without end, reach
for the network or a service's socket, read the user's secrets, write over their files, or end its
process early to look as if it passed. Each program runs:

- in a fresh temporary folder, with an empty environment, under `python -I -S` (no site
  packages, no PYTHON* variables, no user site);
- in new user, network and PID namespaces (`unshare -rn --pid --fork --kill-child`): no
  network interface but a loopback that is down, no other process to see or signal, and every
  process it started dies with it;
- under a seccomp filter (`syscall_filter.py`): no socket of any family can be made, so no Unix
  socket on the host (Docker's, the session bus, X11) is reachable either;
- in a control group (`cgroups.py`) that bounds the whole program, every process it forks
  included: at most MAX_PROCESSES processes and MEMORY_BYTES of memory between them; where no
  group can be made (not root), in one process (RLIMIT_NPROC) whose address space RLIMIT_AS bounds;
- under rlimits: CPU seconds, address space, open files, file size, no core dumps;
- under Landlock: it may write only inside its folder, and read only there, in the interpreter's
  own installation and in the system's libraries (`/usr`, `/lib`);
- killed at a wall-clock limit.

It passes only when the harness, after the program and its checks returned, writes a token drawn
for this run on a channel of its own; an exit status or printed text cannot forge that.

Without the namespaces, Landlock, the seccomp filter or (for root) the control group,
`python_tests` refuses to run unless the user allows it (`--allow-unsandboxed`); the rlimits, the
folder, the empty environment, the token and the time limit apply either way. What this does not
guard against is written in docs/bench.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from weightsmith.bench.quality import cgroups, syscall_filter
from weightsmith.core.errors import WeightsmithError

#: What the program may use; generous for a unit test, small enough that a runaway stops soon.
TIME_LIMIT_S = 10.0
#: The memory of the whole program (all its processes) under a control group, and of each process.
MEMORY_BYTES = 1 << 30
MAX_PROCESSES = 32
MAX_FILE_BYTES = 16 << 20
MAX_OPEN_FILES = 64
#: How much of the program's output is kept for the one-line detail.
_OUTPUT_TAIL = 4000
_PROGRAM = "program.py"
#: The bytes of the pass token: 128 bits, drawn for each run.
_TOKEN_BYTES = 16

#: Runs inside the sandbox before the program (stdlib only: it starts under `-I -S`). It reads the
#: run's token from stdin (then points stdin at /dev/null), applies Landlock and the seccomp filter
#: (when asked), then the rlimits, runs the program as `__main__`, and only once the program
#: returned writes the token to the result descriptor.
_HARNESS = r"""
import ctypes, os, resource, sys
landlock, cpu, mem, nproc, fsize, nofile, result = (int(a) for a in sys.argv[1:8])
syscalls = bytes.fromhex(sys.argv[8])
readable = sys.argv[9:]
token = sys.stdin.buffer.read()
null = os.open("/dev/null", os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
here = os.getcwd()
libc = ctypes.CDLL(None, use_errno=True)

def lock():
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

def filter_syscalls():
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    code = ctypes.create_string_buffer(syscalls, len(syscalls))
    program = Program(len(syscalls) // 8, ctypes.addressof(code))
    # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:
        raise SystemExit("sandbox: cannot apply the seccomp filter")

if landlock:
    lock()
if syscalls:
    filter_syscalls()
for name, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_NPROC, nproc),
                    (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(name, (value, value))
del ctypes, resource, libc, syscalls
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
os.write(result, token)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
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


#: Run inside the full sandbox by `unavailable`: it passes only where the seccomp filter is in place.
_PROBE = """\
import socket
try:
    socket.socket(socket.AF_UNIX)
except PermissionError:
    pass
else:
    raise SystemExit("a socket could be made")
"""


@functools.cache
def unavailable() -> str | None:
    """Why the full sandbox cannot run on this machine (None when it can): checked once, by
    running a program that needs each guard in place."""
    if _unshare() is None:
        return "unshare cannot create user, network and PID namespaces here"
    try:
        syscall_filter.program()
    except syscall_filter.FilterUnavailable as exc:
        return f"no seccomp filter: {exc}"
    if os.geteuid() == 0:
        with cgroups.program_group(MAX_PROCESSES, MEMORY_BYTES) as group:
            if group is None:
                return "running as root and no memory and pids cgroup can be made to bound the program"
    probe = run_program(_PROBE, sandboxed=True)
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


def run_program(source: str, *, sandboxed: bool, time_limit_s: float = TIME_LIMIT_S) -> RunOutcome:
    """Run `source` as a program in a fresh folder; passed when it runs to its end within the limits.

    Unsandboxed (the user's `--allow-unsandboxed`), the program still gets whichever of the seccomp
    filter and the control group this machine has, and runs as one process where it has no group."""
    folder = tempfile.mkdtemp(prefix="weightsmith-sandbox-")
    try:
        Path(folder, _PROGRAM).write_text(source, encoding="utf-8")
        tool = _unshare() if sandboxed else None
        if sandboxed and tool is None:
            return RunOutcome(False, "sandbox unavailable: unshare cannot create namespaces")
        try:
            syscalls = syscall_filter.program()
        except syscall_filter.FilterUnavailable as exc:
            if sandboxed:
                return RunOutcome(False, f"sandbox unavailable: {exc}")
            syscalls = b""
        with cgroups.program_group(MAX_PROCESSES, MEMORY_BYTES) as group:
            if sandboxed and group is None and os.geteuid() == 0:
                return RunOutcome(False, "sandbox unavailable: no cgroup to bound the program")
            # Without a group, one process: RLIMIT_AS then bounds the whole program.
            harness = _harness(time_limit_s, MAX_PROCESSES if group else 1, syscalls, landlock=sandboxed)
            argv = [tool, *NAMESPACE_FLAGS, *harness] if tool is not None else harness
            return _run(argv, folder, time_limit_s, group)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _harness(time_limit_s: float, processes: int, syscalls: bytes, *, landlock: bool) -> list[str]:
    """The harness's command line, its result descriptor left as `{result}` for `_run` to fill."""
    limits = [str(max(1, int(time_limit_s))), str(MEMORY_BYTES), str(processes), str(MAX_FILE_BYTES)]
    return [
        _interpreter(), "-I", "-S", "-c", _HARNESS,
        "1" if landlock else "0", *limits, str(MAX_OPEN_FILES), "{result}", syscalls.hex(),
        *(_readable_roots() if landlock else []),
    ]  # fmt: skip


def _run(argv: list[str], folder: str, time_limit_s: float, group: list[str] | None) -> RunOutcome:
    token = secrets.token_hex(_TOKEN_BYTES).encode("ascii")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as result:
        argv = [str(result.fileno()) if a == "{result}" else a for a in argv]
        proc = subprocess.Popen(
            argv,
            cwd=folder,
            env={},
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=(result.fileno(),),
            start_new_session=True,
            preexec_fn=functools.partial(cgroups.join, group) if group else None,
        )
        timed_out = None
        try:
            _send(proc, token)
            proc.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = time_limit_s
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(max(0, out.seek(0, os.SEEK_END) - _OUTPUT_TAIL))
        output = out.read().decode("utf-8", "replace")
        written = os.pread(result.fileno(), len(token) + 1, 0)
    if written == token and timed_out is None:
        return RunOutcome(True, "")
    return RunOutcome(False, _detail(proc.returncode, output, timed_out))


def _send(proc: subprocess.Popen[bytes], token: bytes) -> None:
    """Hand the harness its token on stdin and close it; a harness that already died did not pass."""
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(token)
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
