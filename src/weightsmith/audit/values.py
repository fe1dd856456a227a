"""Streaming reads of tensor bytes in fixed-size chunks, and bit-level tests on them.

Non-finite values are found from the bit patterns (an all-ones exponent), which works the same for
BF16, FP16, FP32 and the FP8 variants without converting anything to float.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core.lazy import lazy_module
from weightsmith.safetensors.dtypes import DTYPES
from weightsmith.safetensors.header import Header, TensorInfo
from weightsmith.safetensors.reader import ShardReader

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


CHUNK_BYTES = 16 << 20

#: dtype code -> (unsigned view's name, mask, value): an element is NaN or Inf when `bits & mask == value`.
NON_FINITE: dict[str, tuple[str, int, int]] = {
    "F64": ("uint64", 0x7FF0_0000_0000_0000, 0x7FF0_0000_0000_0000),
    "F32": ("uint32", 0x7F80_0000, 0x7F80_0000),
    "F16": ("uint16", 0x7C00, 0x7C00),
    "BF16": ("uint16", 0x7F80, 0x7F80),
    "F8_E4M3": ("uint8", 0x7F, 0x7F),  # fn variant: no Inf, NaN is S.1111.111
    "F8_E5M2": ("uint8", 0x7C, 0x7C),
    "F8_E4M3FNUZ": ("uint8", 0xFF, 0x80),  # the only NaN is negative zero's pattern
    "F8_E5M2FNUZ": ("uint8", 0xFF, 0x80),
    "F8_E8M0": ("uint8", 0xFF, 0xFF),
}


def scale_code(code: str) -> str:
    """The dtype a scale's bytes hold: a U8 scale is E8M0 (compressed-tensors' MX formats store their
    power-of-two scales as uint8), whose 0xFF is NaN. Read as plain bytes it would have no NaN at all."""
    return "F8_E8M0" if code == "U8" else code


def chunks(reader: ShardReader, info: TensorInfo, buffer: np.ndarray) -> Iterator[np.ndarray]:
    """The tensor's bytes, `len(buffer)` at a time, read into `buffer` (each chunk reuses it).

    Chunk boundaries fall on whole elements for every dtype of 8 bits or more.
    """
    step = len(buffer) - len(buffer) % 8
    for start in range(0, info.nbytes, step):
        size = min(step, info.nbytes - start)
        view = buffer[:size]
        reader.read_bytes_into(info, view, start)
        yield view


def non_finite_count(code: str, chunk: np.ndarray) -> int:
    """How many elements of a byte chunk of dtype `code` are NaN or Inf (0 for integer dtypes)."""
    rule = NON_FINITE.get(code)
    if rule is None:
        return 0
    view_name, mask, value = rule
    view_type = getattr(np, view_name)
    bits = chunk.view(view_type)
    return int(np.count_nonzero((bits & view_type(mask)) == view_type(value)))


def non_positive_count(code: str, chunk: np.ndarray) -> int:
    """How many elements of a byte chunk of float dtype `code` are zero or negative (NaN not counted).

    0 for a code that is not a float of 8 bits or more; `non_finite_count` covers NaN and Inf.
    """
    dtype = DTYPES.get(code)
    if dtype is None or not dtype.is_float or dtype.storage is None:
        return 0
    values = chunk.view(dtype.element).astype(np.float32)
    return int(np.count_nonzero(values <= 0))


class SmallReads:
    """Values of small tensors (scales, shapes), with one open reader per shard for the whole run."""

    def __init__(self, root: Path, headers: dict[str, Header]) -> None:
        self.root, self.headers = root, headers
        self._readers: dict[str, ShardReader] = {}

    def __enter__(self) -> SmallReads:
        return self

    def __exit__(self, *exc: object) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def _reader(self, shard: str) -> ShardReader:
        reader = self._readers.get(shard)
        if reader is None:
            reader = self._readers[shard] = ShardReader(self.root / shard, self.headers[shard])
        return reader

    def array(self, shard: str, name: str) -> np.ndarray:
        return self._reader(shard).read(name)

    def scalar(self, shard: str, name: str) -> float:
        """A one-element float tensor's value.

        A float32 one (global scales: `verify` reads 24,000 on a large NVFP4 MoE) is unpacked from
        its four bytes, without an array per value.
        """
        reader = self._reader(shard)
        info = reader.info(name)
        if info.dtype.code == "F32" and info.nbytes == 4:
            raw = memoryview(bytearray(4))
            reader.read_bytes_into(info, raw)
            value: float = struct.unpack("<f", raw)[0]
            return value
        return float(reader.read(name).reshape(-1)[0])
