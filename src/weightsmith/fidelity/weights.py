"""Weight error of a quantized checkpoint against its original, streamed one module at a time.

For each quantized module: relative MSE `||W - Q(W)||^2 / ||W||^2` and SQNR `-10 log10(rel MSE)`
in dB, where `Q(W)` is the dense weight the compressed-tensors decompressor gives
(each format's `decompress`, `formats.dequantize`). Categories and the overall row add squared errors and
squared norms before dividing, so large matrices weigh in proportion to their size.

Only headers are held for the whole run; tensor data is one module at a time (its quantized
parameters, its dequantized weight and its original weight), and sums run in float64 over row
chunks so the float64 copies stay small whatever the matrix size.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core.errors import CheckpointError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats.declaration import QuantizedModule, quantized_modules
from weightsmith.formats.dequantize import dequantize
from weightsmith.formats.source import OriginalWeights, TensorReader
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


#: Elements per float64 chunk of the error sums (32 MiB per chunk array).
CHUNK_ELEMENTS = 1 << 22
#: The already-rounded check: rows sampled per weight, block width and the most distinct values a
#: block rounded to a 4-bit grid holds (GGUF's Q4_0/Q4_1 blocks: 32 weights, 16 levels).
GRID_ROWS = 64
GRID_BLOCK = 32
GRID_LEVELS = 16

Progress = Callable[[int], None]


@dataclass
class ErrorSummary:
    """Squared error and squared norm summed over some weights, and the ratios they give."""

    name: str
    layers: int
    numel: int
    sq_error: float
    sq_norm: float
    rel_mse: float
    sqnr_db: float


@dataclass
class LayerError:
    """One quantized module's weight error."""

    module: str
    category: str
    group: str
    format: str | None
    shape: list[int]
    numel: int
    sq_error: float
    sq_norm: float
    rel_mse: float
    sqnr_db: float


@dataclass
class Unsupported:
    """A quantized module whose format cannot be dequantized yet; left out of every sum."""

    module: str
    format: str | None
    reason: str


@dataclass
class GridCheck:
    """How many sampled blocks of the original's weights sit on a 4-bit grid (see `grid_blocks`)."""

    blocks: int = 0
    on_4bit_grid: int = 0


@dataclass
class WeightReport:
    """Per-layer, per-category and overall weight error of QUANT against ORIG."""

    source_format: str
    layers: list[LayerError]
    categories: list[ErrorSummary]
    overall: ErrorSummary
    unsupported: list[Unsupported] = field(default_factory=list)
    #: 2-D weights QUANT keeps unquantized (their error is zero by construction; not in any sum)
    kept: list[str] = field(default_factory=list)
    bytes_read: int = 0
    seconds: float = 0.0
    original_grid: GridCheck = field(default_factory=GridCheck)


def relative_mse(sq_error: float, sq_norm: float) -> float:
    """`sq_error / sq_norm`; an all-zero weight reproduced exactly has zero error, not NaN."""
    if sq_error == 0:
        return 0.0
    return sq_error / sq_norm if sq_norm > 0 else math.inf


def sqnr_db(rel_mse: float) -> float:
    """Signal to quantization noise in dB: infinite for an exact reproduction."""
    if rel_mse == 0:
        return math.inf
    return -10.0 * math.log10(rel_mse) if math.isfinite(rel_mse) else -math.inf


