"""A checkpoint's tensors as dense float32 torch tensors, one module at a time.

A dense or FP8 original is read as the quantizer reads it (FP8 decoded exactly as `quantize` and
`eval` decode it, `formats.source`); a compressed-tensors checkpoint's quantized modules are
dequantized by our own decoders (`formats.dequantize`: each format's `decompress`, as `eval`'s
weight error does), so the model run is the quantized model as served. Only names are held; bytes
are read when a layer is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightsmith.core.errors import CheckpointError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.declaration import QuantizedModule, quantized_modules
from weightsmith.formats.dequantize import dequantize
from weightsmith.formats.source import OriginalWeights, TensorReader, source_format
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint

if TYPE_CHECKING:
    import numpy as np
    import torch
else:  # a --help or a header-only command imports this module without numpy
    np = lazy_module("numpy")

ORIGINAL, QUANTIZED = "original", "quantized"  # calibration.ACTIVATIONS


class TensorSource:
    """Dense weights of a checkpoint by the names transformers' loader expects on disk.

    `names` lists every tensor the source can give: a quantized module appears as its
    `<module>.weight` (its `weight_packed`, scales and other quantization parameters are hidden),
    FP8 scales are hidden behind the weights they decode, and activation or KV-cache scales are
    left out (the engine measures activations; it does not replay them).
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self.reader = TensorReader(ckpt)
        self.quantized: dict[str, QuantizedModule] = {}
        self.original: OriginalWeights | None = None
        qc = ckpt.quantization_config
        if qc is not None and qc.get("quant_method") == ct.QUANT_METHOD and not _is_fp8_source(ckpt):
            self.quantized = {f"{qm.module}.{names.WEIGHT}": qm for qm in quantized_modules(ckpt)}
            self.activations = QUANTIZED
            hidden = {p for qm in self.quantized.values() for p in qm.params.values()}
        else:
            self.original = OriginalWeights(ckpt)
            self.activations = ORIGINAL
            scale = self.original.format.scale_param
            hidden = {n for n in ckpt.tensors if scale is not None and n.endswith("." + scale)}
        hidden |= {n for n in ckpt.tensors if names.split(n)[1] in _ACTIVATION_PARAMS}
        self.names = sorted({n for n in ckpt.tensors if n not in hidden} | set(self.quantized))

    def close(self) -> None:
        self.reader.close()
        if self.original is not None:
            self.original.close()

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tensor(self, name: str) -> torch.Tensor:
        """The named tensor, dense, as float32 (integer tensors as stored)."""
        import torch

        qm = self.quantized.get(name)
        if qm is not None:
            try:
                array = dequantize(qm, self.reader)
            except NotImplementedError as exc:  # a format our decoders do not read yet
                marker = qm.marker
                raise CheckpointError(
                    f"cannot be run: {exc} is not supported",
                    file=self.ckpt.file_of(marker),
                    tensor=marker,
                    code="engine.format",
                ) from None
        elif self.original is not None and names.split(name)[1] == names.WEIGHT and _is_fp8(self.ckpt, name):
            array = self.original.weight(names.split(name)[0])
        else:
            array = self.reader.read(name)
        if array.dtype.kind == "f" or array.dtype.name == "bfloat16":
            array = array.astype(np.float32, copy=False)
        elif array.dtype.kind not in "iub":
            raise CheckpointError(
                f"is stored as {array.dtype}, which the engine cannot run",
                file=self.ckpt.file_of(name) if name in self.ckpt.tensors else self.ckpt.root,
                tensor=name,
                code="engine.dtype",
            )
        return torch.from_numpy(np.ascontiguousarray(array))


#: Parameters that hold activation or KV-cache scales, not weights.
_ACTIVATION_PARAMS = frozenset(
    {
        names.INPUT_SCALE,
        names.INPUT_GLOBAL_SCALE,
        "input_zero_point",
        names.OUTPUT_SCALE,
        "output_zero_point",
        "k_scale",
        "v_scale",
        "kv_scale",
    }
)


def _is_fp8(ckpt: Checkpoint, name: str) -> bool:
    ref = ckpt.tensors.get(name)
    return ref is not None and ref.info.dtype.code.startswith("F8")


def _is_fp8_source(ckpt: Checkpoint) -> bool:
    """A compressed-tensors FP8 checkpoint the quantizer accepts as an original."""
    try:
        return source_format(ckpt).kind != "dense"
    except CheckpointError as exc:
        if exc.code == "eval.orig-quantized":
            return False
        raise
