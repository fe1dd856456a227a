"""`verify --scan-values`: NaN/Inf and all-zero tensors, and scales that are not positive,
reading every byte once, in chunks.

Memory stays at one chunk buffer per worker whatever the tensor sizes; reads are positional and
release the GIL, so a few threads keep the disk busy.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weightsmith.audit.findings import ERROR, WARNING, Finding
from weightsmith.audit.modules import Located
from weightsmith.audit.survey import Survey
from weightsmith.audit.values import CHUNK_BYTES, chunks, non_finite_count, non_positive_count, scale_code
from weightsmith.core.lazy import lazy_module
from weightsmith.io import names
from weightsmith.safetensors.reader import ShardReader

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


@dataclass(frozen=True)
class _Scan:
    name: str
    shard: str
    numel: int
    non_finite: int
    all_zero: bool
    #: Zero or negative values in a weight or activation scale (0 for any other tensor).
    non_positive: int


def scan_values(found: Survey, workers: int | None = None) -> tuple[list[Finding], str]:
    readers = {shard: ShardReader(found.path(shard), header) for shard, header in found.headers.items()}
    local = threading.local()

    def scan(item: tuple[str, Located]) -> _Scan:
        name, located = item
        buffer = getattr(local, "buffer", None)
        if buffer is None:
            buffer = local.buffer = np.empty(CHUNK_BYTES, dtype=np.uint8)
        is_scale = names.split(name)[1] in names.WEIGHT_SCALES
        code = scale_code(located.info.dtype.code) if is_scale else located.info.dtype.code
        bad, nonzero, non_positive = 0, False, 0
        for chunk in chunks(readers[located.shard], located.info, buffer):
            bad += non_finite_count(code, chunk)
            nonzero = nonzero or bool(chunk.any())
            if is_scale:
                non_positive += non_positive_count(code, chunk)
        return _Scan(name, located.shard, located.info.numel, bad, not nonzero, non_positive)

    items = sorted(found.tensors.items(), key=lambda kv: (kv[1].shard, kv[1].info.begin))
    total = sum(loc.info.nbytes for _, loc in items)
    try:
        with ThreadPoolExecutor(max_workers=workers or min(4, os.cpu_count() or 1)) as pool:
            results = list(pool.map(scan, (i for i in items if i[1].info.nbytes)))
    finally:
        for reader in readers.values():
            reader.close()
    found_list = []
    for r in results:
        if r.non_finite:
            found_list.append(
                Finding(
                    "values.non-finite",
                    ERROR,
                    f"holds {r.non_finite:,} NaN or Inf values among {r.numel:,}; "
                    "export or quantize it again from a good source",
                    r.shard,
                    r.name,
                )
            )
        if r.non_positive:
            found_list.append(
                Finding(
                    "values.scale-not-positive",
                    ERROR,
                    f"holds {r.non_positive:,} zero or negative values among {r.numel:,}; a scale must be "
                    "positive (the dequantized weights would vanish or flip sign)",
                    r.shard,
                    r.name,
                )
            )
        elif r.all_zero and not r.non_finite:
            found_list.append(
                Finding(
                    "values.all-zero",
                    WARNING,
                    "holds only zeros; a weight or scale that was never written?",
                    r.shard,
                    r.name,
                )
            )
    return found_list, f"{len(items):,} tensors, {total:,} bytes read"
