"""Dequantizing one quantized module of a checkpoint: its on-disk parameters read, then decoded.

`eval` measures a module's weight error against this dense weight, and the engine runs the model
with it, so both see the weight exactly as the compressed-tensors decompressor gives it (each
scheme's `decode`). Which modules are quantized, and by which config group, is the declaration's
business (`formats.declaration.quantized_modules`); how their bytes decode is the schemes'.

Importing this module registers every scheme and so loads the kernels (numba): callers that may
only read a config import it where they dequantize.
"""

from __future__ import annotations

import numpy as np

from weightsmith import schemes  # its `decode`, once the package has registered every scheme
from weightsmith.core.errors import CheckpointError
from weightsmith.formats.declaration import QuantizedModule
from weightsmith.formats.source import TensorReader
from weightsmith.io import names


def dequantize(qm: QuantizedModule, reader: TensorReader) -> np.ndarray:
    """The module's dense weight, read through `reader`. NotImplementedError: the format is not supported yet."""
    params = {param: reader.read(name) for param, name in qm.params.items()}
    try:
        return schemes.decode(qm.format or "", qm.weights, params)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        marker = qm.params.get(names.WEIGHT_PACKED) or qm.params[names.WEIGHT_SCALE]
        raise CheckpointError(
            f"cannot be dequantized as {qm.format} ({type(exc).__name__}: {exc})",
            file=reader.ckpt.file_of(marker),
            tensor=marker,
            code="eval.dequantize",
        ) from None
