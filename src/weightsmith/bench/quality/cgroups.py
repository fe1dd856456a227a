"""A control group that bounds a whole sandboxed program, every process it forks included.

rlimits bind one process each: RLIMIT_AS of 1 GiB with 32 processes allowed let a program that
forks hold 32 GiB. A cgroup counts the program's processes together: `pids` caps how many there
are, `memory` caps the memory they hold between them (swap included, where the kernel accounts it),
and past it the kernel's OOM killer ends one of them. Version 1 (a hierarchy per controller) and
version 2 (one unified hierarchy) are both handled; where neither lets this process make a group
(not root, no delegated controllers), `program_group` yields None and the sandbox falls back to a
single process (RLIMIT_NPROC), whose address space RLIMIT_AS bounds.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

CONTROLLERS = ("memory", "pids")


@dataclass(frozen=True)
class _Hierarchy:
    """One mounted cgroup hierarchy: where it is mounted, this process's group in it, and which
    of CONTROLLERS it carries (version 1: one or several; version 2: those it offers)."""

    mount: str
    own: str
    controllers: tuple[str, ...]
    unified: bool


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def _own_groups() -> dict[str, str]:
    """This process's group per hierarchy, keyed by controller (`''` for version 2)."""
    groups: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                groups[controller] = path
    return groups


def _hierarchies() -> list[_Hierarchy]:
    """The mounted hierarchies that carry CONTROLLERS, version 2 first."""
    own = _own_groups()
    found: list[_Hierarchy] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, kind = left.split(), right.split()
            if len(fields) < 5 or len(kind) < 3:
                continue
            mount = _unescape(fields[4])
            if kind[0] == "cgroup2":
                try:
                    with open(os.path.join(mount, "cgroup.controllers"), encoding="utf-8") as c:
                        offered = c.read().split()
                except OSError:
                    continue
                carried = tuple(c for c in CONTROLLERS if c in offered)
                found.insert(0, _Hierarchy(mount, own.get("", "/"), carried, unified=True))
            elif kind[0] == "cgroup":
                carried = tuple(c for c in CONTROLLERS if c in kind[2].split(","))
                if carried:
                    found.append(_Hierarchy(mount, own.get(carried[0], "/"), carried, unified=False))
    return found


def _limits(hierarchy: _Hierarchy, processes: int, memory_bytes: int) -> list[tuple[str, str, bool]]:
    """(file, value, required) to write into a new group of `hierarchy`, in order: version 1 wants
    the memory limit before the memory-and-swap limit, which may not exist (no swap accounting)."""
    writes: list[tuple[str, str, bool]] = []
    if "pids" in hierarchy.controllers:
        writes.append(("pids.max", str(processes), True))
    if "memory" in hierarchy.controllers:
        if hierarchy.unified:
            writes += [("memory.max", str(memory_bytes), True), ("memory.swap.max", "0", False)]
        else:
            writes += [
                ("memory.limit_in_bytes", str(memory_bytes), True),
                ("memory.memsw.limit_in_bytes", str(memory_bytes), False),
            ]
    return writes


def _make(hierarchy: _Hierarchy, processes: int, memory_bytes: int) -> str | None:
    """A new group in `hierarchy` with the limits written, under this process's own group where it
    can be made there (so outer limits still apply), else under the hierarchy's root; None if neither."""
    parents = [os.path.join(hierarchy.mount, hierarchy.own.lstrip("/")), hierarchy.mount]
    for parent in dict.fromkeys(os.path.normpath(p) for p in parents):
        if hierarchy.unified and not _enable(parent):
            continue
        path = os.path.join(parent, f"weightsmith-sandbox-{uuid.uuid4().hex[:12]}")
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            for name, value, required in _limits(hierarchy, processes, memory_bytes):
                target = os.path.join(path, name)
                if not required and not os.path.exists(target):
                    continue
                with open(target, "w", encoding="ascii") as f:
                    f.write(value)
        except OSError:
            _remove(path)
            continue
        return path
    return None


def _enable(parent: str) -> bool:
    """Whether a version-2 group's children get both controllers (turned on where the kernel allows)."""
    control = os.path.join(parent, "cgroup.subtree_control")
    try:
        with open(control, encoding="ascii") as f:
            if set(CONTROLLERS) <= set(f.read().split()):
                return True
        with open(control, "w", encoding="ascii") as f:
            f.write(" ".join(f"+{c}" for c in CONTROLLERS))
        return True
    except OSError:
        return False


def _remove(path: str) -> None:
    """Remove a group once its processes have left it (a killed program's leave shortly)."""
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


@contextlib.contextmanager
def program_group(processes: int, memory_bytes: int) -> Iterator[list[str] | None]:
    """The groups (one per hierarchy) a program's first process must join so that it and all its
    descendants hold at most `processes` processes and `memory_bytes` between them; None where
    both controllers cannot be had. The groups are removed on exit."""
    made: list[str] = []
    try:
        try:
            hierarchies = _hierarchies()
        except OSError:
            hierarchies = []
        unified = [h for h in hierarchies if h.unified and set(h.controllers) == set(CONTROLLERS)]
        chosen = unified[:1] or [h for h in hierarchies if not h.unified]
        covered: set[str] = set()
        for hierarchy in chosen:
            if covered >= set(CONTROLLERS):
                break
            path = _make(hierarchy, processes, memory_bytes)
            if path is not None:
                made.append(path)
                covered.update(hierarchy.controllers)
        yield made if covered >= set(CONTROLLERS) else None
    finally:
        for path in made:
            _remove(path)


def join(groups: list[str]) -> None:
    """Move the calling process into `groups` (run in the child between fork and exec)."""
    for path in groups:
        with open(os.path.join(path, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
