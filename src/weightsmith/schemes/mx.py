"""MX (OCP microscaling) schemes: FP4 or FP8 weights in groups of 32 sharing an E8M0 power of two.

MXFP4A16 / MXFP4 write `mxfp4-pack-quantized` (`weight_packed` two E2M1 codes a byte) and
MXFP8A16 / MXFP8 `mxfp8-quantized` (`weight` float8_e4m3fn); both store `weight_scale` as uint8
biased exponents. MXFP4 and MXFP8 write the same weights as their A16 twins and declare dynamic
group-32 activations of the same element type in the config group. Each group's scale depends on
that group alone (compressed-tensors `group` strategy: no global scale), so there is no first pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.quant import MX_GROUP, mx_unsupported
from weightsmith.schemes.base import Alloc, Scheme, Write, fresh, register

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import int4, mx
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    int4 = lazy_module("weightsmith.quant.int4")
    mx = lazy_module("weightsmith.quant.mx")

#: compressed-tensors writes the E8M0 exponents with this `scale_dtype`.
SCALE_DTYPE = "torch.uint8"


@dataclass(frozen=True)
class _Mx(Scheme):
    """What MXFP4 and MXFP8 share: everything but the element width (`num_bits`) and the format."""

    BITS: ClassVar[int]

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        if group_size not in (None, MX_GROUP):
            raise WeightsmithError(f"{name} has a fixed group size of {MX_GROUP}", code="usage")
        if scale_search is not None:
            raise WeightsmithError(f"{name} takes no --scale-search: its scales are powers of two", code="usage")
        return cls(name, MX_GROUP, num_bits=cls.BITS)

    @property
    def config_group_name(self) -> str:
        return self.name.upper()

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        return mx_unsupported(shape[1])

    def _args(self, dynamic: bool) -> dict[str, Any]:
        args = ct.weight_args(self.num_bits, True, MX_GROUP, type_="float", scale_dtype=SCALE_DTYPE)
        args["dynamic"] = dynamic
        return args

    def weight_args(self) -> dict[str, Any]:
        return self._args(dynamic=False)

    def input_args(self) -> dict[str, Any] | None:
        return None if self.name.endswith("a16") else self._args(dynamic=True)

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        n, cols = x.shape
        width = cols // 2 if self.num_bits == 4 else cols
        out = alloc("codes", (n, width), np.uint8)
        scale = alloc("scale", (n, cols // MX_GROUP), np.uint8)
        bad = mx.quantize_rows(int4.kernel_input(x), int4.mode_of(x.dtype), self.num_bits, out, scale)
        return [(self.layout.codes, out, r0 * width), (names.WEIGHT_SCALE, scale, r0 * (cols // MX_GROUP))], bad


@register
@dataclass(frozen=True)
class Mxfp4(_Mx):
    NAMES: ClassVar[tuple[str, ...]] = ("mxfp4a16", "mxfp4")
    FORMAT: ClassVar[str] = ct.MXFP4_PACK_QUANTIZED
    BITS: ClassVar[int] = 4


@register
@dataclass(frozen=True)
class Mxfp8(_Mx):
    NAMES: ClassVar[tuple[str, ...]] = ("mxfp8a16", "mxfp8")
    FORMAT: ClassVar[str] = ct.MXFP8_QUANTIZED
    BITS: ClassVar[int] = 8