def squared_error(orig: np.ndarray, dequant: np.ndarray, chunk_elements: int = CHUNK_ELEMENTS) -> tuple[float, float]:
    """`(||W - Q||^2, ||W||^2)` in float64, over chunks of rows of at most `chunk_elements`."""
    rows = orig.shape[0]
    row_elems = max(1, orig.size // max(rows, 1))
    step = max(1, chunk_elements // row_elems)
    err = norm = 0.0
    for r0 in range(0, rows, step):
        w = orig[r0 : r0 + step].astype(np.float64)
        diff = w - dequant[r0 : r0 + step].astype(np.float64)
        err += float(np.sum(np.square(diff)))
        norm += float(np.sum(np.square(w)))
    return err, norm


def summarize(name: str, layers: list[LayerError]) -> ErrorSummary:
    """Sums over `layers`, then the ratios of the sums."""
    err = math.fsum(layer.sq_error for layer in layers)
    norm = math.fsum(layer.sq_norm for layer in layers)
    rel = relative_mse(err, norm) if layers else math.nan
    return ErrorSummary(name, len(layers), sum(layer.numel for layer in layers), err, norm, rel, sqnr_db(rel))


def _natural_key(module: str) -> list[int | str]:
    """`layers.10` after `layers.9`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", module)]


def _kept_weights(quant: Checkpoint, quantized: set[str]) -> list[str]:
    kept = []
    for name, ref in quant.tensors.items():
        module, param = names.split(name)
        if param == names.WEIGHT and len(ref.info.shape) == 2 and module not in quantized:
            kept.append(module)
    return sorted(kept, key=_natural_key)


def _check_declared_shape(qm: QuantizedModule, original: OriginalWeights, reader: TensorReader) -> None:
    """ORIG has the module, as a float weight of the shape QUANT's `weight_shape` declares (if any)."""
    expected = original.shape(qm.module)
    name = qm.params.get(names.WEIGHT_SHAPE)
    if name is None:
        return
    values = reader.read(name).reshape(-1)
    if not np.issubdtype(values.dtype, np.integer):
        raise CheckpointError(
            f"is {values.dtype}, not integers: it cannot declare {qm.module}'s shape",
            file=reader.ckpt.file_of(name),
            tensor=name,
            code="eval.shape-mismatch",
        )
    declared = [int(v) for v in values]
    if declared != list(expected):
        raise CheckpointError(
            f"declares shape {declared} but ORIG's {qm.module}.weight is {list(expected)}",
            file=reader.ckpt.file_of(name),
            tensor=name,
            code="eval.shape-mismatch",
        )


def _non_finite(
    qm: QuantizedModule, original: OriginalWeights, reader: TensorReader, orig_is_bad: bool
) -> CheckpointError:
    """The error for a weight whose sums came out NaN or infinite, naming the tensor that holds the bad values.

    A NaN anywhere makes the error NaN and the SQNR `-inf dB`, which reads like a measurement; it is
    a broken checkpoint instead. The sums are finite for any finite weights (float64 holds the square
    of the largest float32), so a non-finite norm means ORIG holds NaN/inf, and otherwise QUANT does.
    """
    if orig_is_bad:
        name = f"{qm.module}.{names.WEIGHT}"
        return CheckpointError(
            "holds NaN or infinite values: no weight error can be measured against it",
            file=original.ckpt.file_of(name),
            tensor=name,
            code="eval.non-finite",
        )
    for name in qm.params.values():
        values = reader.read(name)
        if np.issubdtype(values.dtype, np.integer):
            continue
        bad = int(np.count_nonzero(~np.isfinite(values.astype(np.float64))))
        if bad:
            return CheckpointError(
                f"holds {bad:,} NaN or infinite value(s) of {values.size:,}, so {qm.module} dequantizes to "
                "non-finite weights",
                file=reader.ckpt.file_of(name),
                tensor=name,
                code="eval.non-finite",
            )
    marker = qm.params.get(names.WEIGHT_SCALE) or qm.params[names.WEIGHT_PACKED]
    return CheckpointError(
        f"gives non-finite weights when {qm.module} is dequantized (a scale too large for the weight's dtype)",
        file=reader.ckpt.file_of(marker),
        tensor=marker,
        code="eval.non-finite",
    )


def grid_blocks(weight: np.ndarray) -> tuple[int, int]:
    """(blocks sampled, blocks with at most 16 distinct values) over the first rows of a 2-D weight.

    Every error here is measured against the original, so whether the original was itself already
    rounded matters: 32 consecutive trained weights in 16 or 32 bits hold close to 32 distinct values,
    while weights dequantized from a 4-bit format (a Q4 GGUF) hold at most 16 per block.
    """
    cols = weight.shape[1] // GRID_BLOCK * GRID_BLOCK if weight.ndim == 2 else 0
    if cols == 0:
        return 0, 0
    blocks = np.sort(np.asarray(weight[:GRID_ROWS, :cols], dtype=np.float32).reshape(-1, GRID_BLOCK), axis=1)
    distinct = 1 + np.count_nonzero(np.diff(blocks, axis=1), axis=1)
    return len(blocks), int(np.count_nonzero(distinct <= GRID_LEVELS))


def _measure(qm: QuantizedModule, original: OriginalWeights, reader: TensorReader, grid: GridCheck) -> LayerError:
    """One module's error (and its grid count added to `grid`). NotImplementedError: QUANT's format
    cannot be dequantized yet."""
    dequant = dequantize(qm, reader)
    expected = original.shape(qm.module)
    if tuple(dequant.shape) != tuple(expected):
        marker = qm.marker
        raise CheckpointError(
            f"dequantizes to shape {list(dequant.shape)} but ORIG's {qm.module}.weight is {list(expected)}",
            file=reader.ckpt.file_of(marker),
            tensor=marker,
            code="eval.shape-mismatch",
        )
    weight = original.weight(qm.module)
    err, norm = squared_error(weight, dequant)
    blocks, on_grid = grid_blocks(weight)
    grid.blocks += blocks
    grid.on_4bit_grid += on_grid
    if not (math.isfinite(err) and math.isfinite(norm)):
        raise _non_finite(qm, original, reader, orig_is_bad=not math.isfinite(norm))
    rel = relative_mse(err, norm)
    return LayerError(
        qm.module, qm.category, qm.group, qm.format, list(expected), math.prod(expected), err, norm, rel, sqnr_db(rel)
    )


def weight_error(
    orig_dir: str | Path,
    quant_dir: str | Path,
    *,
    progress: Progress | None = None,
    on_start: Callable[[int], None] | None = None,
) -> WeightReport:
    """Measure every quantized module of QUANT against ORIG's weight of the same name.

    `on_start(total_bytes)` is called once with the bytes the run will read, `progress(n)` after
    each module with its share. Raises `WeightsmithError` for bad input (one line naming the file
    and tensor); a format that cannot be dequantized yet is listed in `unsupported` instead.
    """
    started = time.perf_counter()
    quant = Checkpoint.open(quant_dir)
    modules = quantized_modules(quant)
    orig = Checkpoint.open(orig_dir)
    layers: list[LayerError] = []
    unsupported: list[Unsupported] = []
    bytes_read = 0
    grid = GridCheck()
    with OriginalWeights(orig) as original, TensorReader(quant) as reader:
        for qm in modules:  # mismatches fail before the long pass, not hours into it
            _check_declared_shape(qm, original, reader)
        quant_bytes = {qm.module: sum(quant.tensors[n].info.nbytes for n in qm.params.values()) for qm in modules}
        if on_start is not None:
            on_start(sum(quant_bytes[qm.module] + original.nbytes(qm.module) for qm in modules))
        for qm in modules:
            share = quant_bytes[qm.module] + original.nbytes(qm.module)
            try:
                layers.append(_measure(qm, original, reader, grid))
                bytes_read += share
            except NotImplementedError as exc:
                unsupported.append(Unsupported(qm.module, qm.format, str(exc)))
                bytes_read += quant_bytes[qm.module]
            if progress is not None:
                progress(share)

    layers.sort(key=lambda layer: _natural_key(layer.module))
    by_category: dict[str, list[LayerError]] = {}
    for layer in layers:
        by_category.setdefault(layer.category, []).append(layer)
    order = {c: i for i, c in enumerate(names.CATEGORIES)}
    categories = [summarize(c, ls) for c, ls in sorted(by_category.items(), key=lambda kv: order.get(kv[0], 99))]
    return WeightReport(
        source_format=original.format.kind,
        layers=layers,
        categories=categories,
        overall=summarize("overall", layers),
        unsupported=sorted(unsupported, key=lambda u: _natural_key(u.module)),
        kept=_kept_weights(quant, {qm.module for qm in modules}),
        bytes_read=bytes_read,
        seconds=time.perf_counter() - started,
        original_grid=grid,
    )
