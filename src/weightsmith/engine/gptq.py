"""GPTQ on the layer-streamed engine: integer values chosen with the calibration data's Hessians.

One decoder layer is resident at a time (`stream`). Its Linears' input Hessians
`H = 2/n * sum X^T X` (float32, summed over the n sequences, as llm-compressor's
`accumulate_hessian`) are gathered by forward pre-hooks while every sequence runs through the layer;
then each Linear is quantized by GPTQ (column blocks, dampening by a fraction of the mean diagonal,
the upper Cholesky factor of the inverse, error propagated to the columns not yet quantized), its
weight is replaced by the dequantized result, and the layer runs again to give the next layer its
inputs: the quantized layer's outputs, as llm-compressor's sequential pipeline does.

The grid (scale and zero point per group) is the one round-to-nearest computes from the original
weight (`Scheme.grid`), as llm-compressor 0.14's GPTQ takes its weight observer's parameters before
the first column; the arithmetic of each column is compressed-tensors' `fake_quantize`. Linears that
read the same input tensor (q/k/v, gate/up) share one Hessian and are quantized as one matrix: GPTQ
treats rows independently, so that is the same result for a third of the column loops.

What comes out is the integer values per Linear (`Chosen`), which the quantize pipeline stores with
the scheme's own encoding; the scales it stores are the same grid's.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from weightsmith.calibration import Provenance
from weightsmith.engine.loading import opened
from weightsmith.engine.stream import layer_arguments
from weightsmith.errors import WeightsmithError
from weightsmith.manifest import MethodRecord
from weightsmith.pipeline import QuantizeResult, execute, kernel_dtype
from weightsmith.plan import QUANTIZE, Plan
from weightsmith.schemes.base import Chosen, Grid, Scheme

#: Columns quantized before their error is propagated to the rest at once (llm-compressor's default).
BLOCK_SIZE = 128
#: Tokens run through a layer at once (sequences of one length batched; attention memory grows with it).
BATCH_TOKENS = 2048
#: The fraction of the Hessian's mean diagonal added to its diagonal (llm-compressor's default).
DAMPENING = 0.01

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """A Linear to quantize: its scheme, and the dtype its source weight is quantized from."""

    scheme: Scheme
    dtype: np.dtype


@dataclass
class Result:
    """The integer values chosen per Linear module, and the modules left to round-to-nearest, why."""

    chosen: dict[str, Chosen] = field(default_factory=dict)
    rtn: dict[str, str] = field(default_factory=dict)


def quantize_weight(
    weight: Any, hessian: Any, grid: Grid, dampening: float = DAMPENING, block_size: int = BLOCK_SIZE
) -> tuple[Any, Any, bool]:
    """(int8 values [rows, cols], the dequantized weight float32, whether H was singular after dampening).

    `weight` float32 [rows, cols]; `hessian` float32 [cols, cols], normalised (consumed). Mirrors
    llm-compressor's `quantize_weight` and `factorize_hessian` for one matrix: columns whose
    Hessian diagonal is zero (never active) are zeroed; a Hessian that is not positive definite
    after dampening is replaced by the identity, which is round-to-nearest.
    """
    import torch

    rows, cols = weight.shape
    W = weight.to(torch.float32).clone()
    H = hessian
    diag = torch.diagonal(H)
    dead = diag == 0
    if dead.any():
        diag.masked_fill_(dead, 1.0)
        W[:, dead] = 0
    diag.add_(dampening * torch.mean(diag))
    factor, info = torch.linalg.cholesky_ex(H)
    singular = int(info) != 0
    if singular:
        hinv = torch.eye(cols, dtype=torch.float32)
    else:
        hinv = torch.linalg.cholesky(torch.cholesky_inverse(factor), upper=True)
    del H, factor
    scale = _torch(grid.scale)
    zp = None if grid.zero_point is None else torch.from_numpy(grid.zero_point.astype(np.float32))
    codes = torch.empty((rows, cols), dtype=torch.int8)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = hinv[i1:i2, i1:i2]
        with _one_thread():
            _columns(W1, Q1, Err1, Hinv1, codes, i1, scale, zp, grid)
        W[:, i1:i2] = Q1
        W[:, i2:] -= Err1.matmul(hinv[i1:i2, i2:])
    return codes, W, singular


@contextmanager
def _one_thread() -> Iterator[None]:
    """Torch on one thread: the column loop is many small operations, which a thread pool only
    slows (13x on a busy 2-core machine); the block updates between use every thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _columns(W1: Any, Q1: Any, Err1: Any, Hinv1: Any, codes: Any, i1: int, scale: Any, zp: Any, grid: Grid) -> None:
    """One block's columns in turn, as llm-compressor's eager `gptq_block_update` (compressed-tensors'
    `fake_quantize` arithmetic): quantize, record the error, push it onto the block's later columns."""
    import torch

    for i in range(W1.shape[1]):
        w = W1[:, i]
        g = (i1 + i) // grid.group
        s = scale[:, g]
        scaled = w / s
        if zp is not None:
            scaled += zp[:, g]
        q = torch.round(torch.clamp(scaled, grid.q_min, grid.q_max))
        dq = q.to(s.dtype)
        if zp is not None:
            dq = dq - zp[:, g].to(s.dtype)
        dq = dq * s
        error = (w - dq) / Hinv1[i, i]
        Q1[:, i] = dq
        Err1[:, i] = error
        codes[:, i1 + i] = q.to(torch.int8)
        W1[:, i:] -= error.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0)


