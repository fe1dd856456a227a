"""The original weights a quantized checkpoint is measured against, read one module at a time.

BF16/FP16/FP32 weights are returned as stored. FP8 weights are decoded to BF16 exactly as the
quantizer decodes them before quantizing (`quant.fp8`, `plan.detect_source_format`), so the error
measured is the error quantization added, not the FP8 rounding that was already there.
"""

from __future__ import annotations

from typing import Self

import numpy as np

from weightsmith.core.errors import CheckpointError
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import fp8
from weightsmith.quantize.plan import SourceFormat, detect_source_format
from weightsmith.safetensors.dtypes import DENSE_FLOATS, FP8_FLOATS
from weightsmith.safetensors.reader import ShardReader


class TensorReader:
    """Whole tensors of a checkpoint by name, through one open reader per shard."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self._readers: dict[str, ShardReader] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def read(self, name: str) -> np.ndarray:
        shard = self.ckpt.tensors[name].shard
        if shard not in self._readers:
            self._readers[shard] = ShardReader(self.ckpt.path(shard), self.ckpt.headers[shard])
        return self._readers[shard].read(name)


def source_format(ckpt: Checkpoint) -> SourceFormat:
    """Dense or FP8, as the quantizer sees it; anything already quantized is refused for ORIG."""
    try:
        return detect_source_format(ckpt)
    except CheckpointError as exc:
        if exc.code != "source.already-quantized":
            raise
        raise CheckpointError(
            "is already quantized: ORIG must be the unquantized (BF16/FP16/FP32) or FP8 original",
            file=exc.file,
            code="eval.orig-quantized",
        ) from None


class OriginalWeights(TensorReader):
    """Dense weights of ORIG by module name. Holds open file descriptors, never tensor data."""

    def __init__(self, ckpt: Checkpoint) -> None:
        super().__init__(ckpt)
        self.format = source_format(ckpt)

    def nbytes(self, module: str) -> int:
        """Bytes read from disk for the module's weight (and its FP8 scale)."""
        held = [f"{module}.{names.WEIGHT}", f"{module}.{self.format.scale_param}"]
        return sum(self.ckpt.tensors[n].info.nbytes for n in held if n in self.ckpt.tensors)

    def shape(self, module: str) -> tuple[int, ...]:
        """The weight's shape from the header, after checking it is there and dense or FP8."""
        name = f"{module}.{names.WEIGHT}"
        ref = self.ckpt.tensors.get(name)
        if ref is None:
            raise CheckpointError(
                f"is not in ORIG, but QUANT quantizes {module}: the two checkpoints do not correspond",
                file=self.ckpt.root,
                tensor=name,
                code="eval.mismatch",
            )
        dtype = ref.info.dtype.code
        if dtype not in DENSE_FLOATS + FP8_FLOATS:
            raise CheckpointError(
                f"is {dtype}: ORIG must hold BF16, FP16, FP32 or FP8 weights",
                file=self.ckpt.path(ref.shard),
                tensor=name,
                code="eval.orig-dtype",
            )
        if dtype in FP8_FLOATS and self.format.scale_param is None:
            raise CheckpointError(
                "is FP8 but ORIG's config.json declares no FP8 quantization, so there is no scale to decode it",
                file=self.ckpt.path(ref.shard),
                tensor=name,
                code="eval.orig-fp8",
            )
        return ref.info.shape

    def weight(self, module: str) -> np.ndarray:
        """The module's weight as a dense float array (FP8 decoded to BF16)."""
        self.shape(module)
        name = f"{module}.{names.WEIGHT}"
        weight = self.read(name)
        if self.ckpt.tensors[name].info.dtype.code not in FP8_FLOATS:
            return weight
        block = self.format.scale_block(self.ckpt, name)
        return fp8.dequantize_rows(weight, self.read(f"{module}.{self.format.scale_param}"), 0, block)
