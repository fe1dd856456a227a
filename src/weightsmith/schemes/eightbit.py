"""What the 8-bit schemes share: one int8 or FP8 value per byte, a scale per channel, group or block.

compressed-tensors stores these weights unpacked (`float-quantized`, `int-quantized`; the tensors
and their reading back are in formats/compressors/naive_quantized.py). The arithmetic is in
quant/eightbit.py. This module registers no scheme; `fp8.py` and `int8.py` subclass `EightBit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.schemes.base import Alloc, Scheme, Write, fresh

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import eightbit
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    eightbit = lazy_module("weightsmith.quant.eightbit")


def dynamic_activations(type_: str, strategy: str, group_size: int | None = None) -> dict[str, Any]:
    """An `input_activations` block quantized at run time (no stored scale): 8 bits, symmetric."""
    return dict(ct.weight_args(8, True, group_size, type_=type_, strategy=strategy), dynamic=True)


def refuse_options(name: str, group_size: int | None, scale_search: str | None) -> None:
    """A usage error for options a scheme does not take: a scale search (none is offered for
    8 bits) and, where `group_size` is given, `--group-size` (scales over whole rows or fixed blocks)."""
    if scale_search is not None:
        raise WeightsmithError(f"{name} takes no --scale-search (it is plain round-to-nearest)", code="usage")
    if group_size is not None:
        raise WeightsmithError(f"{name} takes no --group-size (its scale layout is fixed)", code="usage")


@dataclass(frozen=True)
class EightBit(Scheme):
    """Unpacked weights quantized over blocks of `ROW_MULTIPLE` rows x `group_size` columns (0: whole rows)."""

    num_bits: int = 8

    #: `QuantizationArgs.type` of the weights: eightbit.INT or eightbit.FLOAT.
    KIND: ClassVar[str]

    @property
    def block(self) -> eightbit.Block:
        return self.ROW_MULTIPLE, self.group_size or None

    @property
    def config_group_name(self) -> str:
        return self.name.upper().replace("-", "_")

    def describe(self) -> str:
        rows, cols = self.block
        layout = f"{rows}x{cols} blocks" if rows > 1 else f"g{cols}" if cols else "per channel"
        return f"{self.config_group_name} {layout}"

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        return None  # every 2-D weight: edge blocks may be partial

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        if x.size == 0:
            return [], -1
        q, scale, bad = eightbit.quantize_rows(x, self.KIND, self.block, alloc("q", x.shape, np.uint8))
        if bad >= 0:
            return [], bad
        stored = scale.astype(x.dtype)
        return [
            (names.WEIGHT, q, r0 * shape[1]),
            (names.WEIGHT_SCALE, stored, (r0 // self.ROW_MULTIPLE) * stored.shape[1] * stored.itemsize),
        ], -1
