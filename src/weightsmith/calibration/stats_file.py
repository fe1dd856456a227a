"""Calibration statistics on disk: what `weightsmith calibrate` measures and what its consumers read.

One safetensors file, every value an F32 scalar (shape `[]`):
- `<attention module>.key_absmax`, `<attention module>.value_absmax`: the largest |K| (after the
  rotary embedding) and |V| as they enter the KV cache, which is what vLLM's FP8 cache divides by
  `k_scale`/`v_scale`;
- `<linear module>.input_absmax`: the largest |x| entering that Linear (W4A4's `input_global_scale`,
  static FP8's `input_scale`).
Module names are the model's own (`model.layers.3.self_attn`, `model.layers.3.mlp.down_proj`), so a
consumer finds a checkpoint's tensors from them. `__metadata__` carries the provenance: which
model (a fingerprint of its files), how many tokens of which text, and whether the activations were
the original model's or the quantized one's. A stats file is a file someone handed us, so `read`
checks every name and value as it would a checkpoint's.
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from weightsmith.core.errors import CheckpointError, OutputError
from weightsmith.core.files import check_file_name, replace_file
from weightsmith.core.lazy import lazy_module
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.io.provenance import ACTIVATIONS, EXPERT_TOKENS, Provenance, fingerprint
from weightsmith.safetensors.header import read_header
from weightsmith.safetensors.reader import ShardReader
from weightsmith.safetensors.writer import TensorSpec, layout

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


#: The `format` metadata value; a reader refuses any other.
FORMAT = "weightsmith.calibration.stats_file/1"
KEY_ABSMAX = "key_absmax"
VALUE_ABSMAX = "value_absmax"
INPUT_ABSMAX = "input_absmax"
SUFFIXES = (KEY_ABSMAX, VALUE_ABSMAX, INPUT_ABSMAX)

_MODULE = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


@dataclass
class CalibrationStats:
    """Per attention module (K, V) maxima and per Linear input maxima, with their provenance."""

    provenance: Provenance
    kv: dict[str, tuple[float, float]] = field(default_factory=dict)  # attention module -> (|K| max, |V| max)
    inputs: dict[str, float] = field(default_factory=dict)  # Linear module -> |x| max


def is_calibration_file(path: Path) -> bool:
    """Whether `path` is a statistics file `write` made: a regular file (not a link) whose header
    declares our format. Nothing else is ours to replace: it may be a model's weights."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        return (read_header(path).metadata or {}).get("format") == FORMAT
    except (OSError, CheckpointError):
        return False


def check_replaceable(path: Path, replace: bool) -> None:
    """Refuse to write the statistics file `path` over anything, unless `replace` and it is one of ours."""
    check_file_name(path)
    if not os.path.lexists(path):
        return
    if not replace:
        raise OutputError("already exists (pass --force to replace it)", file=path, code="output.exists")
    if not is_calibration_file(path):
        raise OutputError(
            "is not a weightsmith statistics file; --force replaces only one of those",
            file=path,
            code="output.not-ours",
        )


def write(path: str | os.PathLike[str], stats: CalibrationStats, *, replace: bool = False) -> None:
    """Write `stats` to `path` whole or not at all: a new file beside it, then renamed (`replace_file`).

    An existing file is refused unless `replace`, and even then unless it is a statistics file
    (`check_replaceable`): it may be another model's statistics, or a model's weights.
    """
    path = Path(path)
    check_replaceable(path, replace)
    values: dict[str, float] = {}
    for module, (k, v) in stats.kv.items():
        values[f"{module}.{KEY_ABSMAX}"] = k
        values[f"{module}.{VALUE_ABSMAX}"] = v
    for module, x in stats.inputs.items():
        values[f"{module}.{INPUT_ABSMAX}"] = x
    for name, value in values.items():
        _check_value(path, name, value)
    metadata = {"format": FORMAT, **{k: str(v) for k, v in asdict(stats.provenance).items() if v is not None}}
    specs = [TensorSpec(name, "F32", ()) for name in values]
    head, offsets = layout(specs, metadata)
    body = bytearray(sum(s.nbytes for s in specs))
    for name, value in values.items():
        body[offsets[name] : offsets[name] + 4] = np.float32(value).tobytes()
    replace_file(path, head + bytes(body))  # a fresh temporary name: no file of the user's is removed


