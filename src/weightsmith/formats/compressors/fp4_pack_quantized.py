"""compressed-tensors `nvfp4-pack-quantized` and `mxfp4-pack-quantized`: FP4 (E2M1) codes, two to a byte.

Facts from compressed-tensors 0.19 `compressors/nvfp4` and `compressors/mx`: `weight_packed` uint8
[out, in/2] holds element 2k in the low nibble and 2k+1 in the high one, each nibble a sign bit
(bit 3) and a magnitude index into 0, 0.5, 1, 1.5, 2, 3, 4, 6. NVFP4 keeps `weight_scale` float8_e4m3fn
per group of 16 inputs under a float32 `weight_global_scale` (a divisor); MXFP4 keeps uint8 biased
exponents (E8M0) per group of 32 inputs.

The quantize kernels (quant/nvfp4.py, quant/mx.py) write these bytes directly, for speed; `pack` is
the same layout in numpy, and tests/formats/test_compressors.py holds the kernels' bytes to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.compressors.base import Compressor, input_dtype, register
from weightsmith.formats.layouts import Args, Layout
from weightsmith.io import names
from weightsmith.quant import MX_GROUP, NVFP4_GROUP

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


#: The magnitude of each E2M1 index (a nibble's low three bits).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SIGN = 8


class _Fp4Packed(Compressor):
    """What both FP4 formats share: two nibbles a byte in `weight_packed`."""

    @staticmethod
    def pack(codes: np.ndarray) -> np.ndarray:
        """uint8 bytes [rows, cols/2] of 4-bit codes [rows, cols] (cols even), element 2k in the low nibble."""
        codes = np.asarray(codes, np.uint8)
        packed: np.ndarray = codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))
        return packed

    @staticmethod
    def unpack_codes(packed: np.ndarray) -> np.ndarray:
        """Inverse of `pack`: the 4-bit codes, uint8 [rows, 2 * bytes]."""
        codes: np.ndarray = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
        return codes

    @classmethod
    def unpack(cls, packed: np.ndarray) -> np.ndarray:
        """E2M1 values (float32) of packed nibbles, element 2k from the low nibble."""
        nibbles = cls.unpack_codes(packed)
        mags = np.array(E2M1, np.float32)[nibbles & 7]
        values: np.ndarray = np.where(nibbles & SIGN, -mags, mags).astype(np.float32)
        return values


@register
class Nvfp4PackQuantized(_Fp4Packed):
    NAME: ClassVar[str] = ct.NVFP4_PACK_QUANTIZED

    @classmethod
    def layout(cls, args: Args, inputs: str | None = None) -> Layout | None:
        return Layout(
            args,
            names.WEIGHT_PACKED,
            "U8",
            4,
            8,
            scale_dtype="F8_E4M3",
            scale_block=(1, args.group_size or NVFP4_GROUP),
            global_scale=names.WEIGHT_GLOBAL_SCALE,
            input_scale=inputs,
            input_dtype=input_dtype(inputs),
        )

    @classmethod
    def recognizes(cls, weights: dict[str, Any]) -> bool:
        return True

    @classmethod
    def decompress(cls, weights: dict[str, Any], params: dict[str, np.ndarray]) -> np.ndarray:
        from weightsmith.quant import nvfp4  # the arithmetic; reading layouts must not start numba

        packed, scale = params[names.WEIGHT_PACKED], params[names.WEIGHT_SCALE]
        return nvfp4.dequantize(cls.unpack(packed), scale, params[names.WEIGHT_GLOBAL_SCALE])


def mx_layout(args: Args, inputs: str | None, codes: str, dtype: str, code_bits: int) -> Layout:
    """An MX format's tensors: `codes`, and uint8 E8M0 exponents per group of 32 inputs."""
    return Layout(
        args,
        codes,
        dtype,
        code_bits,
        8,
        scale_dtype="U8",
        scale_block=(1, args.group_size or MX_GROUP),
        input_scale=inputs,
        input_dtype=input_dtype(inputs),
    )


def mx_decompress(layout: Layout | None, params: dict[str, np.ndarray]) -> np.ndarray:
    """An MX weight from its codes and exponents (packed FP4 bytes or float8_e4m3fn values)."""
    from weightsmith.quant import mx  # the arithmetic; reading layouts must not start numba

    assert layout is not None  # every MX format has one
    codes = params[layout.codes]
    values = Mxfp4PackQuantized.unpack(codes) if codes.dtype == np.uint8 else codes.astype(np.float32)
    return mx.dequantize(values, params[layout.scale])


@register
class Mxfp4PackQuantized(_Fp4Packed):
    NAME: ClassVar[str] = ct.MXFP4_PACK_QUANTIZED

    @classmethod
    def layout(cls, args: Args, inputs: str | None = None) -> Layout | None:
        return mx_layout(args, inputs, names.WEIGHT_PACKED, "U8", 4)

    @classmethod
    def recognizes(cls, weights: dict[str, Any]) -> bool:
        return True

    @classmethod
    def decompress(cls, weights: dict[str, Any], params: dict[str, np.ndarray]) -> np.ndarray:
        return mx_decompress(cls.layout(Args.of(weights)), params)
