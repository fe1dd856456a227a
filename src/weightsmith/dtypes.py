"""The safetensors dtype codes: bit widths, numpy storage types and byte order of the writer.

This is the one place that knows what `"BF16"` or `"F8_E4M3"` means on disk. numpy has no bf16,
fp8 or fp4 types of its own; `ml_dtypes` supplies them. Sub-byte codes (F4, F6_*) have no numpy
storage type: they are read as raw bytes by the modules that understand their packing.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class DType:
    """One safetensors dtype code."""

    code: str
    bits: int
    #: numpy type whose itemsize equals one stored element, or None for sub-byte codes.
    numpy: np.dtype | None
    is_float: bool

    @property
    def storage(self) -> np.dtype:
        """`numpy` of a code that has one: callers that hold a dense or 8-bit code ask for it this way,
        so that a sub-byte code reaching them is a clear error rather than a None further on."""
        if self.numpy is None:
            raise ValueError(f"safetensors dtype {self.code} has no numpy storage type")
        return self.numpy

    def nbytes(self, numel: int) -> int | None:
        """Bytes that `numel` elements occupy, or None when they do not end on a byte boundary."""
        total_bits = numel * self.bits
        return total_bits // 8 if total_bits % 8 == 0 else None


def _dt(code: str, bits: int, numpy_type: npt.DTypeLike | None, is_float: bool) -> DType:
    return DType(code, bits, np.dtype(numpy_type) if numpy_type is not None else None, is_float)


# Declaration order of safetensors' `Dtype` enum (safetensors 0.8.0 `tensor.rs`). The reference
# writer lays tensors out by descending position in this list, then by name; we do the same so our
# files match its byte layout.
_ALL: tuple[DType, ...] = (
    _dt("BOOL", 8, np.bool_, False),
    _dt("F4", 4, None, True),
    _dt("F6_E2M3", 6, None, True),
    _dt("F6_E3M2", 6, None, True),
    _dt("U8", 8, np.uint8, False),
    _dt("I8", 8, np.int8, False),
    _dt("F8_E5M2", 8, ml_dtypes.float8_e5m2, True),
    _dt("F8_E4M3", 8, ml_dtypes.float8_e4m3fn, True),
    _dt("F8_E8M0", 8, ml_dtypes.float8_e8m0fnu, True),
    _dt("F8_E4M3FNUZ", 8, ml_dtypes.float8_e4m3fnuz, True),
    _dt("F8_E5M2FNUZ", 8, ml_dtypes.float8_e5m2fnuz, True),
    _dt("I16", 16, np.int16, False),
    _dt("U16", 16, np.uint16, False),
    _dt("F16", 16, np.float16, True),
    _dt("BF16", 16, ml_dtypes.bfloat16, True),
    _dt("I32", 32, np.int32, False),
    _dt("U32", 32, np.uint32, False),
    _dt("F32", 32, np.float32, True),
    _dt("C64", 64, np.complex64, False),
    _dt("F64", 64, np.float64, True),
    _dt("I64", 64, np.int64, False),
    _dt("U64", 64, np.uint64, False),
)

DTYPES: dict[str, DType] = {d.code: d for d in _ALL}
WRITE_ORDER: dict[str, int] = {d.code: i for i, d in enumerate(_ALL)}

BF16, F16, F32 = DTYPES["BF16"], DTYPES["F16"], DTYPES["F32"]
F8_E4M3, F8_E8M0 = DTYPES["F8_E4M3"], DTYPES["F8_E8M0"]
I32, I64, U8 = DTYPES["I32"], DTYPES["I64"], DTYPES["U8"]

#: Dense float dtypes a weight can be quantized from directly.
DENSE_FLOATS = ("BF16", "F16", "F32")
#: FP8 dtypes a weight can be dequantized from before quantizing.
FP8_FLOATS = ("F8_E4M3",)


def from_numpy(dtype: np.dtype) -> DType:
    """The safetensors code for a numpy (or ml_dtypes) dtype."""
    for d in _ALL:
        if d.numpy is not None and d.numpy == np.dtype(dtype):
            return d
    raise KeyError(f"no safetensors dtype for numpy dtype {dtype}")
