"""Where a quantize run's time went: the split `--json` reports and the benchmarks print.

The streaming phases run on several worker threads at once, so each is summed over the threads,
in wall seconds and in CPU seconds: a phase whose wall time far exceeds its CPU time waited (on the
disk, or for a core on a busy machine), one whose CPU time is most of it is bound by the processor.
The main thread's own wall time before and after the workers (opening, verifying, writing the
manifest) is the run's fixed cost, with the kernels' load on one worker.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

#: read: source bytes into a buffer; kernel: quantizing (and FP8 decoding, first passes); write:
#: output bytes out, kept tensors copied file to file; fsync: waiting for a shard to reach the disk;
#: load: loading (or compiling) the quantize kernels, once per run.
PHASES = ("read", "kernel", "write", "fsync", "load")


def _zeros() -> dict[str, float]:
    return dict.fromkeys(PHASES, 0.0)


@dataclass
class TimeSplit:
    """Seconds per phase summed over the worker threads, and the main thread's wall around them."""

    wall: dict[str, float] = field(default_factory=_zeros)
    cpu: dict[str, float] = field(default_factory=_zeros)
    #: Main thread, before the workers start (outputs opened, headers written) and after they end
    #: (shards closed, index and config written, output re-read, manifest): the fixed cost.
    before: float = 0.0
    after: float = 0.0
    #: Wall seconds while the workers ran.
    workers: float = 0.0
    #: Wall seconds of a pre-pass over the source before the workers (`--pre-pass`), part of `before`.
    pre_pass: float = 0.0
    #: Seconds from the process's start to its first quantized rows written: what start-up costs a run
    #: (interpreter, imports, plan, kernels' load) before its output begins. 0 until then.
    first_output: float = 0.0
    #: Each hand-over a worker ran, in the order they were handed over: its CPU seconds and whether it
    #: ran a quantize kernel (so had to wait for their load); and the CPU seconds of each pre-pass task:
    #: what a schedule on another number of workers would distribute (benchmarks/worker_scaling.py).
    #: Not in `to_json`.
    tasks: list[tuple[float, bool]] = field(default_factory=list)
    pre_pass_tasks: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time spent inside the block, on this thread, towards `name`."""
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            with self._lock:
                self.wall[name] += wall
                self.cpu[name] += cpu

    @contextmanager
    def task(self, kernels: bool) -> Iterator[None]:
        """Count the CPU seconds of the block, on this thread, as one task (`kernels`: it quantizes)."""
        cpu = time.thread_time()
        try:
            yield
        finally:
            cpu = time.thread_time() - cpu
            with self._lock:
                self.tasks.append((cpu, kernels))

    def first_written(self) -> None:
        """Note the first quantized rows written (the first call counts)."""
        if not self.first_output:
            with self._lock:
                self.first_output = self.first_output or process_seconds()

    def to_json(self) -> dict[str, object]:
        def rounded(d: dict[str, float]) -> dict[str, float]:
            return {k: round(v, 3) for k, v in d.items()}

        out: dict[str, object] = {
            "wall": rounded(self.wall),
            "cpu": rounded(self.cpu),
            "before": round(self.before, 3),
            "workers": round(self.workers, 3),
            "after": round(self.after, 3),
        }
        if self.pre_pass:
            out["pre_pass"] = round(self.pre_pass, 3)
        if self.first_output:
            out["first_output"] = round(self.first_output, 3)
        return out


def process_seconds() -> float:
    """Seconds since this process started (Linux: its start time in /proc, to the clock's tick of 10 ms,
    against the boot clock; elsewhere 0, which the split leaves out)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            started = int(stat.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, IndexError, ValueError, AttributeError):
        return 0.0
    return max(now - started, 0.0)


@contextmanager
def adding(totals: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall seconds spent inside the block to `totals[name]`: the engine's phases, which run
    one after another on the main thread (their own work spread over threads inside)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        totals[name] = totals.get(name, 0.0) + time.perf_counter() - start
