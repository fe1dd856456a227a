"""W4AFP8: W4A16's int4 weights with FP8 activations quantized per token at run time.

The weights are exactly W4A16's (the same kernel, groups of 128, symmetric), but compressed-tensors
stores this preset `int-quantized`: one int4 value per int8 byte in `weight` [out, in], with
`weight_scale` [out, in/group] and no `weight_shape`. So `encode` is W4A16's with the kernel's
bytewise output, and decoding is the unpacked int decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.quant import FLOAT
from weightsmith.schemes.base import Alloc, Scheme, Write, fresh, register
from weightsmith.schemes.eightbit import dynamic_activations
from weightsmith.schemes.int4 import Int4

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import eightbit
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    eightbit = lazy_module("weightsmith.quant.eightbit")


@register
@dataclass(frozen=True)
class W4Afp8(Int4):
    NAMES: ClassVar[tuple[str, ...]] = ("w4afp8",)
    FORMAT: ClassVar[str] = ct.INT_QUANTIZED
    #: Round-to-nearest: the int4 default search was measured on W4A16 only (docs/scale-search-study.md).
    DEFAULT_SEARCH: ClassVar[str | None] = None

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        weights = Int4.make("w4a16", group_size, scale_search)  # the same options, checked the same way
        return cls(name, weights.group_size, scale_search=weights.scale_search)

    @property
    def config_group_name(self) -> str:
        return "W4AFP8"

    def input_args(self) -> dict[str, Any]:
        return dynamic_activations(FLOAT, "token")

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        n, cols = x.shape
        q = alloc("q", (n, cols), np.int8)  # the kernel writes one value per byte: nothing to unpack
        stored_scale, _, bad = self.quantize_into(x, r0, tensor_param, alloc, q)
        if bad >= 0:
            return [], bad
        groups = cols // self.group_size
        return [
            (names.WEIGHT, q, r0 * cols),
            (names.WEIGHT_SCALE, stored_scale, r0 * groups * stored_scale.itemsize),
        ], -1
