"""The streaming quantize run: plan -> shard writers -> parallel tensor work -> verify -> rename.

Every output header is fixed before any data moves (the plan knows every output dtype and shape),
so work items can run in any order on any thread and write with positional writes. A work item is
one kept tensor (copied file to file by the kernel) or a block of rows of one weight (read into a
thread's reused buffer, decoded, quantized by a GIL-free kernel, written). Memory is bounded by
`workers` row blocks, whatever the size of the model.
"""

from __future__ import annotations

import errno
import functools
import math
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core import cores
from weightsmith.core.errors import OutputError
from weightsmith.core.files import copy_new, write_json_new
from weightsmith.core.lazy import lazy_module
from weightsmith.core.timesplit import TimeSplit
from weightsmith.io.checkpoint import CONFIG_FILE, INDEX_FILE, Checkpoint
from weightsmith.io.manifest import MANIFEST_FILE, Manifest, MethodRecord, hash_files, write_manifest
from weightsmith.io.outputdir import check_destination, check_space, remove_stale, staged
from weightsmith.io.provenance import Provenance
from weightsmith.quant import fp8
from weightsmith.quantization.manifest import build_manifest
from weightsmith.quantization.plan import DECODE, KEEP, QUANTIZE, Decision, Plan
from weightsmith.quantization.prepasses import PRE_PASSES, Transform
from weightsmith.quantization.warm import encode_block, on_compile
from weightsmith.safetensors.header import TensorInfo
from weightsmith.safetensors.reader import ShardReader
from weightsmith.safetensors.writer import ShardWriter
from weightsmith.schemes.base import FUSED, TENSOR, Chosen, Scheme, fused_members

if TYPE_CHECKING:
    import ml_dtypes
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")
    ml_dtypes = lazy_module("ml_dtypes")


#: Input bytes per row block: large enough to amortise calls, small enough that a block read,
#: quantized and written stays in the processor's caches (32 MiB blocks cost 10% more CPU).
BLOCK_BYTES = 4 << 20
#: Small jobs are handed to the workers together, up to these many bytes or jobs per hand-over.
BATCH_BYTES, BATCH_JOBS = 4 << 20, 1024
#: llm-compressor writes no `__metadata__`; we match it so the shards are byte-identical.
SHARD_METADATA: dict[str, str] = {}

Progress = Callable[[int], None]
#: Told, before numba compiles a scheme's kernels for a dtype (not in its cache), which they are.
CompileNotice = Callable[[Scheme, "np.dtype"], None]


@dataclass
class _Job:
    """One unit of work: a whole kept tensor, rows [r0, r1) of one weight, or a whole weight."""

    decision_index: int
    r0: int = 0
    r1: int = 0
    nbytes: int = 0


@dataclass
class _FirstPass:
    """A FUSED scheme's first pass over one fused set (q/k/v, gate/up, or a weight alone): every
    member's whole tensor observed, then concluded; its encode jobs run as soon as it is done."""

    targets: list[_Job]
    then: list[_Job]
    nbytes: int


_Item = _Job | _FirstPass


class _Scratch(threading.local):
    """Per-thread reusable buffers, grown on demand (fresh pages cost more than the math)."""

    def get(self, key: str, nbytes: int) -> np.ndarray:
        buf = self.__dict__.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 1), np.uint8)
            self.__dict__[key] = buf
        return buf[:nbytes]


def _matrix(info: TensorInfo) -> tuple[int, int]:
    """A quantized weight's (out, in): the plan quantizes 2-D weights only."""
    rows, cols = info.shape
    return rows, cols


