"""Each compressed-tensors format's pack/unpack round trip, its registration and its kernels' bytes.

A format module owns its byte layout; the quantize kernels (quant/) write the same bytes directly for
speed. So each format's `unpack(pack(x))` must give `x` back, and what a kernel writes must be what
`pack` makes of the values the kernel chose: then a scheme that packs through its format and one whose
kernel packs cannot disagree about the bytes. Byte identity with compressed-tensors itself is held by
tests/schemes/test_reference_*.py and tests/quantize/test_reference_llmcompressor.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from weightsmith import schemes
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats import compressors
from weightsmith.formats.compressors.fp4_pack_quantized import E2M1, Mxfp4PackQuantized, Nvfp4PackQuantized
from weightsmith.formats.compressors.mxfp8_quantized import Mxfp8Quantized
from weightsmith.formats.compressors.naive_quantized import FloatQuantized, IntQuantized, NaiveQuantized
from weightsmith.formats.compressors.pack_quantized import PackQuantized
from weightsmith.formats.layouts import Args
from weightsmith.schemes import int4 as int4_scheme

RNG = np.random.default_rng(0)


def test_every_format_name_has_one_registered_class() -> None:
    names = {
        ct.PACK_QUANTIZED,
        ct.NVFP4_PACK_QUANTIZED,
        ct.MXFP4_PACK_QUANTIZED,
        ct.MXFP8_QUANTIZED,
        ct.FLOAT_QUANTIZED,
        ct.INT_QUANTIZED,
        ct.NAIVE_QUANTIZED,
    }
    assert set(compressors.REGISTRY) == names
    assert all(name == cls.NAME for name, cls in compressors.REGISTRY.items())
    with pytest.raises(ValueError, match="registered twice"):
        compressors.register(PackQuantized)


def test_every_scheme_writes_a_registered_format_that_reads_it_back() -> None:
    for cls in dict.fromkeys(schemes.REGISTRY.values()):
        scheme = schemes.make_scheme(cls.NAMES[0])
        fmt = compressors.REGISTRY[scheme.FORMAT]
        assert fmt.layout(Args.of(scheme.weight_args())) is not None, cls.NAMES
        assert fmt.recognizes(scheme.weight_args()), cls.NAMES


def test_an_unknown_format_or_arguments_are_not_read() -> None:
    assert compressors.of_group("sparse-24", {"num_bits": 4}) is None
    with pytest.raises(NotImplementedError, match="dequantizing sparse-24 with 4-bit group weights"):
        compressors.decompress("sparse-24", {"num_bits": 4, "strategy": "group"}, {})
    with pytest.raises(NotImplementedError, match="dequantizing pack-quantized with 2-bit group weights"):
        compressors.decompress(ct.PACK_QUANTIZED, {"num_bits": 2, "strategy": "group"}, {})


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("axis", [0, 1])
def test_pack_quantized_round_trip(bits: int, axis: int) -> None:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = RNG.integers(lo, hi + 1, size=(13, 24)).astype(np.int8)  # 13 rows: a ragged last word along axis 0
    words = PackQuantized.pack(q, bits, axis=axis)
    assert words.dtype == np.int32
    assert words.shape[axis] == -(-q.shape[axis] // (32 // bits))
    assert np.array_equal(PackQuantized.unpack(words, bits, q.shape[axis], axis=axis), q)


def test_pack_quantized_bytes_are_the_general_rule() -> None:
    """The int8 shortcut (bytes offset in place) gives the words the shift-and-or rule gives."""
    q = RNG.integers(-128, 128, size=(5, 16)).astype(np.int8)
    general = PackQuantized.pack(q.astype(np.int64), 8, axis=1)
    assert np.array_equal(PackQuantized.pack(q, 8, axis=1), general)
    own = q.copy()
    assert np.array_equal(PackQuantized.pack(own, 8, axis=1, in_place=True), general)
    assert [hex(int(v)) for v in PackQuantized.pack(np.array([[-128, -1, 0, 127]]), 8, axis=1).view(np.uint32)[0]] == [
        "0xff807f00"
    ]


def test_int4_kernel_writes_pack_quantized_words() -> None:

    w = RNG.standard_normal((16, 256)).astype(ml_dtypes.bfloat16)
    for symmetric in (True, False):
        ours = int4_scheme.quantize(w, 128, symmetric)
        q = PackQuantized.unpack(ours.packed, 4, 256, axis=1)
        assert np.array_equal(PackQuantized.pack(q, 4, axis=1), ours.packed)


@pytest.mark.parametrize("cls", [Nvfp4PackQuantized, Mxfp4PackQuantized])
def test_fp4_round_trip(cls: type[Nvfp4PackQuantized]) -> None:
    codes = RNG.integers(0, 16, size=(3, 32)).astype(np.uint8)
    packed = cls.pack(codes)
    assert packed.dtype == np.uint8 and packed.shape == (3, 16)
    assert np.array_equal(cls.unpack_codes(packed), codes)
    signs = np.where(codes & 8, -1.0, 1.0).astype(np.float32)
    assert np.array_equal(cls.unpack(packed), signs * np.array(E2M1, np.float32)[codes & 7])
    assert cls.unpack(np.array([[0xF1, 0x42]], np.uint8)).tolist() == [[0.5, -6.0, 1.0, 2.0]]


def test_fp4_kernels_write_packed_nibbles() -> None:
    from weightsmith.quant import mx, nvfp4

    w = RNG.standard_normal((8, 64)).astype(ml_dtypes.bfloat16)
    packed = nvfp4.quantize(w).packed
    assert np.array_equal(Nvfp4PackQuantized.pack(Nvfp4PackQuantized.unpack_codes(packed)), packed)
    packed, _ = mx.quantize(w, 4)
    assert np.array_equal(Mxfp4PackQuantized.pack(Mxfp4PackQuantized.unpack_codes(packed)), packed)


@pytest.mark.parametrize("cls", [FloatQuantized, IntQuantized, NaiveQuantized])
def test_one_value_per_byte_round_trip(cls: type[FloatQuantized]) -> None:
    ints = RNG.integers(-128, 128, size=(4, 8)).astype(np.int8)
    assert np.array_equal(cls.unpack(cls.pack(ints), "int"), ints)
    floats = RNG.standard_normal((4, 8)).astype(ml_dtypes.float8_e4m3fn)
    assert cls.unpack(cls.pack(floats), "float").tobytes() == floats.tobytes()
    assert cls.unpack(cls.pack(floats), "float").dtype == floats.dtype


def test_mxfp8_round_trip_and_kernel_bytes() -> None:
    from weightsmith.quant import mx

    floats = RNG.standard_normal((4, 32)).astype(ml_dtypes.float8_e4m3fn)
    assert Mxfp8Quantized.unpack(Mxfp8Quantized.pack(floats)).tobytes() == floats.tobytes()
    codes, _ = mx.quantize(RNG.standard_normal((4, 64)).astype(ml_dtypes.bfloat16), 8)
    assert Mxfp8Quantized.unpack(Mxfp8Quantized.pack(codes)).tobytes() == codes.tobytes()