def read(path: str | os.PathLike[str]) -> CalibrationStats:
    """The statistics in `path`, every name, dtype, shape, value and metadata field checked."""
    path = Path(path)
    header = read_header(path)
    meta = header.metadata or {}
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"is not a calibration file (metadata format {meta.get('format')!r}, expected {FORMAT!r})",
            file=path,
            code="calibration.format",
        )
    provenance = _provenance(path, meta)
    stats = CalibrationStats(provenance)
    kv: dict[str, dict[str, float]] = {}
    with ShardReader(path, header) as reader:
        for name, info in header.tensors.items():
            module, _, suffix = name.rpartition(".")
            if suffix not in SUFFIXES or not _MODULE.fullmatch(module):
                raise CheckpointError(
                    f"is not a module name followed by one of {', '.join(SUFFIXES)}",
                    file=path,
                    tensor=name,
                    code="calibration.name",
                )
            if info.dtype.code != "F32" or tuple(info.shape) not in ((), (1,)):
                raise CheckpointError(
                    f"is {info.dtype.code} {list(info.shape)}, expected an F32 scalar",
                    file=path,
                    tensor=name,
                    code="calibration.shape",
                )
            value = float(reader.read(name).reshape(-1)[0])
            _check_value(path, name, value)
            if suffix == INPUT_ABSMAX:
                stats.inputs[module] = value
            else:
                kv.setdefault(module, {})[suffix] = value
    for module, pair in kv.items():
        if len(pair) != 2:
            missing = VALUE_ABSMAX if KEY_ABSMAX in pair else KEY_ABSMAX
            raise CheckpointError(
                f"has no {missing} beside it", file=path, tensor=f"{module}.{next(iter(pair))}", code="calibration.kv"
            )
        stats.kv[module] = (pair[KEY_ABSMAX], pair[VALUE_ABSMAX])
    return stats


#: `check_model` results: the statistics were measured on the model itself, or on a quantization of it.
ITSELF, QUANTIZATION = "itself", "a quantization of it"


def check_model(path: str | os.PathLike[str], stats: CalibrationStats, ckpt: Checkpoint) -> str:
    """Which model `stats` were measured on, relative to `ckpt`: ITSELF, or QUANTIZATION (a checkpoint
    quantized from `ckpt`, run as served); statistics of any other model are refused."""
    found = fingerprint(ckpt)
    prov = stats.provenance
    if prov.model_fingerprint == found:
        return ITSELF
    if prov.activations == "quantized" and prov.source_fingerprint == found:
        return QUANTIZATION
    raise CheckpointError(
        f"was measured on another model ({prov.model_fingerprint[:19]}..., {ckpt.root} is {found[:19]}...)",
        file=os.fspath(path),
        code="calibration.model",
    )


def _check_value(path: Path, name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise CheckpointError(
            f"holds {value}, not a finite non-negative maximum", file=path, tensor=name, code="calibration.value"
        )


def _provenance(path: Path, meta: dict[str, str]) -> Provenance:
    fields: dict[str, object] = {}
    for name, kind in Provenance.__annotations__.items():
        text = meta.get(name)
        if text is None and "None" in kind:
            continue  # an optional field, absent from older files
        if text is None:
            raise CheckpointError(f"metadata lacks {name!r}", file=path, code="calibration.metadata")
        if kind == "int":
            if not (text.isascii() and text.isdigit()) or len(text) > 18:  # '²' is a digit to isdigit
                raise CheckpointError(
                    f"metadata {name!r} is {text[:40]!r}, not a count", file=path, code="calibration.metadata"
                )
            fields[name] = int(text)
        else:
            fields[name] = text
    if fields.get("experts") not in (None, *EXPERT_TOKENS):
        raise CheckpointError(
            f"metadata 'experts' is {str(fields['experts'])[:40]!r}, expected one of {EXPERT_TOKENS}",
            file=path,
            code="calibration.metadata",
        )
    if fields["activations"] not in ACTIVATIONS:
        raise CheckpointError(
            f"metadata 'activations' is {str(fields['activations'])[:40]!r}, expected one of {ACTIVATIONS}",
            file=path,
            code="calibration.metadata",
        )
    return Provenance(**fields)  # type: ignore[arg-type]  # each value was checked against its field's annotation above
