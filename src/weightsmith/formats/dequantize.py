"""Dequantizing one quantized module of a checkpoint: its on-disk parameters read, then decompressed.

`eval` measures a module's weight error against this dense weight, and the engine runs the model
with it, so both see the weight exactly as the compressed-tensors decompressor gives it (each
format's `decompress`, formats/compressors/). Which modules are quantized, and by which config
group, is the declaration's business (`formats.declaration.quantized_modules`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightsmith.core.errors import CheckpointError
from weightsmith.formats import compressors
from weightsmith.formats.declaration import QuantizedModule
from weightsmith.formats.source import TensorReader

if TYPE_CHECKING:
    import numpy as np


def dequantize(qm: QuantizedModule, reader: TensorReader) -> np.ndarray:
    """The module's dense weight, read through `reader`. NotImplementedError: the format is not supported yet."""
    params = {param: reader.read(name) for param, name in qm.params.items()}
    try:
        return compressors.decompress(qm.format or "", qm.weights, params)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        marker = qm.marker
        raise CheckpointError(
            f"cannot be dequantized as {qm.format} ({type(exc).__name__}: {exc})",
            file=reader.ckpt.file_of(marker),
            tensor=marker,
            code="eval.dequantize",
        ) from None
