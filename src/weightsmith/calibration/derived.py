"""What a quantize run makes of a calibration file: static activation scales and KV-cache scales.

`weightsmith calibrate` measures, per Linear, the largest |x| entering it and, per attention layer,
the largest |K| (after the rotary embedding) and |V| entering the KV cache (calibration.py). Here
those maxima become tensors: a scheme's static activation parameters (`Scheme.input_params`, one
value per fused set, since vLLM runs q/k/v and gate/up on one input) and FP8 KV-cache scales,
`k_scale`/`v_scale` = max / 448 as llm-compressor computes them (compressed-tensors'
`calculate_qparams` for a symmetric per-tensor FP8 observer), with the `kv_cache_scheme` that
declares them. The plan asks this module; it knows no scheme by name.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightsmith.calibration import stats_file
from weightsmith.core.errors import CheckpointError, WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.io.checkpoint import Checkpoint

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import eightbit
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    eightbit = lazy_module("weightsmith.quant.eightbit")

#: `--kv-cache` values: the KV-cache formats whose scales we can write.
KV_CACHE_FORMATS = ("fp8",)
#: The largest activation maximum an FP32 scale can be computed from.
FP32_MAX = float.fromhex("0x1.fffffep+127")  # numpy.finfo(numpy.float32).max
#: How a user makes a statistics file, quoted where one is missing.
HOW = "measure one with `weightsmith calibrate SRC --out STATS`"


@dataclass(frozen=True)
class Calibration:
    """A statistics file read, checked, and known to belong to the checkpoint being quantized."""

    path: Path
    stats: stats_file.CalibrationStats
    #: `stats_file.ITSELF` or `stats_file.QUANTIZATION`: measured on the checkpoint being quantized,
    #: or on a quantization of it (the activations of the model as served).
    measured_on: str = stats_file.ITSELF


def load(path: str | os.PathLike[str], ckpt: Checkpoint) -> Calibration:
    """Read `path` (every entry checked) and refuse it unless it was measured on `ckpt` or on a
    checkpoint quantized from it."""
    path = Path(path)
    if not path.exists():
        raise WeightsmithError(f"does not exist ({HOW})", file=path, code="usage")
    stats = stats_file.read(path)
    return Calibration(path, stats, stats_file.check_model(path, stats, ckpt))


def require(cal: Calibration | None, what: str) -> Calibration:
    """`cal`, or a one-line usage error saying that `what` needs a statistics file."""
    if cal is None:
        raise WeightsmithError(f"{what} needs calibration statistics: pass --calibration STATS ({HOW})", code="usage")
    return cal


def input_absmax(cal: Calibration, module: str, quantized: set[str]) -> float:
    """The largest input |x| of `module` and of its fused partners among `quantized` (one scale per fused set)."""
    fused = names.fused_partners(module)
    members = [m for m in (fused[1] if fused else (module,)) if m in quantized] or [module]
    for m in members:
        if m not in cal.stats.inputs:
            raise CheckpointError(
                f"has no input maximum for {m}, which the scheme quantizes with a static activation scale "
                + (
                    "(an MoE expert no calibration token was routed to: calibrate --all-experts measures every "
                    "expert on every token)"
                    if names.expert_layer(m) is not None
                    else "(measured on another architecture, or with that module skipped?)"
                ),
                file=cal.path,
                tensor=f"{m}.{stats_file.INPUT_ABSMAX}",
                code="calibration.missing",
            )
    return max(cal.stats.inputs[m] for m in members)


def attention_modules(tensor_names: list[str]) -> list[str]:
    """Attention modules, recognised as the parents of a K (or fused QKV) projection weight."""
    found = set()
    for name in tensor_names:
        module, param = names.split(name)
        if param in (names.WEIGHT, names.WEIGHT_PACKED) and names.leaf(module) in names.ATTENTION_KEY_PROJECTIONS:
            found.add(module.rpartition(".")[0])
    return sorted(found, key=lambda a: (len(a), a))


def kv_scales(kv: dict[str, tuple[float, float]], attention: list[str], where: Path) -> dict[str, np.ndarray]:
    """FP8 KV-cache scales by tensor name: `max / 448` in float32, shape [1] as llm-compressor writes them.

    `kv` holds the (|K|, |V|) maxima by attention module, measured on `where` (named in errors).
    """
    out = {}
    for module in attention:
        pair = kv.get(module)
        if pair is None:
            raise CheckpointError(
                f"has no KV maximum for attention layer {module} (a KV-cache scale is needed for each)",
                file=where,
                tensor=f"{module}.{stats_file.KEY_ABSMAX}",
                code="calibration.missing",
            )
        for kind, amax in zip(("k", "v"), pair, strict=True):
            name = names.kv_scale_name(module, kind)
            # NaN, Inf or beyond FP32 makes no finite positive scale (vLLM would use 1.0 for it)
            if not (math.isfinite(amax) and 0 <= amax <= FP32_MAX):
                raise CheckpointError(
                    f"gave |{kind.upper()}| maximum {amax} for attention layer {module}, so no usable FP8 scale "
                    "(finite and positive); are its weights finite? (`weightsmith verify --scan-values`)",
                    file=where,
                    tensor=name,
                    code="calibration.non-finite",
                )
            out[name] = np.array([eightbit.static_scale(amax, np.dtype(np.float32))], np.float32)
    return out


def kv_cache_scheme(fmt: str) -> dict[str, Any]:
    """The `kv_cache_scheme` compressed-tensors writes for a static per-tensor FP8 cache (every field)."""
    assert fmt in KV_CACHE_FORMATS, fmt
    # observer: the scales are the maximum over every calibration token, as llm-compressor's static_minmax
    return dict(ct.weight_args(8, True, None, type_="float", strategy="tensor"), observer="static_minmax")


def provenance(cal: Calibration) -> dict[str, Any]:
    """Where the statistics came from, for the manifest and the card (plain JSON)."""
    return {"file": cal.path.name, **asdict(cal.stats.provenance)}
