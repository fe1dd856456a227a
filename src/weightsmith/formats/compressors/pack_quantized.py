"""compressed-tensors `pack-quantized`: integers packed into int32 words (W4A16, W4A16_ASYM, W8A16).

Facts from compressed-tensors 0.19 `compressors/pack_quantized` (`pack_to_int32`,
`unpack_from_int32`): a `num_bits`-wide integer q is stored unsigned as q + 2**(num_bits - 1),
32 // num_bits to an int32 word along the packed dimension, the first element in the lowest bits, a
ragged end padded with zeros. `weight_packed` packs along the input columns; an asymmetric group's
`weight_zero_point` packs along the output rows; `weight_shape` (int64 [2]) keeps the logical shape,
since words round the columns up. Scales are in the weight's float dtype, one per scale block.

The int4 kernel (quant/int4.py `quantize_rows`) writes these words directly, for speed; `pack` is
the same layout for whatever a kernel does not pack itself (zero points, GPTQ's chosen values, int8),
and tests/formats/test_compressors.py holds the kernel's words to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.compressors.base import Compressor, input_dtype, register
from weightsmith.formats.layouts import Args, Layout
from weightsmith.io import names

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


WORD_BITS = 32


def per_word(num_bits: int) -> int:
    """How many `num_bits`-wide values one int32 word holds."""
    return WORD_BITS // num_bits


@register
class PackQuantized(Compressor):
    NAME: ClassVar[str] = ct.PACK_QUANTIZED
    #: The widths `decompress` reads: those our schemes write (W4A16, W8A16).
    READ_BITS: ClassVar[tuple[int, ...]] = (4, 8)

    @classmethod
    def layout(cls, args: Args, inputs: str | None = None) -> Layout | None:
        return Layout(
            args,
            names.WEIGHT_PACKED,
            "I32",
            args.num_bits or 4,
            WORD_BITS,
            scale_block=args.scale_block,
            weight_shape=True,
            zero_point=not args.symmetric,
            input_scale=inputs,
            input_dtype=input_dtype(inputs),
        )

    @staticmethod
    def pack(q: np.ndarray, num_bits: int, axis: int, in_place: bool = False) -> np.ndarray:
        """int32 words of integers `q` in [-2**(num_bits-1), 2**(num_bits-1) - 1], packed along `axis`.

        `in_place`: 8-bit values along the last axis of a contiguous int8 array whose length is a
        multiple of 4 are offset in their own buffer, which the words then view (a writer's reused
        buffer, not copied); any other input is packed into a new array.
        """
        q = np.asarray(q)
        per = per_word(num_bits)
        last = axis in (-1, q.ndim - 1)
        if num_bits == 8 and q.dtype == np.int8 and last and q.flags.c_contiguous and q.shape[-1] % per == 0:
            raw = q.view(np.uint8)
            if in_place:
                raw ^= np.uint8(1 << 7)  # q + 128 in two's complement
            else:
                raw = raw ^ np.uint8(1 << 7)
            return raw.view(np.int32)
        moved = np.moveaxis(np.asarray(q, dtype=np.int64), axis, -1)
        pad = -moved.shape[-1] % per
        u = (moved + (1 << (num_bits - 1))).astype(np.uint32)
        if pad:
            u = np.concatenate([u, np.zeros((*u.shape[:-1], pad), np.uint32)], axis=-1)
        u = u.reshape(*u.shape[:-1], -1, per)
        words = np.zeros(u.shape[:-1], np.uint32)
        for j in range(per):
            words |= u[..., j] << np.uint32(num_bits * j)
        return np.moveaxis(words.view(np.int32), -1, axis)

    @staticmethod
    def unpack(words: np.ndarray, num_bits: int, n: int, axis: int) -> np.ndarray:
        """Inverse of `pack`: int8 values, `n` of them along `axis`."""
        if num_bits == 8 and axis in (-1, np.ndim(words) - 1):
            raw = np.ascontiguousarray(words).view(np.uint8)
            return (raw[..., :n] ^ np.uint8(1 << 7)).view(np.int8)
        w = np.moveaxis(np.asarray(words).view(np.uint32), axis, -1)
        mask = np.uint32((1 << num_bits) - 1)
        parts = np.stack([(w >> np.uint32(num_bits * j)) & mask for j in range(per_word(num_bits))], axis=-1)
        values = parts.reshape(*w.shape[:-1], -1)[..., :n].astype(np.int16) - (1 << (num_bits - 1))
        return np.moveaxis(values.astype(np.int8), -1, axis)

    @classmethod
    def recognizes(cls, weights: dict[str, Any]) -> bool:
        return weights.get("num_bits") in cls.READ_BITS and weights.get("strategy") == "group"

    @classmethod
    def decompress(cls, weights: dict[str, Any], params: dict[str, np.ndarray]) -> np.ndarray:
        from weightsmith.quant import eightbit  # the arithmetic; reading layouts must not start numba

        rows, cols = (int(v) for v in params[names.WEIGHT_SHAPE])
        bits = int(weights["num_bits"])
        q = cls.unpack(params[names.WEIGHT_PACKED], bits, cols, axis=1)
        packed_zp = params.get(names.WEIGHT_ZERO_POINT)
        zero_point = None if packed_zp is None else cls.unpack(packed_zp, bits, rows, axis=0)
        weight = eightbit.EightBitWeight(q, params[names.WEIGHT_SCALE], zero_point)
        return eightbit.dequantize(weight, (1, int(weights["group_size"])))
