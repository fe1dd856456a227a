"""compressed-tensors `float-quantized`, `int-quantized` and `naive-quantized`: one value per byte.

Facts from compressed-tensors 0.19 `compressors/naive_quantized`: `weight` [out, in] holds each
value in a byte of its own, float8_e4m3fn for `type: float` (FP8; 8 bits only) and int8 for
`type: int` (int8, or int4 values as W4AFP8 stores them); `weight_scale` is in the weight's float
dtype, one per scale block of the declared strategy. The three names store alike (compressed-tensors
tells them apart by the dtype it casts to); each reads a group by its declared `type`. Nothing is
packed: a kernel's output bytes are the stored ones, and `pack`/`unpack` only reinterpret them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.compressors.base import Compressor, input_dtype, register
from weightsmith.formats.layouts import Args, Layout
from weightsmith.io import names
from weightsmith.safetensors.dtypes import DTYPES

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


#: The stored dtype of a value, by `QuantizationArgs.type`: its safetensors code.
CODES = {"float": "F8_E4M3", "int": "I8"}
#: The (type, num_bits) pairs `decompress` reads: those our schemes write (FP8, int8, W4AFP8's int4).
READ = (("float", 8), ("int", 8), ("int", 4))


def block_of(weights: dict[str, Any], shape: tuple[int, int]) -> tuple[int, int | None]:
    """The rows x columns one scale covers, from a config group's `weights` block (the layout's rule)."""
    block = Args.of(weights).scale_block
    return block if block is not None else (max(shape[0], 1), None)


class _OneValuePerByte(Compressor):
    @classmethod
    def layout(cls, args: Args, inputs: str | None = None) -> Layout | None:
        code = CODES.get(args.type or "")
        if code is None or (args.num_bits != 8 and args.type != "int"):
            return None
        return Layout(
            args, names.WEIGHT, code, scale_block=args.scale_block, input_scale=inputs, input_dtype=input_dtype(inputs)
        )

    @staticmethod
    def pack(values: np.ndarray) -> np.ndarray:
        """The stored bytes of int8 or float8_e4m3fn values (a view: nothing moves)."""
        return np.asarray(values).view(np.uint8)

    @staticmethod
    def unpack(raw: np.ndarray, type_: str) -> np.ndarray:
        """The values stored bytes hold under a declared `type` (a view)."""
        return np.asarray(raw).view(DTYPES[CODES[type_]].element)

    @classmethod
    def recognizes(cls, weights: dict[str, Any]) -> bool:
        return (weights.get("type"), weights.get("num_bits")) in READ

    @classmethod
    def decompress(cls, weights: dict[str, Any], params: dict[str, np.ndarray]) -> np.ndarray:
        from weightsmith.quant import eightbit  # the arithmetic; reading layouts must not start numba

        q = params[names.WEIGHT]
        return eightbit.dequantize(eightbit.EightBitWeight(q, params[names.WEIGHT_SCALE]), block_of(weights, q.shape))


@register
class FloatQuantized(_OneValuePerByte):
    NAME: ClassVar[str] = ct.FLOAT_QUANTIZED


@register
class IntQuantized(_OneValuePerByte):
    NAME: ClassVar[str] = ct.INT_QUANTIZED


@register
class NaiveQuantized(_OneValuePerByte):
    NAME: ClassVar[str] = ct.NAIVE_QUANTIZED
