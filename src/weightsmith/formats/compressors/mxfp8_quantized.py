"""compressed-tensors `mxfp8-quantized`: FP8 (E4M3) values one a byte, an E8M0 exponent per 32 inputs.

Facts from compressed-tensors 0.19 `compressors/mx`: `weight` float8_e4m3fn [out, in] and
`weight_scale` uint8 [out, in/32] biased exponents, as MXFP4's (formats/compressors/fp4_pack_quantized.py)
but with one value per byte, so nothing is packed: the kernel (quant/mx.py) writes the codes as stored,
and `pack`/`unpack` only reinterpret the bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.compressors.base import Compressor, register
from weightsmith.formats.compressors.fp4_pack_quantized import mx_decompress, mx_layout
from weightsmith.formats.layouts import Args, Layout
from weightsmith.io import names

if TYPE_CHECKING:
    import ml_dtypes
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")
    ml_dtypes = lazy_module("ml_dtypes")


@register
class Mxfp8Quantized(Compressor):
    NAME: ClassVar[str] = ct.MXFP8_QUANTIZED

    @classmethod
    def layout(cls, args: Args, inputs: str | None = None) -> Layout | None:
        return mx_layout(args, inputs, names.WEIGHT, "F8_E4M3", 8)

    @staticmethod
    def pack(values: np.ndarray) -> np.ndarray:
        """The stored bytes of float8_e4m3fn values (a view: nothing moves)."""
        return np.asarray(values).view(np.uint8)

    @staticmethod
    def unpack(raw: np.ndarray) -> np.ndarray:
        """The float8_e4m3fn values stored bytes hold (a view)."""
        return np.asarray(raw).view(ml_dtypes.float8_e4m3fn)

    @classmethod
    def recognizes(cls, weights: dict[str, Any]) -> bool:
        return True

    @classmethod
    def decompress(cls, weights: dict[str, Any], params: dict[str, np.ndarray]) -> np.ndarray:
        return mx_decompress(cls.layout(Args.of(weights)), params)
