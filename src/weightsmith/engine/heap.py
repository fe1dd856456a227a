"""glibc's allocator told to keep freed memory for the next allocation, for GPTQ's layer-streamed run.

Running a layer allocates and frees the same activations, up to tens of MiB each, again and again.
By default glibc returns a freed block above its mmap threshold (128 KiB, adapting up to 32 MiB) to
the kernel at once, trims the top of the heap past twice that, and gives each thread an arena of
its own; so the next allocation of the same size faults every page in afresh, and a page fault in
a virtual machine is dear. A GPTQ run on SmolLM2-135M (2,048 tokens, 2 cores; `/usr/bin/time -v`
on benchmarks/gptq_speed.py's command line, with `keep_freed_memory` returning at once and as it
is) took 700k minor page faults and 4.8 s of system time; with blocks up to 32 MiB served from the
heap, its top trimmed only past 256 MiB and one arena for every thread, 190k faults and 2.4 s, at
the same peak RSS (the memory is reused instead of handed back and faulted in again).

Process-wide and kept: the command runs in a process of its own. The cost is memory kept for
reuse: up to 256 MiB free at the heap's top, and whatever the reuse leaves fragmented (blocks over
32 MiB, a large layer's weights, still go back at once); `calibrate` and `eval --stream`, whose
peaks are measured against a bound (docs/engine.md), leave glibc as it is. Elsewhere than glibc
nothing is changed.
"""

from __future__ import annotations

import ctypes
import platform
from functools import cache

#: mallopt's parameters (malloc.h) and the values set.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
SETTINGS = {
    M_MMAP_THRESHOLD: 32 * 2**20,  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
    M_TRIM_THRESHOLD: 256 * 2**20,
    M_ARENA_MAX: 1,
}


@cache
def keep_freed_memory() -> bool:
    """Set `SETTINGS` through glibc's mallopt, once; whether every one was taken."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return all(mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1 for param, value in SETTINGS.items())
