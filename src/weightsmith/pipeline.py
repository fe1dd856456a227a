"""The streaming quantize run: plan -> shard writers -> parallel tensor work -> verify -> rename.

Every output header is fixed before any data moves (the plan knows every output dtype and shape),
so work items can run in any order on any thread and write with positional writes. A work item is
one kept tensor (copied file to file by the kernel) or a block of rows of one weight (read into a
thread's reused buffer, decoded, quantized by a GIL-free kernel, written). Memory is bounded by
`workers` row blocks, whatever the size of the model.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from weightsmith import names
from weightsmith.checkpoint import CONFIG_FILE, INDEX_FILE, Checkpoint
from weightsmith.errors import CheckpointError, OutputError
from weightsmith.manifest import build_manifest, hash_files, write_manifest
from weightsmith.outputdir import check_destination, check_space, staged
from weightsmith.plan import DECODE, KEEP, QUANTIZE, Plan
from weightsmith.quant import fp8, int4
from weightsmith.safetensors.header import TensorInfo
from weightsmith.safetensors.reader import ShardReader
from weightsmith.safetensors.writer import ShardWriter

#: Input bytes per row block: large enough to amortise calls, small enough to bound memory.
BLOCK_BYTES = 32 << 20
#: llm-compressor writes no `__metadata__`; we match it so the shards are byte-identical.
SHARD_METADATA: dict[str, str] = {}

Progress = Callable[[int], None]


@dataclass
class _Job:
    """One unit of work: a whole kept tensor, or rows [r0, r1) of one weight."""

    decision_index: int
    r0: int = 0
    r1: int = 0
    nbytes: int = 0


class _Scratch(threading.local):
    """Per-thread reusable buffers, grown on demand (fresh pages cost more than the math)."""

    def get(self, key: str, nbytes: int) -> np.ndarray:
        buf = self.__dict__.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 1), np.uint8)
            self.__dict__[key] = buf
        return buf[:nbytes]


def _jobs(plan: Plan) -> list[_Job]:
    jobs: list[_Job] = []
    for i, d in enumerate(plan.decisions):
        info = plan.source.tensors[d.name].info
        if d.action == KEEP:
            jobs.append(_Job(i, nbytes=info.nbytes))
        elif d.action in (QUANTIZE, DECODE):
            rows = info.shape[0]
            row_bytes = max(info.nbytes // max(rows, 1), 1)
            step = max(int4.PACK, (BLOCK_BYTES // row_bytes) // int4.PACK * int4.PACK)
            jobs.extend(
                _Job(i, r0, min(r0 + step, rows), min(step, rows - r0) * row_bytes) for r0 in range(0, rows, step)
            )
    # Biggest first, so a long tensor does not start last and leave one worker busy alone.
    jobs.sort(key=lambda j: -j.nbytes)
    return jobs


class _Runner:
    """Executes the jobs of one plan against open readers and writers."""

    def __init__(self, plan: Plan, readers: dict[str, ShardReader], writers: dict[str, ShardWriter]) -> None:
        self.plan = plan
        self.readers = readers
        self.writers = writers
        self.scratch = _Scratch()
        self.cancelled = threading.Event()

    def run(self, job: _Job) -> int:
        if self.cancelled.is_set():
            return 0
        d = self.plan.decisions[job.decision_index]
        ref = self.plan.source.tensors[d.name]
        reader, writer = self.readers[ref.shard], self.writers[d.shard]
        if d.action == KEEP:
            writer.copy(d.name, reader.fd, ref.info.offset, ref.info.nbytes)
        elif d.action == DECODE:
            writer.write(d.name, self._decoded_rows(d, ref.info, reader, job), job.r0 * ref.info.shape[1] * 2)
        else:
            self._quantize(d, ref.info, reader, writer, job)
        return job.nbytes

    def _rows(self, info: TensorInfo, reader: ShardReader, job: _Job, key: str = "in") -> np.ndarray:
        dtype = info.dtype.numpy
        cols = info.shape[1]
        buf = self.scratch.get(key, (job.r1 - job.r0) * cols * dtype.itemsize).view(dtype)
        return reader.read_rows(info, job.r0, job.r1, buf)

    def _decoded_rows(self, d, info: TensorInfo, reader: ShardReader, job: _Job) -> np.ndarray:
        """FP8 rows as BF16, using the weight's scale tensor."""
        scale_ref = self.plan.source.tensors[d.scale]
        with_scale = self.readers[scale_ref.shard].read(d.scale)
        return fp8.dequantize_rows(self._rows(info, reader, job), with_scale, job.r0, self.plan.source_format.block)

    def _quantize(self, d, info: TensorInfo, reader: ShardReader, writer: ShardWriter, job: _Job) -> None:
        scheme = self.plan.scheme
        g = scheme.group_size
        rows, cols = info.shape
        x = self._decoded_rows(d, info, reader, job) if d.scale else self._rows(info, reader, job)
        mode = int4.mode_of(x.dtype)
        n = job.r1 - job.r0
        packed = self.scratch.get("packed", n * cols // 2).view(np.uint32).reshape(n, cols // int4.PACK)
        scale = self.scratch.get("scale", n * (cols // g) * 4).view(np.float32).reshape(n, cols // g)
        zp = self.scratch.get("zp", n * (cols // g)).view(np.int8).reshape(n, cols // g)
        bad = int4.quantize_rows(int4.kernel_input(x), mode, g, scheme.symmetric, packed, scale, zp)
        if bad >= 0:
            r, c = job.r0 + bad // cols, bad % cols
            raise CheckpointError(
                f"has a NaN or Inf at row {r}, column {c}; cannot quantize it",
                file=self.plan.source.path(d.shard),
                tensor=d.name,
                code="value.non-finite",
            )
        module = d.module
        writer.write(f"{module}.{names.WEIGHT_PACKED}", packed, job.r0 * (cols // int4.PACK) * 4)
        stored_scale = int4.scale_storage(scale, mode)
        writer.write(f"{module}.{names.WEIGHT_SCALE}", stored_scale, job.r0 * (cols // g) * stored_scale.itemsize)
        if not scheme.symmetric:
            zp_packed = int4.pack_nibbles(zp, axis=0)
            writer.write(f"{module}.{names.WEIGHT_ZERO_POINT}", zp_packed, (job.r0 // int4.PACK) * (cols // g) * 4)
        if job.r0 == 0:
            writer.write(f"{module}.{names.WEIGHT_SHAPE}", np.array([rows, cols], np.int64))


@dataclass
class QuantizeResult:
    """What a run produced, for the summary line and `--json`."""

    output: Path
    manifest: dict


def _write_index(plan: Plan, folder: Path) -> None:
    weight_map = {s.name: shard for shard, specs in plan.shards().items() for s in specs}
    index = {"metadata": {"total_size": plan.bytes_out}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _write_config(plan: Plan, folder: Path) -> None:
    config = dict(plan.source.config)
    config["quantization_config"] = plan.quantization_config()
    if plan.source_format.kind != "dense":
        config["torch_dtype"] = "bfloat16"
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")


def _copy_other_files(ckpt: Checkpoint, folder: Path) -> list[str]:
    copied = []
    for rel in ckpt.other_files():
        dst = folder / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ckpt.root / rel, dst)  # follows symlinks: the output holds real files
        copied.append(str(rel))
    return copied


def verify_output(plan: Plan, folder: Path) -> Checkpoint:
    """Re-read what was written: headers parse strictly, sizes match, index resolves both ways."""
    out = Checkpoint.open(folder)
    expected = {s.name: (s.dtype, s.shape) for specs in plan.shards().values() for s in specs}
    actual = {name: (ref.info.dtype.code, ref.info.shape) for name, ref in out.tensors.items()}
    if expected != actual:
        missing = sorted(set(expected) - set(actual))[:3]
        raise OutputError(
            f"verification failed: written tensors differ from the plan (e.g. {missing})",
            file=folder,
            code="output.verify",
        )
    if plan.source.index is not None and out.tensor_bytes != out.index["metadata"]["total_size"]:
        raise OutputError(
            "verification failed: index total_size disagrees with the shards", file=folder, code="output.verify"
        )
    return out


def execute(
    plan: Plan, out: Path, *, workers: int, force: bool, progress: Progress | None = None, hash_sources: bool = True
) -> QuantizeResult:
    """Write the quantized checkpoint described by `plan` to `out`, atomically."""
    src = plan.source
    check_destination(src.root, out, force)
    other_bytes = sum((src.root / rel).stat().st_size for rel in src.other_files())
    check_space(out, plan.bytes_out + other_bytes + (1 << 20))
    workers = max(1, workers)
    try:
        with staged(out, force) as folder:
            readers = {shard: ShardReader(src.path(shard), h) for shard, h in src.headers.items()}
            writers: dict[str, ShardWriter] = {}
            try:
                for shard, specs in plan.shards().items():
                    writers[shard] = ShardWriter(folder / shard, specs, SHARD_METADATA)
                runner = _Runner(plan, readers, writers)
                with ThreadPoolExecutor(
                    max_workers=workers + (1 if hash_sources else 0), thread_name_prefix="ws"
                ) as pool:
                    hashes = pool.submit(hash_files, [src.path(s) for s in src.headers]) if hash_sources else None
                    futures = [pool.submit(runner.run, job) for job in _jobs(plan)]
                    try:
                        pending = set(futures)
                        while pending:
                            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                            for f in done:
                                if f.exception() is not None:
                                    raise f.exception()
                                if progress is not None:
                                    progress(f.result())
                    except BaseException:
                        runner.cancelled.set()
                        for f in futures:
                            f.cancel()
                        raise
                    source_hashes = hashes.result() if hashes is not None else {}
            finally:
                for r in readers.values():
                    r.close()
                for w in writers.values():
                    w.close()
            if src.index is not None:
                _write_index(plan, folder)
            _write_config(plan, folder)
            _copy_other_files(src, folder)
            written = verify_output(plan, folder)
            manifest = build_manifest(plan, written, source_hashes)
            write_manifest(folder, manifest)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OutputError(
                "ran out of disk space while writing; nothing was left behind", file=out, code="output.no-space"
            ) from None
        raise OutputError(
            f"could not be written ({exc.strerror or exc})", file=exc.filename or out, code="output.io"
        ) from None
    return QuantizeResult(out, manifest)


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
