"""How many cores this process may use: the one count every default thread and rank count starts from."""

from __future__ import annotations

import os


def usable() -> int:
    """The cores this process may run on: its CPU affinity (a container's or taskset's share), else the machine's."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def per_rank(ranks: int) -> int:
    """Each of `ranks` processes' equal part of the usable cores, at least one: ranks that each took
    every core would fight over them."""
    return max(1, usable() // max(1, ranks))
