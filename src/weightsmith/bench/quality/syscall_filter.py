"""The seccomp filter model-written code runs under: no sockets of any family, and no way around that.

Landlock (the sandbox's file rule) does not cover `connect()` on a socket file, and a network
namespace isolates only sockets that do not live in the filesystem, so without this filter a program
could reach the Docker socket, the session bus or an X11 socket on the host. A unit-test program
needs no socket at all, so every call that makes, connects or accepts one fails with EPERM; io_uring,
which can open and connect sockets without any call a filter sees, cannot be set up; and a few
calls that reach shared kernel state (keyrings, BPF, perf, userfaultfd) are denied as well.

The filter is compiled here by libseccomp (through `pyseccomp`) into a classic BPF program; the
sandbox's harness, which runs under `python -I -S` with no site packages, loads those bytes with
`prctl(PR_SET_SECCOMP)` before the program starts. A system call of another ABI (i386's `int 0x80`,
x32) than the filter's native one kills the process, so the 32-bit `socketcall` is not a way out.
"""

from __future__ import annotations

import errno
import functools
import tempfile

#: Each denied call fails with this errno, so Python raises PermissionError and the detail says so.
DENIED_ERRNO = errno.EPERM

#: What the program may not call, and why (one reason per group).
DENIED: dict[str, tuple[str, ...]] = {
    "no socket of any family, and nothing to connect one with": (
        "socket",
        "socketpair",
        "connect",
        "bind",
        "listen",
        "accept",
        "accept4",
    ),
    "io_uring opens and connects sockets out of a filter's sight": (
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
    ),
    "kernel state shared beyond the sandbox": (
        "add_key",
        "request_key",
        "keyctl",
        "bpf",
        "perf_event_open",
        "userfaultfd",
    ),
}


class FilterUnavailable(Exception):
    """libseccomp (or its Python binding) is missing, or refused to compile the filter."""


@functools.cache
def program() -> bytes:
    """The filter as a classic BPF program (8 bytes an instruction), ready for PR_SET_SECCOMP."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:  # pyseccomp raises RuntimeError without libseccomp
        raise FilterUnavailable(f"libseccomp cannot be loaded ({exc})") from exc
    try:
        rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        rules.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
        for calls in DENIED.values():
            for call in calls:
                rules.add_rule(pyseccomp.ERRNO(DENIED_ERRNO), call)
        with tempfile.TemporaryFile() as out:
            rules.export_bpf(out)
            out.seek(0)
            code = out.read()
    except OSError as exc:
        raise FilterUnavailable(f"libseccomp could not compile the filter ({exc})") from exc
    if not code or len(code) % 8:
        raise FilterUnavailable(f"libseccomp wrote a filter of {len(code)} bytes, not whole instructions")
    return code