def _torch(a: np.ndarray) -> Any:
    """A numpy array (bf16 as ml_dtypes) as a torch tensor of the same dtype and values."""
    import torch

    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)  # exact: the values are bf16
    return torch.from_numpy(np.ascontiguousarray(a))


def run(
    ckpt_dir: Path,
    token_ids: list[list[int]],
    targets: dict[str, Target],
    workdir: Path,
    *,
    dampening: float = DAMPENING,
    block_size: int = BLOCK_SIZE,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
) -> Result:
    """GPTQ values for every module in `targets` (checkpoint module names), layer by layer.

    The values are kept in `.npy` files under `workdir` (one byte per weight, memory-mapped), so
    memory holds one layer, not the model. A target the engine never runs (outside the decoder
    layers, or named otherwise by transformers) is left to round-to-nearest, with the reason.
    """
    import torch

    if not token_ids or any(len(ids) == 0 for ids in token_ids):
        raise WeightsmithError("no calibration tokens to run", file=ckpt_dir, code="usage")
    result = Result()
    with opened(Path(ckpt_dir), trust_remote_code=trust_remote_code) as loader:
        skeleton = loader.skeleton
        sequences = [torch.tensor([ids], dtype=torch.long) for ids in token_ids]
        hidden, calls = layer_arguments(loader, sequences)
        count = len(skeleton.layers)
        for index in range(count):
            loader.load(index)
            layer = skeleton.layers[index]
            try:
                with torch.no_grad():
                    prefix = skeleton.layer_path(index)
                    linears = {
                        f"{prefix}.{name}": module
                        for name, module in layer.named_modules()
                        if isinstance(module, torch.nn.Linear) and f"{prefix}.{name}" in targets
                    }
                    if linears:
                        for members, hessian in _hessians(layer, linears, hidden, calls[index]):
                            _quantize_group(members, hessian, linears, targets, workdir, dampening, block_size, result)
                    if index + 1 < count:  # the next layer's inputs, from this layer as quantized
                        for batch, call in _batches(hidden, calls[index]):
                            outputs = call(layer, torch.cat([hidden[s] for s in batch]))
                            for s, out in zip(batch, outputs.split(1), strict=True):
                                hidden[s] = out
            finally:
                loader.free(index)
            if progress is not None:
                progress(f"layer {index + 1}/{count}")
    for module in targets:
        if module not in result.chosen and module not in result.rtn:
            result.rtn[module] = "not run by the engine (outside the decoder layers)"
    return result


def _batches(hidden: list[Any], calls: list[Any]) -> list[tuple[list[int], Any]]:
    """Runs of consecutive sequences of one length, up to `BATCH_TOKENS` tokens, with the call of the first.

    Sequences of one length get the same layer arguments (masks, rotary embeddings of batch size 1,
    which broadcast), so a run of them goes through the layer as one batch: fewer, larger matrix
    products than one sequence at a time.
    """
    out: list[tuple[list[int], Any]] = []
    for s, call in enumerate(calls):
        length = hidden[s].shape[1]
        if out and hidden[out[-1][0][0]].shape[1] == length and (len(out[-1][0]) + 1) * length <= BATCH_TOKENS:
            out[-1][0].append(s)
        else:
            out.append(([s], call))
    return out


