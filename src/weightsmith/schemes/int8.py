"""W8A8 (alias INT8) and W8A16: int8 weights, compressed-tensors `int-quantized` and `pack-quantized`.

W8A8 scales each output channel and quantizes activations per token at run time (no calibration).
W8A16 is compressed-tensors' `_int_wnam(8)` preset: symmetric groups of 128 input columns,
weight-only, stored as W4A16 is (`pack-quantized`, formats/compressors/pack_quantized.py: four int8
values to an int32 word; `weight_scale`; `weight_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.compressors.pack_quantized import PackQuantized, per_word
from weightsmith.io import names
from weightsmith.quant import INT
from weightsmith.schemes.base import Alloc, Chosen, Grid, Scheme, Write, fresh, register
from weightsmith.schemes.eightbit import EightBit, dynamic_activations, refuse_options

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import eightbit
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    eightbit = lazy_module("weightsmith.quant.eightbit")

DEFAULT_GROUP = 128
PER_WORD = per_word(8)  # int8 values per packed int32
Q_MIN, Q_MAX = -128, 127  # compressed-tensors' range for 8-bit integers


@register
@dataclass(frozen=True)
class W8A8(EightBit):
    NAMES: ClassVar[tuple[str, ...]] = ("w8a8", "int8")
    FORMAT: ClassVar[str] = ct.INT_QUANTIZED
    KIND: ClassVar[str] = INT

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        refuse_options(name, group_size, scale_search)
        return cls(name, 0)

    def weight_args(self) -> dict[str, Any]:
        return ct.weight_args(8, True, None, strategy="channel")

    def input_args(self) -> dict[str, Any]:
        return dynamic_activations(INT, "token")


@register
@dataclass(frozen=True)
class W8A16(EightBit):
    NAMES: ClassVar[tuple[str, ...]] = ("w8a16",)
    FORMAT: ClassVar[str] = ct.PACK_QUANTIZED
    KIND: ClassVar[str] = INT

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        refuse_options(name, None, scale_search)
        group_size = DEFAULT_GROUP if group_size is None else group_size
        if group_size <= 0 or group_size % PER_WORD:
            raise WeightsmithError(f"--group-size {group_size} must be a positive multiple of {PER_WORD}", code="usage")
        return cls(name, group_size)

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        if shape[1] % self.group_size:
            return f"input size {shape[1]} is not a multiple of the group size {self.group_size}"
        return None

    def weight_args(self) -> dict[str, Any]:
        return ct.weight_args(8, True, self.group_size)

    def grid(self, x: np.ndarray) -> Grid | None:
        writes, bad = super().encode(x, 0, x.shape)
        if bad >= 0:
            raise ValueError(f"non-finite value at row {bad // x.shape[1]}, column {bad % x.shape[1]}")
        scale = next(data for name, data, _ in writes if name == names.WEIGHT_SCALE)
        return Grid(scale, None, self.group_size, Q_MIN, Q_MAX)

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        writes, bad = super().encode(x, r0, shape, tensor_param, alloc)
        if bad >= 0 or not writes:
            return writes, bad
        (_, q, offset), scale = writes
        if isinstance(tensor_param, Chosen):  # the grid is these rows' own; the points on it were chosen
            q = np.array(tensor_param.codes[r0 : r0 + len(x)], np.int8)
        packed = PackQuantized.pack(q, 8, axis=1, in_place=True)  # q is this call's buffer
        writes = [(names.WEIGHT_PACKED, packed, offset), scale]
        if r0 == 0:
            writes.append((names.WEIGHT_SHAPE, np.array(shape, np.int64), 0))
        return writes, -1
