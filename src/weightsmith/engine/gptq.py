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
the first column; with a scale search (`wmse`, `mse`, `noclip`) the grid is the searched one, whose
clip factors are chosen from the weight alone before GPTQ starts. The arithmetic of each column is
compressed-tensors' `fake_quantize`. Linears that read the same input tensor (q/k/v, gate/up) share
one Hessian and are quantized as one matrix: GPTQ treats rows independently, so that is the same
result for a third of the column loops.

What comes out is the integer values per Linear (`Chosen`), which the quantize flow
(`quantization/gptq.py`) stores with the scheme's own encoding; the scales it stores are the
same grid's. This module is the runtime and the solver only: it knows nothing of plans or outputs.

Where the time goes is arithmetic, so each product runs where it is fastest on a CPU: the layer's
Linears and the Hessians' X^T X through oneDNN (`matmul`), the inverse-Hessian factor through LAPACK
with the GIL released (`lapack`), the column loop in a numba kernel that vectorizes over rows, and
freed activations reused rather than faulted in again (`heap`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.timesplit import adding
from weightsmith.engine.distributed import Message, World
from weightsmith.engine.experts import LinearExperts
from weightsmith.engine.gptq_defaults import ACTORDERS, GPTQ_DAMPENING
from weightsmith.engine.heap import keep_freed_memory
from weightsmith.engine.lapack import factor_reversed, one_blas_thread
from weightsmith.engine.loading import opened
from weightsmith.engine.matmul import PRODUCT_BYTES, add_gram, linear, onednn_linears, symmetrize
from weightsmith.engine.stream import layer_arguments
from weightsmith.quant.floatbits import round_to
from weightsmith.quant.int4 import mode_of
from weightsmith.schemes.base import Chosen, Grid, Scheme

#: Columns quantized before their error is propagated to the rest at once (llm-compressor's default).
BLOCK_SIZE = 128
#: Tokens run through a layer at once (sequences of one length batched; attention memory grows with it).
BATCH_TOKENS = 2048
#: Where a run's time goes, in order: importing torch and transformers, tokenizing the calibration text
#: (`quantize.gptq`), the first layer's inputs, loading each layer, running it to gather the Hessians,
#: quantizing its groups, running it again quantized (its outputs, the next layer's inputs).
PHASES = ("libraries", "tokens", "inputs", "load", "hessians", "quantize", "outputs")
#: Why a module is left to its scheme's own quantization (`Scheme.grid` is None: nothing to choose points of).
NO_GRID = "its scheme has no fixed grid GPTQ can choose points of (a float format, or memoryless_mse's scale)"
#: Why a module is left to round-to-nearest: no calibration token reached it (an expert no token was routed to).
NO_TOKENS = "no calibration token was routed to it, so it has no Hessian"
#: Why a target is left to round-to-nearest: the engine runs the decoder layers only.
OUTSIDE = "not run by the engine (outside the decoder layers)"
#: Why a module's values come with a note: its Hessian stayed singular (`quantize_weight`'s fallback).
SINGULAR = "its Hessian is not positive definite after dampening"
#: Rank 0's groups of a layer's modules, which every rank sizes and assigns its Hessians by (`_structure`).
GROUPS = Message(
    "sharing the layer's groups", "sent the layer's groups of modules",
    "a JSON list of groups of this layer's modules, each named once, with the input width they read",
)  # fmt: skip

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
    #: Wall seconds per phase of `PHASES` (from "inputs" on).
    seconds: dict[str, float] = field(default_factory=dict)
    #: Each MoE expert module's calibration tokens: the rows its Hessian was made of.
    tokens: dict[str, int] = field(default_factory=dict)


def quantize_weight(
    weight: Any,
    hessian: Any,
    grid: Grid,
    dampening: float = GPTQ_DAMPENING,
    block_size: int = BLOCK_SIZE,
    actorder: str = "static",
) -> tuple[npt.NDArray[np.int8], Any, bool]:
    """(int8 values [rows, cols], the dequantized weight float32, whether H was singular after dampening).

    `weight` float32 [rows, cols]; `hessian` float32 [cols, cols], normalised (consumed). Mirrors
    llm-compressor's `quantize_weight` and `factorize_hessian` for one matrix: with `actorder`
    "static" the columns are quantized in order of decreasing Hessian diagonal (each still on its
    own group's grid, so nothing about the stored format changes); columns whose Hessian diagonal is
    zero (never active) are zeroed; a Hessian that is not positive definite after dampening is
    replaced by the identity, which is round-to-nearest. Given the same linear algebra, every value
    is llm-compressor's; ours is faster and agrees with theirs to float32 rounding: the inverse-Hessian
    factor in half the arithmetic (`lapack.factor_reversed`), the block products through oneDNN
    (`matmul.linear`). Torch runs on one thread throughout: on a machine whose cores are shared, a
    second thread's barrier waits cost more than it computes (torch.cholesky_inverse of 1536 columns:
    0.9 s on one thread, 7 s on two at load 11).

    The columns are worked on transposed ([cols, rows]): the column kernel then reads and updates
    every row of a column as one contiguous run, loops LLVM vectorizes.
    """
    import torch

    if actorder not in ACTORDERS:
        raise ValueError(f"actorder {actorder!r}: choose from {', '.join(ACTORDERS)}")
    rows, cols = weight.shape
    with _one_thread():
        order = torch.arange(cols)
        if actorder == "static":
            order = torch.argsort(torch.diagonal(hessian), descending=True)
        work = weight.to(torch.float32).t().index_select(0, order)  # [cols, rows], a copy in either order
        diag = torch.diagonal(hessian)[order]  # the permuted Hessian's diagonal, dampened as llm-compressor's
        dead = diag == 0
        if dead.any():
            diag.masked_fill_(dead, 1.0)
            work[dead] = 0
        diag.add_(dampening * torch.mean(diag))
        reverse = order.flip(0).numpy()  # J P^T H P J for `factor_reversed`: rows, then columns (numpy's take
        reversed_h = np.take(np.take(hessian.numpy(), reverse, axis=0), reverse, axis=1)  # is the fastest gather)
        np.fill_diagonal(reversed_h, diag.flip(0).numpy())
        factor = factor_reversed(reversed_h)
        del reversed_h
        singular = factor is None
        inverse = np.eye(cols, dtype=np.float32) if factor is None else factor
        hinv = torch.from_numpy(inverse)
        mode = mode_of(grid.scale.dtype)
        scale = np.ascontiguousarray(grid.scale.astype(np.float32).T)
        zp = (
            np.zeros((0, 0), np.float32)
            if grid.zero_point is None
            else np.ascontiguousarray(grid.zero_point.astype(np.float32).T)
        )
        group_of = (order // grid.group).numpy().astype(np.int64)
        codes = np.empty((cols, rows), np.int8)
        columns = work.numpy()
        for i1 in range(0, cols, block_size):
            i2 = min(i1 + block_size, cols)
            errors = np.empty((i2 - i1, rows), np.float32)
            _columns(columns[i1:i2], errors, codes[i1:i2], np.ascontiguousarray(inverse[i1:i2, i1:i2]), scale, zp,
                     group_of[i1:i2], np.float32(grid.q_min), np.float32(grid.q_max), mode)  # fmt: skip
            # the block's errors [rows, block] times the factor's block row, transposed, in chunks of
            # columns whose product stays under PRODUCT_BYTES (a larger one is faulted in afresh)
            step = max(1, PRODUCT_BYTES // (4 * rows))
            for c0 in range(i2, cols, step):
                c1 = min(c0 + step, cols)
                work[c0:c1] -= linear(hinv[i1:i2, c0:c1].t(), torch.from_numpy(errors).t())
        back = torch.argsort(order)
        dequantized = work.index_select(0, back).t().contiguous()
        codes = np.ascontiguousarray(codes[back.numpy()].T)
    return codes, dequantized, singular


@contextmanager
def _one_thread() -> Iterator[None]:
    """Torch on one thread for the duration (left alone where it already is: the worker threads of
    `_in_parallel` run inside its own)."""
    import torch

    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def compile_kernel() -> None:
    """Compile the column kernel into numba's cache (`quantization/warm.py`), with the argument types
    `quantize_weight` passes: values and codes are row slices of the whole matrix's."""
    values, codes = np.ones((8, 2), np.float32), np.zeros((8, 2), np.int8)
    _columns(values[4:], np.empty((4, 2), np.float32), codes[4:], np.eye(4, dtype=np.float32),
             np.ones((1, 2), np.float32), np.zeros((0, 0), np.float32), np.zeros(8, np.int64)[4:], np.float32(-8),
             np.float32(7), 0)  # fmt: skip


@njit(nogil=True, cache=True)
def _columns(
    block: Any, errors: Any, codes: Any, hinv: Any, scale: Any, zp: Any, group_of: Any, q_min: Any, q_max: Any,
    mode: int,
) -> None:  # fmt: skip
    """One block of columns, transposed ([width, rows]), column by column: every row's value of the
    column quantized on its group's grid with compressed-tensors' `fake_quantize` arithmetic
    (quotient and clamp in float32, dequantization rounded to the scale's dtype), its error divided
    by the diagonal and pushed onto the block's later columns. `scale` and `zp` are [groups, rows].
    `block` ends holding the dequantized values, `errors` the scaled errors the caller propagates to
    the columns after the block. Each value sees the same operations in the same order as in
    llm-compressor's column loop (no fused multiply-add: the same rounding as torch's)."""
    width, rows = block.shape
    asym = zp.shape[0] > 0
    for i in range(width):
        g = group_of[i]
        column, error, code, s, d = block[i], errors[i], codes[i], scale[g], hinv[i, i]
        if asym:
            z = zp[g]
            for r in range(rows):
                w = column[r]
                q = np.float32(np.rint(min(max(w / s[r] + z[r], q_min), q_max)))
                dq = round_to(mode, round_to(mode, q - round_to(mode, z[r])) * s[r])
                code[r], error[r], column[r] = np.int8(q), (w - dq) / d, dq
        else:
            for r in range(rows):
                w = column[r]
                q = np.float32(np.rint(min(max(w / s[r], q_min), q_max)))
                dq = round_to(mode, q * s[r])
                code[r], error[r], column[r] = np.int8(q), (w - dq) / d, dq
        for j in range(i + 1, width):
            _subtract_scaled(block[j], error, hinv[i, j])


@njit(nogil=True, cache=True)
def _subtract_scaled(dst: Any, src: Any, e: Any) -> None:
    """`dst -= src * e`, element by element (no fused multiply-add: the same rounding as torch's)."""
    for r in range(dst.shape[0]):
        dst[r] -= src[r] * e


def run(
    ckpt_dir: Path,
    token_ids: list[list[int]],
    targets: dict[str, Target],
    workdir: Path | None,
    *,
    dampening: float = GPTQ_DAMPENING,
    block_size: int = BLOCK_SIZE,
    actorder: str = "static",
    trust_remote_code: bool = False,
    workers: int = 1,
    all_experts: bool = False,
    world: World = World(),
    progress: Progress | None = None,
) -> Result:
    """GPTQ values for every module in `targets` (checkpoint module names), layer by layer.

    The values are kept in `.npy` files under `workdir` (one byte per weight, memory-mapped), so
    memory holds one layer, not the model. A decoder layer's Linears are found under their checkpoint
    names (`Loader.linears`), and each MoE expert's modules as Linears of its slices of the merged
    parameters (`experts.LinearExperts`): an expert's Hessian is that of the tokens routed to it. A
    target the engine never runs (outside the decoder layers) or that no calibration token reached (an
    expert no token was routed to) is left to round-to-nearest, with the reason.
    A layer's groups (one Hessian each) are quantized on `workers` threads at once. `all_experts`
    gives every expert's Hessian every token, the outputs still routed as the model routes
    (`LinearExperts.routing`); each expert module's tokens are in `Result.tokens`.

    In a `world` of several ranks each rank runs its turns of the batches (`_turns`) and solves the
    groups `_owners` gives it; the values are the single process's, byte for byte (`_hessians` says
    why), and only the leader (rank 0, whose `workdir` is the one given; the others pass None) keeps
    them: the other ranks return a `Result` without values.
    """
    import torch

    if not token_ids or any(len(ids) == 0 for ids in token_ids):
        raise WeightsmithError("no calibration tokens to run", file=ckpt_dir, code="usage")
    keep_freed_memory()  # the layers' activations reuse freed memory instead of faulting pages in again
    result = Result()
    with opened(Path(ckpt_dir), trust_remote_code=trust_remote_code) as loader, one_blas_thread():
        skeleton = loader.skeleton
        seconds = result.seconds
        with adding(seconds, "inputs"):
            sequences = [torch.tensor([ids], dtype=torch.long) for ids in token_ids]
            states, calls = layer_arguments(loader, sequences)
            batches = _batches([h.shape[1] for h in states])
            mine = _turns(len(batches), world)
            hidden = {b: torch.cat([states[s] for s in batches[b]]) for b in mine}  # one tensor per batch, kept
            del states
        count = len(skeleton.layers)
        for index in range(count):
            with adding(seconds, "load"):
                loader.load(index)
            layer = skeleton.layers[index]
            try:
                with torch.no_grad(), onednn_linears(layer):
                    routed = LinearExperts(layer, skeleton.layer_path(index), loader.experts)
                    found = loader.linears(index) | routed.modules
                    linears = {m: module for m, module in found.items() if m in targets}
                    if linears:
                        layer_calls = {b: calls[index][batches[b][0]] for b in mine}
                        fixed = [kept for group in routed.slices if (kept := [m for m in group if m in linears])]
                        with adding(seconds, "hessians"), routed.routing(all_experts):
                            groups, owners, tokens = _hessians(layer, linears, fixed, hidden, layer_calls,
                                                               len(sequences), len(batches), world)  # fmt: skip
                        quantize_group = partial(
                            _quantize_group, linears=linears, targets=targets, dampening=dampening,
                            block_size=block_size, actorder=actorder,
                        )  # fmt: skip
                        with adding(seconds, "quantize"):
                            solved = _in_parallel(quantize_group, [g for g in groups if owners[g[0][0]] == world.rank],
                                                  workers)  # fmt: skip
                            for members, _ in groups:  # an expert's tokens, on its owner
                                for name in members if members[0] in tokens else ():
                                    solved[name].tokens = tokens[members[0]]
                            _share(solved, groups, owners, linears, targets, world)
                            if world.leader:
                                _keep(solved, workdir, result)
                    if index + 1 < count:  # the next layer's inputs, from this layer as quantized
                        with adding(seconds, "outputs"):
                            for b in mine:
                                hidden[b] = calls[index][batches[b][0]](layer, hidden[b])
            finally:
                loader.free(index)
            if progress is not None:
                progress(f"layer {index + 1}/{count}")
    for module in targets:
        if module not in result.chosen and module not in result.rtn and world.leader:
            result.rtn[module] = OUTSIDE
    return result


def _batches(lengths: list[int]) -> list[list[int]]:
    """Runs of consecutive sequences of one length, up to `BATCH_TOKENS` tokens.

    Sequences of one length get the same layer arguments (masks, rotary embeddings of batch size 1,
    which broadcast), so a run of them goes through every layer as one batch, called as its first
    sequence was: fewer, larger matrix products than one sequence at a time.
    """
    out: list[list[int]] = []
    for s, length in enumerate(lengths):
        if out and lengths[out[-1][0]] == length and (len(out[-1]) + 1) * length <= BATCH_TOKENS:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def _turns(count: int, world: World) -> range:
    """The batches this rank runs: every `size`-th from its rank on, so that in step `t` the ranks run
    batches `t * size + rank`, consecutive batches, which the owner of a Hessian adds in that order."""
    return range(world.rank, count, world.size)


Group = tuple[list[str], Any]  # (modules sharing one input, in the layer's order; their Hessian)


def _hessians(
    layer: Any, linears: dict[str, Any], fixed: list[list[str]], hidden: dict[int, Any], calls: dict[int, Any], n: int,
    batches: int, world: World,
) -> tuple[list[Group], dict[str, int], dict[str, int]]:  # fmt: skip
    """Run this rank's batches through `layer`: every group of modules sharing one input (q/k/v,
    gate/up), its Hessian 2/n sum X^T X on the rank that owns its solve (an empty tensor elsewhere; None
    where no token reached it), the owners (by the group's first module), and the rows each `fixed`
    group's Hessian was made of (on its owner).

    `n` is the number of sequences, as llm-compressor counts its samples. Modules called with the
    very tensor the previous one was share its Hessian; the `fixed` groups (an MoE expert's slices:
    gate and up, down) are known beforehand, since an expert sees only the tokens routed to it and may
    see none in a batch. A batch stops as soon as every Linear has received its input: what the layer
    computes after (the last Linear itself, the residual) is not needed, and the layer runs again
    anyway, quantized.

    A Hessian is the float32 sum, batch after batch in order, of each batch's `2 X^T X` (upper
    triangle): `add_gram` adds each product to the running sum as it is made, so one process's sum
    is `(((0 + P0) + P1) + P2) ...`. Several ranks make the same products (the same batches, the same
    arithmetic) and the owner adds them in the same order: in step `t` every rank makes the product of
    its batch `t * size + rank` and sends it to the owner, which adds them in rank order. An expert's
    group goes as its input rows instead when it has fewer rows than its width (`_exchange_expert`), and
    as nothing when it has none, where one process adds nothing either: the owner makes the product
    with the same `add_gram`. The sum is the single process's to the bit whatever the world size, and
    no rank holds more than one batch's products beside the Hessians it owns.
    """
    import torch

    owner: dict[str, str] = {m: group[0] for group in fixed for m in group}
    expert_keys = {group[0] for group in fixed}
    last: list[Any] = [None, None]  # (the tensor last accumulated, its module): held, so never reused
    seen: set[str] = set()
    alone = world.size == 1
    products: dict[str, Any] = {}  # this step's, keyed by the group's first module (alone: the sums themselves)
    rows: dict[str, Any] = {}  # this step's inputs of each expert group reached (not alone)
    tokens: dict[str, int] = {}  # rows of each fixed group's Hessian, on its owner

    def hook_for(path: str) -> Any:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0]
            if path not in owner:
                owner[path] = last[1] if last[0] is x else path
            if owner[path] == path:
                flat = x.reshape(-1, x.shape[-1]).to(torch.float32)
                if not alone and path in expert_keys:
                    rows[path] = flat
                else:
                    if path in expert_keys:
                        tokens[path] = tokens.get(path, 0) + int(flat.shape[0])
                    if path not in products:
                        products[path] = torch.zeros((x.shape[-1], x.shape[-1]), dtype=torch.float32)
                    elif not alone:
                        products[path].zero_()
                    add_gram(products[path], flat, alpha=2.0)  # upper triangle
                last[0], last[1] = x, path
            seen.add(path)
            if len(seen) == len(linears):
                raise _AllSeen

        return hook

    def grouped(keys: Any) -> list[tuple[list[str], int]]:
        """The groups of the modules first reached in this step, then the fixed ones, with their widths."""
        found = [([m for m in linears if owner.get(m) == key], int(linears[key].weight.shape[1])) for key in keys]
        known = [(group, int(linears[group[0]].weight.shape[1])) for group in fixed]
        return [g for g in found if g[0][0] not in expert_keys] + known

    handles = [module.register_forward_pre_hook(hook_for(path)) for path, module in linears.items()]
    structure: list[tuple[list[str], int]] = []  # (members, input width) per group: rank 0's, told to all
    owners: dict[str, int] = {}
    sums: dict[str, Any] = {}
    try:
        for step in range(-(-batches // world.size)):
            b = step * world.size + world.rank
            rows.clear()
            if b < batches:
                with suppress(_AllSeen):
                    calls[b](layer, hidden[b])
                last[0] = last[1] = None
                seen.clear()
            if alone:
                continue
            if step == 0:
                mine = grouped(products)
                structure = _structure(world.broadcast_json(mine if world.leader else None, 0, GROUPS), linears, world)
                owners = _owners(structure, linears, world.size)
            senders = [r for r in range(world.size) if step * world.size + r < batches]
            for members, width in structure:
                key, to = members[0], owners[members[0]]
                if key in expert_keys:
                    _exchange_expert(key, width, rows, sums, tokens, to, senders, world)
                elif to == world.rank:
                    total = sums.setdefault(key, torch.zeros((width, width), dtype=torch.float32))
                    for r in senders:
                        total.add_(products[key] if r == world.rank else world.receive(r, (width, width)))
                elif world.rank in senders:
                    world.send(products[key], to)
    finally:
        for handle in handles:
            handle.remove()
    if alone:
        sums = products
        structure = grouped([key for key in products if key not in expert_keys])
        owners = {members[0]: 0 for members, _ in structure}
    empty = torch.empty(0)
    groups = [
        (
            members,
            symmetrize(sums[members[0]]).div_(n)
            if members[0] in sums
            else (None if owners[members[0]] == world.rank else empty),
        )
        for members, _ in structure
    ]
    return groups, owners, {key: tokens.get(key, 0) for key in expert_keys if owners.get(key) == world.rank}


def _exchange_expert(
    key: str, width: int, rows: dict[str, Any], sums: dict[str, Any], tokens: dict[str, int], to: int,
    senders: list[int], world: World,
) -> None:  # fmt: skip
    """One step of an expert group's Hessian across ranks: each sender tells the owner `to` how many
    input rows it has (an int64), then sends them when fewer than the width, their `2 X^T X` otherwise,
    nothing when none; the owner adds each in rank order (making a product from rows with the
    `add_gram` the sender would have used) and counts the rows. A negative count is refused."""
    import torch

    mine = rows.get(key)
    if world.rank != to:
        if world.rank not in senders:
            return
        count = 0 if mine is None else int(mine.shape[0])
        world.send(torch.tensor([count], dtype=torch.int64), to)
        if mine is not None and count >= width:
            product = torch.zeros((width, width), dtype=torch.float32)
            add_gram(product, mine, alpha=2.0)
            world.send(product, to)
        elif mine is not None and count:
            world.send(mine.contiguous(), to)
        return
    for r in senders:
        part, count = mine, 0 if mine is None else int(mine.shape[0])
        if r != world.rank:
            count = int(world.receive(r, (1,), "int64").item())
            if count < 0:
                raise Message(f"summing {key}", f"sent {count} input rows of {key}").refusal(
                    r, world.size, "(a count is never negative)"
                )
            part = None if count == 0 else world.receive(r, (width, width) if count >= width else (count, width))
            if count >= width:
                sums.setdefault(key, torch.zeros((width, width), dtype=torch.float32)).add_(part)
                tokens[key] = tokens.get(key, 0) + count
                continue
        if part is not None and count:
            add_gram(sums.setdefault(key, torch.zeros((width, width), dtype=torch.float32)), part, alpha=2.0)
            tokens[key] = tokens.get(key, 0) + count


def _structure(told: object, linears: dict[str, Any], world: World) -> list[tuple[list[str], int]]:
    """Rank 0's groups of the layer as `broadcast_json` gave them, (members, input width) each, once
    every member is one of this layer's modules, named in one group only, reading that width: every
    rank makes Hessians of these widths, so anything else is refused, naming rank 0, before one is made."""
    structure: list[tuple[list[str], int]] = []
    seen: set[str] = set()
    for group in told if isinstance(told, list) else [None]:
        if not (isinstance(group, list) and len(group) == 2 and isinstance(group[0], list) and type(group[1]) is int):
            raise GROUPS.malformed(0, world.size)
        members, width = group
        names = [m for m in members if isinstance(m, str) and m in linears and m not in seen]
        if not names or len(set(names)) < len(members) or any(linears[m].weight.shape[1] != width for m in names):
            raise GROUPS.malformed(0, world.size)
        seen.update(names)
        structure.append((names, width))
    return structure


def _owners(structure: list[tuple[list[str], int]], linears: dict[str, Any], size: int) -> dict[str, int]:
    """The rank that solves each group (by its first module): the costliest first, each to the rank
    with the least work so far (GPTQ's arithmetic grows as rows x width^2 + width^3), ties to the lower
    rank: a function of the layer alone, so every rank computes the same answer."""
    load = [0] * size
    out: dict[str, int] = {}
    cost = {
        members[0]: width * width * (width + sum(int(linears[m].weight.shape[0]) for m in members))
        for members, width in structure
    }
    for members, _ in sorted(structure, key=lambda g: -cost[g[0][0]]):
        rank = min(range(size), key=lambda r: (load[r], r))
        out[members[0]] = rank
        load[rank] += cost[members[0]]
    return out


@dataclass
class _Solved:
    """One module's outcome of its group's solve: its dequantized weight and integer values (None when
    its scheme has no grid), the clip factors of a searched grid, and why it fell back, if it did."""

    dequantized: Any = None
    codes: npt.NDArray[np.int8] | None = None
    shrink: npt.NDArray[np.float32] | None = None
    fallback: str | None = None
    #: an expert module's calibration tokens (None for any other module)
    tokens: int | None = None


def _in_parallel(
    quantize_group: Callable[[list[str], Any], dict[str, _Solved]], groups: list[Group], workers: int
) -> dict[str, _Solved]:
    """`quantize_group(members, hessian)` for every group, on `workers` threads, the costliest first.

    Torch is held to one thread for the duration, so each group's linear algebra runs on a core of
    its own (the column kernel releases the GIL too): independent streams, none waiting at another's
    barrier, as two torch threads on one matrix would on a shared machine. A layer's groups are
    uneven (down_proj's Hessian is 2.7x wider than the rest), so the widest goes first.
    """
    costliest = sorted(groups, key=lambda g: 0 if g[1] is None else g[1].shape[0], reverse=True)  # widest first
    solved: dict[str, _Solved] = {}
    with _one_thread():
        pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="gptq")
        try:
            for done in [pool.submit(quantize_group, members, hessian) for members, hessian in costliest]:
                solved |= done.result()
        finally:  # a failure or an interrupt: the groups not yet started are dropped, not run to the end
            pool.shutdown(wait=True, cancel_futures=True)
    return solved


def _share(
    solved: dict[str, _Solved],
    groups: list[Group],
    owners: dict[str, int],
    linears: dict[str, Any],
    targets: dict[str, Target],
    world: World,
) -> None:
    """Every module's weight replaced by its dequantized values on every rank (each rank runs its batches
    through the quantized layer), and the leader given every module's outcome (the values it writes)."""
    for members, _ in groups:
        source = owners[members[0]]
        for m in members:
            if world.size > 1:
                mine = solved[m] if world.rank == source else None
                solved[m] = _told(mine, m, source, linears[m].weight.shape, targets[m].scheme.group_size, world)
            if solved[m].dequantized is not None:
                linears[m].weight.data.copy_(solved[m].dequantized)


def _told(mine: _Solved | None, m: str, source: int, shape: tuple[int, ...], group: int, world: World) -> _Solved:
    """Module `m`'s outcome on every rank, as its owner `source` solved it (`mine` there, None elsewhere).

    No rank unpickles what another sends (a rank on the port may be anyone's): the outcome goes as JSON
    (`_outcome`), the clip factors as a float32 array checked against the grid's shape (a row per
    weight row, a column per group of `group`; the int4 kernels read that many), then the dequantized
    values and integer values of the weight's `shape`.
    """
    import torch

    message = Message(f"sharing {m}", f"sent the outcome of {m}", "a JSON outcome of GPTQ")
    told = None if mine is None else {"valued": mine.codes is not None, "shrink": mine.shrink is not None,
                                      "fallback": mine.fallback, "tokens": mine.tokens}  # fmt: skip
    valued, searched, fallback, tokens = _outcome(
        world.broadcast_json(told, source, message), message, source, world.size
    )
    out = mine if mine is not None else _Solved(fallback=fallback, tokens=tokens)
    if searched:
        grid = (int(shape[0]), int(shape[1]) // group)
        clip = Message(f"sharing {m}", f"sent the clip factors of {m}")
        out.shrink = world.broadcast_array(out.shrink, source, clip, "float32", grid[0] * grid[1])
        if out.shrink.shape != grid:
            raise clip.refusal(source, world.size, f"of shape {list(out.shrink.shape)}, not {list(grid)}")
    if valued and mine is not None:
        assert mine.codes is not None, "an outcome with values holds them"
        world.broadcast(mine.dequantized, source, message.exchange)
        world.broadcast(torch.from_numpy(mine.codes), source, message.exchange)
    elif valued:
        out.dequantized = world.broadcast(torch.empty(shape, dtype=torch.float32), source, message.exchange)
        out.codes = world.broadcast(torch.empty(shape, dtype=torch.int8), source, message.exchange).numpy()
    return out


def _outcome(told: object, message: Message, source: int, size: int) -> tuple[bool, bool, str | None, int | None]:
    """(valued, searched, fallback, tokens) of a module as its owner told it, once it is an outcome
    `_quantize_group` gives: values (clip factors or not; no reason or `SINGULAR`), or none for a
    scheme without a grid (`NO_GRID`) or a group no token reached (`NO_TOKENS`); an expert's tokens (a
    count, or None for another module). The reason is written into the manifest, so no other text is
    taken."""
    if isinstance(told, dict) and set(told) == {"valued", "shrink", "fallback", "tokens"}:
        valued, searched, fallback, tokens = told["valued"], told["shrink"], told["fallback"], told["tokens"]
        if not (tokens is None or (type(tokens) is int and tokens >= 0)):
            raise message.malformed(source, size)
        if valued is True and isinstance(searched, bool) and fallback in (None, SINGULAR):
            return True, searched, None if fallback is None else SINGULAR, tokens
        if valued is False and searched is False and fallback in (NO_GRID, NO_TOKENS):
            return False, False, NO_GRID if fallback == NO_GRID else NO_TOKENS, tokens
    raise message.malformed(source, size)


def _keep(solved: dict[str, _Solved], workdir: Path | None, result: Result) -> None:
    """The leader's record of a layer's outcomes: values to `workdir` (memory-mapped back), fallbacks."""
    assert workdir is not None, "the leader keeps the values in its workdir"
    for m, one in solved.items():
        if one.codes is not None:
            path = workdir / f"{m}.npy"
            np.save(path, one.codes)
            result.chosen[m] = Chosen(np.load(path, mmap_mode="r"), one.shrink)
        if one.fallback is not None:
            result.rtn[m] = one.fallback
        if one.tokens is not None:
            result.tokens[m] = one.tokens


class _AllSeen(Exception):
    """Raised by the last Linear's hook in a batch: every Hessian has its share of the batch."""


def _quantize_group(
    members: list[str],
    hessian: Any,
    *,
    linears: dict[str, Any],
    targets: dict[str, Target],
    dampening: float,
    block_size: int,
    actorder: str,
) -> dict[str, _Solved]:
    """GPTQ on the stacked rows of `members` (one input, one Hessian): each module's dequantized values
    and integer values."""
    import torch

    if hessian is None:
        return {m: _Solved(fallback=NO_TOKENS) for m in members}
    weights = [linears[m].weight.detach() for m in members]
    grids = [targets[m].scheme.grid(w.numpy().astype(targets[m].dtype)) for m, w in zip(members, weights, strict=True)]
    if len({None if g is None else (g.group, g.q_min, g.q_max, g.zero_point is None) for g in grids}) > 1:
        out: dict[str, _Solved] = {}
        for m in members:  # one input but different grids (or none for some): one column loop each
            out |= _quantize_group(
                [m], hessian.clone(), linears=linears, targets=targets, dampening=dampening,
                block_size=block_size, actorder=actorder,
            )  # fmt: skip
        return out
    real = [g for g in grids if g is not None]
    if not real:
        return {m: _Solved(fallback=NO_GRID) for m in members}
    first = real[0]
    searched = any(g.shrink is not None for g in real)
    grid = Grid(
        np.concatenate([g.scale.astype(np.float32) for g in real]).astype(first.scale.dtype),
        None if first.zero_point is None else np.concatenate([g.zero_point for g in real if g.zero_point is not None]),
        first.group,
        first.q_min,
        first.q_max,
    )
    codes, dequantized, singular = quantize_weight(torch.cat(weights), hessian, grid, dampening, block_size, actorder)
    out = {}
    r0 = 0
    for m, w, g in zip(members, weights, real, strict=True):
        r1 = r0 + w.shape[0]
        shrink = None if not searched else g.shrink if g.shrink is not None else np.ones(g.scale.shape, np.float32)
        fallback = SINGULAR if singular else None
        out[m] = _Solved(dequantized[r0:r1].contiguous(), np.ascontiguousarray(codes[r0:r1]), shrink, fallback)
        r0 = r1
    return out
