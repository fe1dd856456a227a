"""What the 8-bit schemes share: one int8 or FP8 value per byte, a scale per channel, group or block.

compressed-tensors stores these weights unpacked (`float-quantized`, `int-quantized`): `weight`
in int8 or float8_e4m3fn, `weight_scale` in the original weight dtype. The arithmetic is in
quant/eightbit.py. This module registers no scheme; `fp8.py` and `int8.py` subclass `EightBit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from weightsmith import names
from weightsmith.errors import WeightsmithError
from weightsmith.formats import compressed_tensors as ct
from weightsmith.quant import eightbit
from weightsmith.safetensors.writer import TensorSpec
from weightsmith.schemes.base import Alloc, Scheme, Write, fresh

#: safetensors dtype of the stored weight, by `QuantizationArgs.type`.
WEIGHT_DTYPES = {eightbit.INT: "I8", eightbit.FLOAT: "F8_E4M3"}


def dynamic_activations(type_: str, strategy: str, group_size: int | None = None) -> dict:
    """An `input_activations` block quantized at run time (no stored scale): 8 bits, symmetric."""
    return dict(ct.weight_args(8, True, group_size, type_=type_, strategy=strategy), dynamic=True)


def refuse_options(name: str, group_size: int | None, scale_search: str | None) -> None:
    """A usage error for options a scheme does not take: a scale search (none is offered for
    8 bits) and, where `group_size` is given, `--group-size` (scales over whole rows or fixed blocks)."""
    if scale_search is not None:
        raise WeightsmithError(f"{name} takes no --scale-search (it is plain round-to-nearest)", code="usage")
    if group_size is not None:
        raise WeightsmithError(f"{name} takes no --group-size (its scale layout is fixed)", code="usage")


def block_of(weights: dict, shape: tuple[int, int]) -> eightbit.Block:
    """The rows x columns one scale covers, from a config group's `weights` block."""
    strategy = weights.get("strategy")
    if strategy == "channel":
        return 1, None
    if strategy == "group":
        return 1, int(weights["group_size"])
    if strategy == "block":
        rows, cols = weights["block_structure"]
        return int(rows), int(cols)
    if strategy == "tensor":
        return max(shape[0], 1), None
    raise ValueError(f"strategy {strategy!r}")


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

    def stored_words(self) -> str:
        kind = "8-bit FP8 (E4M3) weights" if self.KIND == eightbit.FLOAT else "8-bit integer weights, symmetric"
        rows, cols = self.block
        per = f"{rows}x{cols} block" if rows > 1 else f"{cols} input columns" if cols else "output channel"
        return f"{kind}, one scale per {per}"

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        return None  # every 2-D weight: edge blocks may be partial

    def outputs(self, module: str, shape: tuple[int, int], weight_dtype: str) -> list[TensorSpec]:
        rows, cols = self.block
        scale_shape = (-(-shape[0] // rows), -(-shape[1] // (cols or max(shape[1], 1))))
        return [
            TensorSpec(f"{module}.{names.WEIGHT}", WEIGHT_DTYPES[self.KIND], shape),
            TensorSpec(f"{module}.{names.WEIGHT_SCALE}", weight_dtype, scale_shape),
        ]

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

    @classmethod
    def recognizes(cls, fmt: str, weights: dict) -> bool:
        return fmt in ct.UNPACKED_FORMATS and weights.get("type") == cls.KIND and weights.get("num_bits") == 8

    @classmethod
    def decode(cls, weights: dict, params: dict[str, np.ndarray]) -> np.ndarray:
        q = params[names.WEIGHT]
        return eightbit.dequantize(eightbit.EightBitWeight(q, params[names.WEIGHT_SCALE]), block_of(weights, q.shape))
