"""The safetensors dtype codes: bit widths, numpy storage types and byte order of the writer.

This is the one place that knows what `"BF16"` or `"F8_E4M3"` means on disk. numpy has no bf16,
fp8 or fp4 types of its own; `ml_dtypes` supplies them. Sub-byte codes (F4, F6_*) have no numpy
storage type: they are read as raw bytes by the modules that understand their packing.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class DType:
    """One safetensors dtype code."""

    code: str
    bits: int
    #: `module.name` of the numpy (or ml_dtypes) type whose itemsize equals one stored element, or
    #: None for sub-byte codes. A name, not the type: numpy is imported when a value is first read,
    #: so that commands reading headers alone (`inspect`, `verify`) start without it.
    storage: str | None
    is_float: bool

    @property
    def numpy(self) -> np.dtype | None:
        """The numpy dtype of one stored element, or None for sub-byte codes."""
        return None if self.storage is None else _numpy_dtype(self.storage)

    @property
    def element(self) -> np.dtype:
        """`numpy` of a code that has one: callers that hold a dense or 8-bit code ask for it this way,
        so that a sub-byte code reaching them is a clear error rather than a None further on."""
        if self.storage is None:
            raise ValueError(f"safetensors dtype {self.code} has no numpy storage type")
        return _numpy_dtype(self.storage)

    def nbytes(self, numel: int) -> int | None:
        """Bytes that `numel` elements occupy, or None when they do not end on a byte boundary."""
        total_bits = numel * self.bits
        return total_bits // 8 if total_bits % 8 == 0 else None


@functools.cache
def _numpy_dtype(storage: str) -> np.dtype:
    import numpy as np

    module, _, name = storage.rpartition(".")
    dtype: np.dtype = np.dtype(getattr(importlib.import_module(module), name))
    return dtype


# Declaration order of safetensors' `Dtype` enum (safetensors 0.8.0 `tensor.rs`). The reference
# writer lays tensors out by descending position in this list, then by name; we do the same so our
# files match its byte layout.
_ALL: tuple[DType, ...] = (
    DType("BOOL", 8, "numpy.bool_", False),
    DType("F4", 4, None, True),
    DType("F6_E2M3", 6, None, True),
    DType("F6_E3M2", 6, None, True),
    DType("U8", 8, "numpy.uint8", False),
    DType("I8", 8, "numpy.int8", False),
    DType("F8_E5M2", 8, "ml_dtypes.float8_e5m2", True),
    DType("F8_E4M3", 8, "ml_dtypes.float8_e4m3fn", True),
    DType("F8_E8M0", 8, "ml_dtypes.float8_e8m0fnu", True),
    DType("F8_E4M3FNUZ", 8, "ml_dtypes.float8_e4m3fnuz", True),
    DType("F8_E5M2FNUZ", 8, "ml_dtypes.float8_e5m2fnuz", True),
    DType("I16", 16, "numpy.int16", False),
    DType("U16", 16, "numpy.uint16", False),
    DType("F16", 16, "numpy.float16", True),
    DType("BF16", 16, "ml_dtypes.bfloat16", True),
    DType("I32", 32, "numpy.int32", False),
    DType("U32", 32, "numpy.uint32", False),
    DType("F32", 32, "numpy.float32", True),
    DType("C64", 64, "numpy.complex64", False),
    DType("F64", 64, "numpy.float64", True),
    DType("I64", 64, "numpy.int64", False),
    DType("U64", 64, "numpy.uint64", False),
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
    import numpy as np

    for d in _ALL:
        if d.numpy is not None and d.numpy == np.dtype(dtype):
            return d
    raise KeyError(f"no safetensors dtype for numpy dtype {dtype}")
