"""How a checkpoint stores its original (unquantized or FP8) weights, and reading them back dense.

`quantize` takes a dense (BF16/FP16/FP32) or FP8 checkpoint as its source; `eval` measures a
quantized checkpoint against such an original, and the engine runs one. All three must agree on
what an original is and how an FP8 weight decodes, or the error `eval` measures would include
rounding the quantizer never saw: so the format is detected here once (`detect_source_format`),
FP8 weights are decoded here once (`OriginalWeights.weight`, with `quant.fp8`), and whole tensors
are read through one reader per shard (`TensorReader`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from weightsmith.core.errors import CheckpointError
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats import hf_fp8
from weightsmith.formats.declaration import read_declaration
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import fp8
from weightsmith.quant.fp8 import Block
from weightsmith.safetensors.dtypes import DENSE_FLOATS, FP8_FLOATS
from weightsmith.safetensors.reader import ShardReader

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class SourceFormat:
    """How the input checkpoint stores its weights, and what an FP8 weight's scale may be."""

    kind: str  # "dense", "ct-fp8" or "hf-fp8"
    scale_param: str | None = None  # the FP8 scale parameter name
    #: Declared blocks a scale may follow (`weight_block_size`, `block_structure`, a group as [1, group]).
    blocks: tuple[Block, ...] = ()
    #: compressed-tensors also stores per-channel scales, `[out, 1]`.
    per_channel: bool = False
    #: Dtypes a scale may be stored in: the facts `verify` checks against (formats/).
    scale_dtypes: frozenset[str] = frozenset()

    def scale_block(self, ckpt: Checkpoint, weight: str) -> Block:
        """The block each element of `weight`'s scale covers; a one-line error when the scale cannot be used.

        Checked from the headers alone, before any output exists: a scale the loaders refuse (an
        integer dtype that would decode to zeros, a shape matching no layout) is refused here too.
        """
        info = ckpt.tensors[weight].info
        scale = f"{names.split(weight)[0]}.{self.scale_param}"
        ref = ckpt.tensors.get(scale)
        if ref is None:
            raise CheckpointError(
                f"is FP8 but its scale {scale} is missing",
                file=ckpt.file_of(weight),
                tensor=weight,
                code="source.fp8-scale",
            )
        where: dict[str, Any] = {"file": ckpt.path(ref.shard), "tensor": scale}
        if ref.info.dtype.code not in self.scale_dtypes:
            raise CheckpointError(
                f"is {ref.info.dtype.code}, but config.json declares FP8 scales stored as "
                f"{' or '.join(sorted(self.scale_dtypes))}; decoding {weight} with it would be wrong",
                code="source.fp8-scale-dtype",
                **where,
            )
        out, inp = info.shape
        block = fp8.scale_block(ref.info.shape, (out, inp), self.blocks, self.per_channel)
        if block is None:
            layouts = ["[1] per tensor"]
            layouts += [f"{[-(-out // r), -(-inp // c)]} for {r}x{c} blocks" for r, c in self.blocks]
            if self.per_channel:
                layouts.append(f"{[out, 1]} per channel")
            raise CheckpointError(
                f"has shape {list(ref.info.shape)}, which fits no scale layout of its weight {weight} "
                f"{list(info.shape)} (expected {', '.join(layouts)})",
                code="source.fp8-scale-shape",
                **where,
            )
        return block