def _row_blocks(info: TensorInfo, multiple: int = 1) -> Iterator[tuple[int, int]]:
    """Row ranges of about BLOCK_BYTES each, cut at multiples of 8 and of `multiple` rows (`ROW_MULTIPLE`).

    Only tensors with values are split (the plan keeps every zero-size tensor whole), so the number
    of blocks is at most the tensor's bytes / 8: bounded by the file, whatever its header declares.
    """
    rows = info.shape[0]
    row_bytes = max(info.nbytes // max(rows, 1), 1)
    multiple = math.lcm(8, multiple)  # 8: FP8 row blocks of the source start at multiples of 8 too
    step = max(multiple, (BLOCK_BYTES // row_bytes) // multiple * multiple)
    return ((r0, min(r0 + step, rows)) for r0 in range(0, rows, step))


def _scheme(d: Decision) -> Scheme:
    """The scheme that quantizes a QUANTIZE decision (its recipe rule's)."""
    assert d.rule is not None, d.name
    return d.rule.scheme


def _row_multiple(d: Decision) -> int:
    return _scheme(d).ROW_MULTIPLE if d.action == QUANTIZE else 1


def _jobs(plan: Plan) -> list[_Job]:
    jobs: list[_Job] = []
    for i, d in enumerate(plan.decisions):
        info = plan.source.tensors[d.name].info
        # TENSOR: the scheme sees all of a tensor's rows before it encodes any, in one job
        whole = d.action == QUANTIZE and _scheme(d).first_pass == TENSOR
        if info.nbytes == 0:  # nothing to read or write: one job, so the shard still counts it done
            jobs.append(_Job(i))
        elif d.action == KEEP or whole:  # a 0-d tensor (a scalar) is one row, copied whole
            jobs.append(_Job(i, 0, info.shape[0] if info.shape else 1, info.nbytes))
        elif d.action in (QUANTIZE, DECODE):
            row_bytes = info.nbytes // info.shape[0]
            blocks = _row_blocks(info, _row_multiple(d))
            jobs.extend(_Job(i, r0, r1, (r1 - r0) * row_bytes) for r0, r1 in blocks)
    # Biggest first, so a long tensor does not start last and leave one worker busy alone.
    jobs.sort(key=lambda j: -j.nbytes)
    return jobs


def work_bytes(plan: Plan) -> int:
    """Input bytes the run reads: everything once, plus a first pass over every target where the scheme has one."""
    extra = sum(plan.decisions[i].nbytes for i in _fused_targets(plan))
    return plan.bytes_in + extra


def _first_passes(plan: Plan, jobs: list[_Job]) -> list[_Item]:
    """The jobs to run: those of FUSED targets behind the first pass over their fused set, the rest as they are.

    Fused partners share a conclusion only under one rule (as `_Runner.conclude` groups them).
    """
    targets = _fused_targets(plan)
    if not targets:
        return list(jobs)
    by_rule: dict[int, dict[str, int]] = defaultdict(dict)
    for i in targets:
        by_rule[id(plan.decisions[i].rule)][plan.decisions[i].module] = i
    owner: dict[int, tuple[int, tuple[str, ...]]] = {}  # decision -> its set's key
    for rule, modules in by_rule.items():
        for module, i in modules.items():
            owner[i] = (rule, tuple(fused_members(module, modules)))
    passes: dict[tuple[int, tuple[str, ...]], _FirstPass] = {}
    items: list[_Item] = []
    for i in targets:
        fp = passes.get(owner[i])
        if fp is None:
            fp = passes[owner[i]] = _FirstPass([], [], 0)
            items.append(fp)
        fp.targets.append(_Job(i, nbytes=plan.decisions[i].nbytes))
        fp.nbytes += plan.decisions[i].nbytes
    for job in jobs:
        if job.decision_index in owner:
            passes[owner[job.decision_index]].then.append(job)
        else:
            items.append(job)
    return sorted(items, key=lambda item: -item.nbytes)


def _fused_targets(plan: Plan) -> list[int]:
    """Decisions whose scheme needs a FUSED first pass (every target seen before any row is encoded)."""
    return [i for i, d in enumerate(plan.decisions) if d.action == QUANTIZE and _scheme(d).first_pass == FUSED]


def kernel_dtype(plan: Plan, d: Decision) -> np.dtype:
    """What the kernels see of a source weight: FP8 inputs arrive decoded to BF16."""
    return np.dtype(ml_dtypes.bfloat16) if d.scale else plan.source.tensors[d.name].info.dtype.element


class _Runner:
    """Executes the jobs of one plan against open readers and writers."""

    def __init__(
        self,
        plan: Plan,
        readers: dict[str, ShardReader],
        writers: dict[str, ShardWriter],
        on_compile: CompileNotice | None = None,
        balance: Transform | None = None,
    ) -> None:
        self.plan = plan
        #: `--pre-pass`: the factors each weight's rows are read through, and the kept tensors it changed.
        self.balance = balance
        self.on_compile = on_compile
        self.readers = readers
        self.writers = writers
        self.scratch = _Scratch()
        self.timing = TimeSplit()
        self.cancelled = threading.Event()
        #: What the scheme's first pass over every target concluded, by module (FUSED schemes).
        self.tensor_params: dict[str, object] = {}
        self.jobs = _jobs(plan)
        # output shard -> jobs still to write into it: each shard is synced as soon as it is complete
        self._unfinished = Counter(plan.decisions[job.decision_index].shard for job in self.jobs)
        self._lock = threading.Lock()

    def _kernel_dtype(self, d: Decision) -> np.dtype:
        return kernel_dtype(self.plan, d)

    def warm(self) -> None:
        """Load (or compile) the quantize kernels: each scheme on a tiny block of each dtype it quantizes.

        Run first on one worker: loading takes most of a second, which the other workers spend
        copying kept tensors instead of waiting for the kernel. A kernel not in numba's cache is
        compiled here, once, and `on_compile` hears of it first (scheme and dtype).
        """
        with self.timing.phase("load"):
            self._warm()

    def _warm(self) -> None:
        pairs: dict[tuple[Scheme, np.dtype], None] = {}
        for d in self.plan.decisions:
            if d.action == QUANTIZE:
                pairs[(_scheme(d), self._kernel_dtype(d))] = None
        for scheme, dtype in pairs:
            if self.on_compile is None:
                encode_block(scheme, dtype)
                continue
            with on_compile(functools.partial(self.on_compile, scheme, dtype)):
                encode_block(scheme, dtype)

    def alloc(self, key: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """A per-thread reused array (an `Alloc` for `Scheme.encode`)."""
        dt = np.dtype(dtype)
        return self.scratch.get(key, int(np.prod(shape)) * dt.itemsize).view(dt).reshape(shape)

    def conclude(self, states: dict[str, object]) -> None:
        """Each rule's scheme concludes over the states of the modules it quantizes (fused partners share a rule)."""
        by_rule: dict[int, dict[str, object]] = defaultdict(dict)
        rules = {}
        for d in self.plan.decisions:
            if d.module in states and d.rule is not None:
                by_rule[id(d.rule)][d.module] = states[d.module]
                rules[id(d.rule)] = d.rule
        for key, mine in by_rule.items():
            self.tensor_params.update(rules[key].scheme.conclude(mine))

    def observe(self, job: _Job) -> tuple[str, object, int]:
        """The scheme's first pass over one whole weight: (module name, its state, input bytes)."""
        d = self.plan.decisions[job.decision_index]
        ref = self.plan.source.tensors[d.name]
        return d.module, self._observe(d, ref.info, self.readers[ref.shard]), job.nbytes

    def _observe(self, d: Decision, info: TensorInfo, reader: ShardReader) -> object:
        state = None
        scheme = _scheme(d)
        for r0, r1 in _row_blocks(info, scheme.ROW_MULTIPLE):
            if self.cancelled.is_set():
                break
            x = self._input(d, info, reader, r0, r1)
            with self.timing.phase("kernel"):
                state, bad = scheme.observe(x, r0, _matrix(info), state)
            self._check(d, bad, r0, info.shape[1])
        return state

    def run_batch(self, batch: list[_Item]) -> int:
        """Run a hand-over of items; returns the input bytes they covered."""
        decisions = self.plan.decisions
        kernels = any(isinstance(job, _FirstPass) or decisions[job.decision_index].action == QUANTIZE for job in batch)
        with self.timing.task(kernels):
            return self._run_batch(batch)

    def _run_batch(self, batch: list[_Item]) -> int:
        done = 0
        for item in batch:
            if isinstance(item, _FirstPass):
                observed = [self.observe(job) for job in item.targets]
                if not self.cancelled.is_set():
                    self.conclude({module: state for module, state, _ in observed})
                done += sum(n for _, _, n in observed)
            else:
                done += self.run(item)
        return done

    def run(self, job: _Job) -> int:
        if self.cancelled.is_set():
            return 0
        d = self.plan.decisions[job.decision_index]
        ref = self.plan.source.tensors[d.name]
        reader, writer = self.readers[ref.shard], self.writers[d.shard]
        if ref.info.nbytes == 0:
            pass  # a zero-size tensor: its header entry is all there is
        elif d.action == KEEP and self.balance is not None and d.name in self.balance.values:
            with self.timing.phase("write"):
                writer.write(d.name, self.balance.values[d.name])
        elif d.action == KEEP:
            with self.timing.phase("write"):
                writer.copy(d.name, reader.fd, ref.info.offset, ref.info.nbytes)
        elif d.action == DECODE:
            rows = self._input(d, ref.info, reader, job.r0, job.r1)
            with self.timing.phase("write"):
                writer.write(d.name, rows, job.r0 * ref.info.shape[1] * 2)
        elif _scheme(d).first_pass == TENSOR:
            self._quantize_whole(d, ref.info, reader, writer)
        else:
            self._quantize_block(d, ref.info, reader, writer, job.r0, job.r1, self.tensor_params.get(d.module))
        with self._lock:
            self._unfinished[d.shard] -= 1
            complete = self._unfinished[d.shard] == 0
        if complete:  # flush it to disk now, while the other shards are still being computed
            with self.timing.phase("fsync"):
                writer.sync()
        return job.nbytes

    def _input(self, d: Decision, info: TensorInfo, reader: ShardReader, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of a source weight in a reused buffer; FP8 rows decoded to BF16 with their scale;
        balanced by the pre-pass, if any, in the dtype the kernels take."""
        dtype = info.dtype.element
        buf = self.scratch.get("in", (r1 - r0) * info.shape[1] * dtype.itemsize).view(dtype)
        with self.timing.phase("read"):
            rows = reader.read_rows(info, r0, r1, buf)
        if d.scale is not None:
            with self.timing.phase("kernel"):
                rows = self._decode_fp8(d, rows, r0, r1)
        if self.balance is None:
            return rows
        with self.timing.phase("kernel"):
            return self.balance.apply(d.name, rows, r0)

    def _decode_fp8(self, d: Decision, rows: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """FP8 rows [r0, r1) as BF16, with the scale rows they use."""
        assert d.scale is not None and d.scale_block is not None  # the plan resolved both for every FP8 weight
        # Only the scale rows these weight rows use: memory stays bounded by the row block.
        scale_info = self.plan.source.tensors[d.scale].info
        scale_reader = self.readers[self.plan.source.tensors[d.scale].shard]
        block_rows = d.scale_block[0]
        if scale_info.numel == 1:
            scale, first = scale_reader.read(d.scale), 0
        else:
            first, last = r0 // block_rows, (r1 - 1) // block_rows + 1
            buf = np.empty((last - first) * scale_info.shape[1], scale_info.dtype.numpy)
            scale = scale_reader.read_rows(scale_info, first, last, buf)
        return fp8.dequantize_rows(rows, scale, r0 - first * block_rows, d.scale_block)

    def _check(self, d: Decision, bad: int, r0: int, cols: int) -> None:
        if bad >= 0:
            raise self.plan.non_finite(d.name, r0 + bad // cols, bad % cols)

    def _quantize_whole(self, d: Decision, info: TensorInfo, reader: ShardReader, writer: ShardWriter) -> None:
        """A TENSOR first pass: observe every row block of the weight, conclude, then encode them."""
        scheme = _scheme(d)
        param = scheme.conclude({d.module: self._observe(d, info, reader)})[d.module]
        for r0, r1 in _row_blocks(info, scheme.ROW_MULTIPLE):
            self._quantize_block(d, info, reader, writer, r0, r1, param)

    def _quantize_block(
        self,
        d: Decision,
        info: TensorInfo,
        reader: ShardReader,
        writer: ShardWriter,
        r0: int,
        r1: int,
        tensor_param: object = None,
    ) -> None:
        x = self._input(d, info, reader, r0, r1)
        with self.timing.phase("kernel"):
            writes, bad = _scheme(d).encode(x, r0, _matrix(info), tensor_param, self.alloc)
        self._check(d, bad, r0, info.shape[1])
        with self.timing.phase("write"):
            for param, data, offset in writes:
                writer.write(f"{d.module}.{param}", data, offset)
        self.timing.first_written()


@dataclass
class QuantizeResult:
    """What a run produced, for the summary line and `--json`."""

    output: Path
    manifest: Manifest
    #: Where the time went (`--json` reports it; benchmarks print it).
    timing: TimeSplit = field(default_factory=TimeSplit)
    #: What was cleaned up beside the output first (folders left by killed runs), one sentence each.
    notes: list[str] = field(default_factory=list)
    #: `--method gptq`: the engine's wall seconds per phase before the write (`engine.gptq.PHASES`);
    #: empty for a data-free run.
    engine: dict[str, float] = field(default_factory=dict)
    #: Why `--pre-pass auto` left the weights unbalanced (the plan's `pre_pass_skipped`), if it did.
    pre_pass_skipped: str | None = None

    @property
    def skipped_files(self) -> dict[str, str]:
        """Source files not carried over (links out of the source, FIFOs, ...) and why."""
        return self.manifest.skipped_files


def _write_index(plan: Plan, folder: Path) -> None:
    weight_map = {s.name: shard for shard, specs in plan.shards().items() for s in specs}
    index = {"metadata": {"total_size": plan.bytes_out}, "weight_map": dict(sorted(weight_map.items()))}
    write_json_new(folder, INDEX_FILE, index)


def _write_config(plan: Plan, folder: Path) -> None:
    config = dict(plan.source.config)
    config["quantization_config"] = plan.quantization_config()
    if plan.source_format.kind != "dense":
        config["torch_dtype"] = "bfloat16"
    write_json_new(folder, CONFIG_FILE, config)


def _copy_other_files(ckpt: Checkpoint, folder: Path, files: list[Path]) -> None:
    """Copy the source's other files into `folder` as real files (links were vetted by `other_files`).

    A source `weightsmith.json` is left out: the run writes its own.
    """
    for rel in files:
        if rel == Path(MANIFEST_FILE):
            continue
        copy_new(ckpt.root / rel, folder, rel.as_posix())


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
    if plan.source.index is not None and (out.index is None or out.tensor_bytes != out.index["metadata"]["total_size"]):
        raise OutputError(
            "verification failed: index total_size disagrees with the shards", file=folder, code="output.verify"
        )
    return out


def execute(
    plan: Plan,
    out: Path,
    *,
    workers: int,
    force: bool,
    progress: Progress | None = None,
    hash_sources: bool = True,
    chosen: dict[str, Chosen] | None = None,
    method: MethodRecord | None = None,
    calibrated_from: Provenance | None = None,
    on_compile: CompileNotice | None = None,
) -> QuantizeResult:
    """Write the quantized checkpoint described by `plan` to `out`, atomically.

    `chosen` holds integer values a data-aware method (GPTQ) chose per module, on the grid the
    scheme computes from the same rows; `method` and `calibrated_from` record it in the manifest.
    """
    src = plan.source
    notes = remove_stale(out, keep=[src.root])
    check_destination(src.root, out, force)
    other = src.other_files()
    other_bytes = sum((src.root / rel).stat().st_size for rel in other.files)
    check_space(out, plan.bytes_out + other_bytes + (1 << 20))
    workers = max(1, workers)
    started = time.perf_counter()
    balance = PRE_PASSES[plan.pre_pass].run(plan, workers) if plan.pre_pass is not None else None
    pre_pass = time.perf_counter() - started if balance is not None else 0.0
    try:
        with staged(out, force) as folder:
            readers = {shard: ShardReader(src.path(shard), h) for shard, h in src.headers.items()}
            writers: dict[str, ShardWriter] = {}
            try:
                for shard, specs in plan.shards().items():
                    writers[shard] = ShardWriter(folder, shard, specs, SHARD_METADATA)
                    for spec in specs:  # the calibrated scales the plan computed: one value per module
                        if spec.name in plan.values:
                            writers[shard].write(spec.name, plan.values[spec.name])
                runner = _Runner(plan, readers, writers, on_compile, balance)
                timing = runner.timing
                timing.pre_pass = pre_pass
                timing.pre_pass_tasks = list(balance.task_seconds) if balance is not None else []
                runner.tensor_params.update(chosen or {})
                pool_started = time.perf_counter()
                timing.before = pool_started - started
                with ThreadPoolExecutor(
                    max_workers=workers + (1 if hash_sources else 0), thread_name_prefix="ws"
                ) as pool:
                    hashes = pool.submit(hash_files, [src.path(s) for s in src.headers]) if hash_sources else None
                    warmed = pool.submit(runner.warm)
                    _schedule(pool, runner, _first_passes(plan, runner.jobs), 2 * workers, progress)
                    warmed.result()
                    source_hashes = hashes.result() if hashes is not None else {}
                timing.workers = time.perf_counter() - pool_started
            finally:
                for r in readers.values():
                    r.close()
                for w in writers.values():
                    w.close()
            if src.index is not None:
                _write_index(plan, folder)
            _write_config(plan, folder)
            _copy_other_files(src, folder, other.files)
            written = verify_output(plan, folder)
            if plan.calibration is not None:
                calibrated_from = plan.calibration.stats.provenance
            copied = [rel.as_posix() for rel in other.files if rel != Path(MANIFEST_FILE)]
            manifest = build_manifest(plan, written, source_hashes, other.skipped, calibrated_from, method, copied)
            write_manifest(folder, manifest)
        timing.after = time.perf_counter() - started - timing.before - timing.workers
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OutputError(
                "ran out of disk space while writing; nothing was left behind", file=out, code="output.no-space"
            ) from None
        raise OutputError(
            f"could not be written ({exc.strerror or exc})", file=exc.filename or out, code="output.io"
        ) from None
    return QuantizeResult(out, manifest, notes=notes, timing=timing, pre_pass_skipped=plan.pre_pass_skipped)


def _schedule(
    pool: ThreadPoolExecutor, runner: _Runner, items: list[_Item], window: int, progress: Progress | None
) -> None:
    """Run `items` on the pool, handing over at most `window` batches at a time; at the first error
    or interrupt, stop the rest and re-raise.

    When a first pass is concluded, its encode jobs go to the front of the line: a fused set is
    encoded while its bytes are still in the page cache, while the next sets' first passes run
    beside it, rather than every target being read once for the first pass and again at the end.
    """
    line: deque[list[_Item]] = deque(_batches(items))
    in_flight: dict[Future[int], list[_Item]] = {}
    try:
        while line or in_flight:
            while line and len(in_flight) < window:
                batch = line.popleft()
                in_flight[pool.submit(runner.run_batch, batch)] = batch
            done, _ = wait(in_flight, timeout=0.2, return_when=FIRST_COMPLETED)
            for f in done:
                batch = in_flight.pop(f)
                error = f.exception()
                if error is not None:
                    raise error
                if progress is not None:
                    progress(f.result())
                then = [job for item in batch if isinstance(item, _FirstPass) for job in item.then]
                line.extendleft(reversed(list(_batches(then))))
    except BaseException:
        runner.cancelled.set()
        for f in in_flight:
            f.cancel()
        raise


def _batches(jobs: Iterable[_Item]) -> Iterator[list[_Item]]:
    """Jobs in runs of at least BATCH_BYTES or BATCH_JOBS: one future per small tensor costs more than its copy."""
    batch: list[_Item] = []
    size = 0
    for job in jobs:
        batch.append(job)
        size += job.nbytes
        if size >= BATCH_BYTES or len(batch) >= BATCH_JOBS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def default_workers() -> int:
    return cores.usable()
