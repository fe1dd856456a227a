"""Where the bytes of a checkpoint are: per category, dtype or layer, from shard headers alone.

Packed tensors are counted as the logical weights they hold: FP4 pairs in U8 (compressed-tensors
NVFP4 `weight_packed`, ModelOpt NVFP4 `weight`) count two per byte, int-N in I32 (`pack-quantized`)
count 32/N per word, with N from the config or, when the config does not say, from the module's
`weight_shape` tensor. Scales, zero points, global scales and KV scales carry no parameters of
their own: they are overhead, shown in their own rows and folded into the "incl. scales" column of
the category whose weights they serve.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from weightsmith.audit.coverage import Coverage, coverage
from weightsmith.audit.modules import Module, group_modules
from weightsmith.audit.survey import Survey, gc_paused, survey
from weightsmith.core.errors import CheckpointError
from weightsmith.formats.declaration import QuantDeclaration, read_declaration
from weightsmith.io import names
from weightsmith.safetensors.header import TensorInfo

BY_CATEGORY, BY_DTYPE, BY_LAYER = "category", "dtype", "layer"
VIEWS = (BY_CATEGORY, BY_DTYPE, BY_LAYER)
QUANT_PARAMS = names.QUANT_PARAMS_CATEGORY
OVERHEAD = frozenset({QUANT_PARAMS, names.KV_SCALES_CATEGORY})
OUTSIDE_LAYERS = "outside layers"


@dataclass
class Row:
    """One line of the table."""

    key: str
    tensors: int = 0
    bytes: int = 0
    share: float = 0.0
    #: Logical weight parameters (packed values unpacked); 0 for overhead rows.
    params: int = 0
    #: Bits per parameter of the weight tensors alone, or None for rows without parameters.
    bits_per_param: float | None = None
    #: Bits per parameter once the overhead serving these weights is added (category and layer views).
    bits_with_overhead: float | None = None
    weight_bytes: int = field(default=0, repr=False)
    overhead_bytes: int = field(default=0, repr=False)


@dataclass
class Contribution:
    """How much one category adds to the headline bits per parameter."""

    category: str
    bits_per_param: float
    share_of_bytes: float


@dataclass
class InspectReport:
    path: str
    by: str
    shards: int
    tensors: int
    file_bytes: int
    tensor_bytes: int
    params: int
    bits_per_param: float | None
    makeup: list[Contribution]
    rows: list[Row]
    quantization: Coverage | None
    notes: list[str]
    seconds: float


def inspect(path: str | Path, by: str = BY_CATEGORY) -> InspectReport:
    """Account for every byte of the checkpoint at `path`, reading headers only."""
    if by not in VIEWS:
        raise ValueError(f"by must be one of {VIEWS}")
    start = time.perf_counter()
    with gc_paused():
        found = survey(path, cross_check=False)
        found.refuse_hostile_index()
        if not found.headers:
            first = found.findings[0].line() if found.findings else "no shard could be read"
            raise CheckpointError(
                f"has no readable shard ({first}); run `weightsmith verify` for the full list",
                file=path,
                code="file.unreadable",
            )
        decl = read_declaration(found.config, found.hf_quant_config)
        modules = group_modules(found.headers)
        counter = _Counter(found, decl, modules)
        covered = coverage(decl, modules) if decl is not None else None
    rows = counter.rows(by)
    total_bytes = sum(r.bytes for r in counter.by_category.values())
    total_params = sum(r.params for r in counter.by_category.values())
    makeup = [
        Contribution(
            r.key, r.bytes * 8 / total_params if total_params else 0.0, r.bytes / total_bytes if total_bytes else 0.0
        )
        for r in sorted(counter.by_category.values(), key=lambda r: -r.bytes)
    ]
    notes = list(counter.notes)
    for finding in found.findings:
        notes.append(f"could not read {finding.line()}")
    if found.unreadable_shards:
        notes.append(
            f"{len(found.unreadable_shards)} of {len(found.shard_names)} shards could not be read "
            "and are not counted; run `weightsmith verify`"
        )
    return InspectReport(
        path=str(path),
        by=by,
        shards=len(found.headers),
        tensors=sum(len(m.params) for m in modules.values()),
        file_bytes=sum(h.file_size for h in found.headers.values()),
        tensor_bytes=total_bytes,
        params=total_params,
        bits_per_param=total_bytes * 8 / total_params if total_params else None,
        makeup=makeup,
        rows=rows,
        quantization=covered,
        notes=notes,
        seconds=time.perf_counter() - start,
    )


class _Counter:
    """One pass over the tensors into buckets, from which the category, dtype and layer tables are summed.

    A bucket is (category, dtype, layer, category served): a 100k-tensor MoE folds into a few
    hundred buckets, so the per-tensor work is one dictionary update.
    """

    def __init__(self, found: Survey, decl: QuantDeclaration | None, modules: dict[str, Module]) -> None:
        self.found, self.decl = found, decl
        self.notes: list[str] = []
        self._categories: dict[tuple[str, str], str] = {}
        self._shapes_read = 0
        buckets: dict[tuple[str, str, int | None, str | None], list[int]] = {}
        for module in modules.values():
            for param, located in module.params.items():
                info = located.info
                cat = self._categories.get((module.pattern, param)) or self._category(module, param)
                if cat in OVERHEAD:
                    params = 0
                    served = self._category(module, names.WEIGHT) if cat == QUANT_PARAMS else cat
                else:
                    params = self._logical_params(module, param, info)
                    served = None
                key = (cat, info.dtype.code, module.layer, served)
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = [0, 0, 0]
                bucket[0] += 1
                bucket[1] += info.nbytes
                bucket[2] += params
        self.by_category: dict[str, Row] = {c: Row(c) for c in names.CATEGORIES}
        self.by_dtype: dict[str, Row] = {}
        self.by_layer: dict[str, Row] = {}
        for (cat, code, layer, served), (count, nbytes, params) in buckets.items():
            layer_key = f"layer {layer}" if layer is not None else OUTSIDE_LAYERS
            for table, row_key in ((self.by_category, cat), (self.by_dtype, code), (self.by_layer, layer_key)):
                row = table.get(row_key) or table.setdefault(row_key, Row(row_key))
                row.tensors += count
                row.bytes += nbytes
                row.params += params
                if served is None:
                    row.weight_bytes += nbytes
            if served is not None:
                self.by_category[served].overhead_bytes += nbytes
                self.by_layer[layer_key].overhead_bytes += nbytes
        if self._shapes_read:
            self.notes.append(f"read {self._shapes_read} weight_shape tensors to count int-packed parameters")

    def _category(self, module: Module, param: str) -> str:
        # A category depends on the shape of a name, not on its layer or expert numbers, so it is
        # computed once per module pattern: 110k tensors of a large MoE fold into ~100 patterns.
        key = (module.pattern, param)
        cat = self._categories.get(key)
        if cat is None:
            cat = self._categories[key] = names.category(f"{module.name}.{param}" if module.name else param)
        return cat

    def _logical_params(self, module: Module, param: str, info: TensorInfo) -> int:
        code = info.dtype.code
        if param != names.WEIGHT_PACKED and code != "U8":
            return info.numel
        if param == names.WEIGHT_PACKED:
            if code == "U8":
                return info.numel * 2
            scheme = self.decl.resolve(module)[0] if self.decl is not None else None
            if scheme is not None and scheme.num_bits:
                return info.numel * (info.dtype.bits // scheme.num_bits)
            return self._from_weight_shape(module, info)
        if param == names.WEIGHT and code == "U8":
            scale = module.params.get(names.WEIGHT_SCALE)
            if scale is not None and scale.info.dtype.code == "F8_E4M3":
                return info.numel * 2
        return info.numel

    def _from_weight_shape(self, module: Module, info: TensorInfo) -> int:
        ref = module.params.get(names.WEIGHT_SHAPE)
        if ref is None or ref.info.numel != 2 or ref.info.dtype.code != "I64":
            self.notes.append(
                f"{module.name}: packed weight with no bit width in the config and no weight_shape; counted as stored"
            )
            return info.numel
        from weightsmith.safetensors.reader import ShardReader  # here: inspect starts without numpy

        with ShardReader(self.found.path(ref.shard), self.found.headers[ref.shard]) as reader:
            shape = reader.read(f"{module.name}.{names.WEIGHT_SHAPE}")
        self._shapes_read += 1
        return math.prod(int(n) for n in shape)

    def rows(self, by: str) -> list[Row]:
        if by == BY_CATEGORY:
            rows = [r for r in self.by_category.values() if r.tensors]
        elif by == BY_DTYPE:
            rows = sorted(self.by_dtype.values(), key=lambda r: -r.bytes)
        else:
            rows = sorted(self.by_layer.values(), key=lambda r: _layer_sort_key(r.key))
        total = sum(r.bytes for r in rows)
        for r in rows:
            r.share = r.bytes / total if total else 0.0
            if r.params:
                r.bits_per_param = r.weight_bytes * 8 / r.params
                if by != BY_DTYPE:
                    r.bits_with_overhead = (r.weight_bytes + r.overhead_bytes) * 8 / r.params
        return rows


def _layer_sort_key(key: str) -> tuple[int, int]:
    return (1, 0) if key == OUTSIDE_LAYERS else (0, int(key.split()[1]))