def detect_source_format(ckpt: Checkpoint) -> SourceFormat:
    """Dense, or one of the FP8 styles we can decode; anything else already quantized is refused.

    The config is read by the one reader `verify` reads it with (`declaration.read_declaration`),
    and the first problem it reports (a value of the wrong JSON type anywhere in
    `quantization_config`) refuses the run with that line.
    """
    cfg_path = ckpt.root / "config.json"
    if ckpt.config.get("quantization_config") is None:
        return SourceFormat("dense")
    decl = read_declaration(ckpt.config, None)
    assert decl is not None
    if decl.problems:
        raise CheckpointError(decl.problems[0].message, file=cfg_path, code="source.config")
    qc = ckpt.quantization_config or {}
    method = qc.get("quant_method")
    if method == hf_fp8.QUANT_METHOD:
        block = hf_fp8.block_size(qc)  # already checked by read_declaration
        return SourceFormat(
            "hf-fp8", hf_fp8.scale_param(block), (block,) if block else (), scale_dtypes=hf_fp8.scale_dtypes(qc)
        )
    if method == ct.QUANT_METHOD:
        schemes = decl.schemes
        formats = {s.format for s in schemes}
        if (
            schemes
            and all(s.weight_type == "float" and s.num_bits == 8 for s in schemes)
            and formats <= {ct.FLOAT_QUANTIZED, ct.NAIVE_QUANTIZED}
        ):
            blocks = {s.block for s in schemes if s.block}
            blocks |= {
                (1, s.group_size)
                for s in schemes
                if s.strategy == "group" and s.group_size is not None and s.group_size > 0
            }
            if len(blocks) > 1:
                raise CheckpointError(
                    f"quantization_config.config_groups declare different FP8 blocks {sorted(blocks)}; "
                    "a scale's shape cannot say which one it follows",
                    file=cfg_path,
                    code="source.config",
                )
            dtypes = frozenset().union(*(s.scale_dtypes for s in schemes))
            return SourceFormat("ct-fp8", names.WEIGHT_SCALE, tuple(blocks), True, dtypes)
        raise CheckpointError(
            f"is already quantized (compressed-tensors format {', '.join(sorted(map(str, formats)))}); "
            "quantize from the unquantized or FP8 checkpoint",
            file=cfg_path,
            code="source.already-quantized",
        )
    raise CheckpointError(
        f"is already quantized (quant_method {str(method)[:40]!r}); quantize from the unquantized or FP8 checkpoint",
        file=cfg_path,
        code="source.already-quantized",
    )


class TensorReader:
    """Whole tensors of a checkpoint by name, through one open reader per shard."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self._readers: dict[str, ShardReader] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def read(self, name: str) -> np.ndarray:
        shard = self.ckpt.tensors[name].shard
        if shard not in self._readers:
            self._readers[shard] = ShardReader(self.ckpt.path(shard), self.ckpt.headers[shard])
        return self._readers[shard].read(name)


def source_format(ckpt: Checkpoint) -> SourceFormat:
    """Dense or FP8, as the quantizer sees it; anything already quantized is refused for ORIG."""
    try:
        return detect_source_format(ckpt)
    except CheckpointError as exc:
        if exc.code != "source.already-quantized":
            raise
        raise CheckpointError(
            "is already quantized: ORIG must be the unquantized (BF16/FP16/FP32) or FP8 original",
            file=exc.file,
            code="eval.orig-quantized",
        ) from None


class OriginalWeights(TensorReader):
    """Dense weights of ORIG by module name. Holds open file descriptors, never tensor data."""

    def __init__(self, ckpt: Checkpoint) -> None:
        super().__init__(ckpt)
        self.format = source_format(ckpt)

    def nbytes(self, module: str) -> int:
        """Bytes read from disk for the module's weight (and its FP8 scale)."""
        held = [f"{module}.{names.WEIGHT}", f"{module}.{self.format.scale_param}"]
        return sum(self.ckpt.tensors[n].info.nbytes for n in held if n in self.ckpt.tensors)

    def shape(self, module: str) -> tuple[int, ...]:
        """The weight's shape from the header, after checking it is there and dense or FP8."""
        name = f"{module}.{names.WEIGHT}"
        ref = self.ckpt.tensors.get(name)
        if ref is None:
            raise CheckpointError(
                f"is not in ORIG, but QUANT quantizes {module}: the two checkpoints do not correspond",
                file=self.ckpt.root,
                tensor=name,
                code="eval.mismatch",
            )
        dtype = ref.info.dtype.code
        if dtype not in DENSE_FLOATS + FP8_FLOATS:
            raise CheckpointError(
                f"is {dtype}: ORIG must hold BF16, FP16, FP32 or FP8 weights",
                file=self.ckpt.path(ref.shard),
                tensor=name,
                code="eval.orig-dtype",
            )
        if dtype in FP8_FLOATS and self.format.scale_param is None:
            raise CheckpointError(
                "is FP8 but ORIG's config.json declares no FP8 quantization, so there is no scale to decode it",
                file=self.ckpt.path(ref.shard),
                tensor=name,
                code="eval.orig-fp8",
            )
        return ref.info.shape

    def weight(self, module: str) -> np.ndarray:
        """The module's weight as a dense float array (FP8 decoded to BF16)."""
        self.shape(module)
        name = f"{module}.{names.WEIGHT}"
        weight = self.read(name)
        if self.ckpt.tensors[name].info.dtype.code not in FP8_FLOATS:
            return weight
        block = self.format.scale_block(self.ckpt, name)
        return fp8.dequantize_rows(weight, self.read(f"{module}.{self.format.scale_param}"), 0, block)