def _hessians(layer: Any, linears: dict[str, Any], hidden: list[Any], calls: list[Any]) -> list[tuple[list[str], Any]]:
    """Run every sequence through `layer`: (modules sharing one input, their Hessian 2/n sum X^T X).

    Modules called with the very tensor the previous one was (q/k/v, gate/up) share its Hessian.
    """
    import torch

    owner: dict[str, str] = {}
    sums: dict[str, Any] = {}
    last: list[Any] = [None, None]  # (the tensor last accumulated, its module): held, so never reused

    def hook_for(path: str) -> Any:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0]
            if path not in owner:
                owner[path] = last[1] if last[0] is x else path
            if owner[path] != path:
                return
            inp = math.sqrt(2) * x.reshape(-1, x.shape[-1]).t().to(torch.float32)
            if path not in sums:
                sums[path] = torch.zeros((inp.shape[0], inp.shape[0]), dtype=torch.float32)
            sums[path] += inp.matmul(inp.t())
            last[0], last[1] = x, path

        return hook

    handles = [module.register_forward_pre_hook(hook_for(path)) for path, module in linears.items()]
    try:
        for batch, call in _batches(hidden, calls):
            call(layer, torch.cat([hidden[s] for s in batch]))
            last[0] = last[1] = None
    finally:
        for handle in handles:
            handle.remove()
    n = len(calls)  # sequences, as llm-compressor counts its samples
    return [([m for m in linears if owner.get(m) == key], total / n) for key, total in sums.items()]


def _quantize_group(
    members: list[str],
    hessian: Any,
    linears: dict[str, Any],
    targets: dict[str, Target],
    workdir: Path,
    dampening: float,
    block_size: int,
    result: Result,
) -> None:
    """GPTQ on the stacked rows of `members` (one input, one Hessian); each module's weight becomes
    its dequantized values, and its integer values go to a file under `workdir`."""
    import torch

    weights = [linears[m].weight.detach() for m in members]
    grids = [targets[m].scheme.grid(w.numpy().astype(targets[m].dtype)) for m, w in zip(members, weights, strict=True)]
    if any(g is None for g in grids):
        for m in members:
            result.rtn[m] = "its scheme has no integer grid GPTQ can choose points of"
        return
    if len({(g.group, g.q_min, g.q_max, g.zero_point is None) for g in grids if g is not None}) > 1:
        for m in members:  # one input but different grids: one column loop each
            _quantize_group([m], hessian.clone(), linears, targets, workdir, dampening, block_size, result)
        return
    first = grids[0]
    assert first is not None
    zps = [g.zero_point for g in grids if g is not None]
    grid = Grid(
        np.concatenate([g.scale.astype(np.float32) for g in grids if g is not None]).astype(first.scale.dtype),
        None
        if first.zero_point is None
        else np.concatenate([z for z in zps if z is not None]),  # all or none have them
        first.group,
        first.q_min,
        first.q_max,
    )
    codes, dequantized, singular = quantize_weight(torch.cat(weights), hessian, grid, dampening, block_size)
    r0 = 0
    for m, w in zip(members, weights, strict=True):
        r1 = r0 + w.shape[0]
        linears[m].weight.data.copy_(dequantized[r0:r1])
        path = workdir / f"{m}.npy"
        np.save(path, codes[r0:r1].numpy())
        result.chosen[m] = Chosen(np.load(path, mmap_mode="r"))
        if singular:
            result.rtn[m] = "its Hessian is not positive definite after dampening"
        r0 = r1


def quantize(
    plan: Plan,
    out: Path,
    token_ids: list[list[int]],
    provenance: Provenance,
    *,
    dampening: float = DAMPENING,
    workers: int = 1,
    force: bool = False,
    hash_sources: bool = True,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
) -> QuantizeResult:
    """`plan` written to `out` with GPTQ's values for every quantized Linear the engine runs.

    The values wait in a folder beside `out` named as a partial output, removed however the run ends.
    """
    targets = {
        d.module: Target(d.rule.scheme, kernel_dtype(plan, d))
        for d in plan.decisions
        if d.action == QUANTIZE and d.rule is not None
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{out.name}.partial-gptq-", dir=out.parent) as work:
        found = run(
            plan.source.root,
            token_ids,
            targets,
            Path(work),
            dampening=dampening,
            trust_remote_code=trust_remote_code,
            progress=progress,
        )
        method = MethodRecord(
            name="gptq",
            dampening=dampening,
            block_size=BLOCK_SIZE,
            actorder=None,
            tokens=provenance.tokens,
            rtn_fallback=dict(sorted(found.rtn.items())),
        )
        return execute(
            plan,
            out,
            workers=workers,
            force=force,
            hash_sources=hash_sources,
            chosen=found.chosen,
            method=method,
            calibrated_from=provenance,
        )
