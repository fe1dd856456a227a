"""The manifest written into every output: the recipe, the provenance and the byte accounting.

It is what a later `card` or audit reads to say how a checkpoint was made without guessing:
scheme and ignore list, tool version, source file hashes, and bytes and bits per parameter by
category before and after. It is a typed record (`Manifest`) written as `weightsmith.json`, and
read back by field, never by dict key, so a reader and the writer cannot disagree on a name.

Versions found in the wild, all read by `Manifest.from_json`:
- 1: no `recipe.rules` or `recipe.recipe_file` (one scheme per checkpoint); the earliest files
  also lack `recipe.scale_search`. Read with those fields as None.
- 2: `recipe.rules` (one record per recipe rule) and `recipe.recipe_file`.
A manifest is a file anyone can hand to `card`, so reading one checks every field's type and range
and names the first one that is wrong, in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import open_regular, write_json_new
from weightsmith.core.jsonable import jsonable
from weightsmith.io.checkpoint import Checkpoint, read_json
from weightsmith.io.provenance import ACTIVATIONS, EXPERT_TOKENS, Provenance

MANIFEST_FILE = "weightsmith.json"
MANIFEST_VERSION = 5  # 2: recipe.rules and recipe.recipe_file; 3: method; 4: pre_pass; 5: source.hub
#: Where calibration statistics came from (model fingerprint, tokens, text): the `calibrate` record.
CalibrationRecord = Provenance


@dataclass(kw_only=True)
class Tool:
    name: str
    version: str


@dataclass(kw_only=True)
class RuleRecord:
    """One recipe rule: what it targets, its scheme in words, and how many weights it quantized."""

    targets: list[str]
    scheme: str
    config_group: str | None  # None when the rule quantized nothing (no group is written for it)
    weights: str
    quantized: int


@dataclass(kw_only=True)
class RecipeRecord:
    """The scheme and what it was applied to; the top-level scheme fields are the first rule's."""

    scheme: str
    config_group: str
    num_bits: int
    group_size: int | None
    symmetric: bool
    scale_search: str | None = None  # absent in the earliest version-1 files
    rules: list[RuleRecord] | None = None  # from version 2 on
    recipe_file: str | None = None  # from version 2 on
    preset: str | None = None
    ignore: list[str] = field(default_factory=list)
    source_format: str


@dataclass(kw_only=True)
class MethodRecord:
    """How the integer values were chosen when not by round-to-nearest alone (`--method gptq`)."""

    name: str  # "gptq"
    dampening: float  # fraction of the Hessian's mean diagonal added to its diagonal
    block_size: int
    actorder: str | None
    tokens: int  # calibration tokens the Hessians were accumulated over
    #: Modules written with round-to-nearest instead (a Hessian singular after dampening, ...) and why.
    rtn_fallback: dict[str, str] = field(default_factory=dict)
    #: Whether each MoE expert's Hessian came from every token (`--all-experts`) or its routed ones.
    all_experts: bool = False
    #: MoE expert modules whose Hessian came from fewer tokens than their input width, with the count: the
    #: dampening, not the data, makes those Hessians invertible.
    few_tokens: dict[str, int] = field(default_factory=dict)


@dataclass(kw_only=True)
class PrePassRecord:
    """A transform of the weights before quantizing them that leaves the model's function unchanged
    (`--pre-pass sinq`): the quantized weights are of the transformed model, and the unquantized
    tensors it changed differ from the source by design."""

    name: str  # "sinq"
    iterations: int  # Sinkhorn steps at most per group tile
    #: Unquantized tensors written with values that differ from the source's (norm weights, biases).
    changed: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class SourceFile:
    bytes: int
    sha256: str | None = None  # None with --no-hash


@dataclass(kw_only=True)
class HubRecord:
    """Where on the Hub the source came from, when SRC was a Hub id: the repository, the revision asked
    for (None: the default branch) and the commit it resolved to, which names the files exactly."""

    repo_id: str
    revision: str | None = None
    commit: str


@dataclass(kw_only=True)
class SourceRecord:
    path: str
    files: dict[str, SourceFile]
    #: `calibration.fingerprint` of the source: how `calibrate` on this checkpoint names the model it
    #: was quantized from, so `quantize` of that model accepts the statistics. Written only when set.
    fingerprint: str | None = None
    #: The Hub repository and commit SRC named (`path` is then the snapshot in the Hub cache). Written only when set.
    hub: HubRecord | None = None


@dataclass(kw_only=True)
class TensorCounts:
    """How many source tensors the plan quantized, kept, decoded from FP8, and dropped (FP8 scales)."""

    quantize: int
    keep: int
    decode: int
    drop: int


@dataclass(kw_only=True)
class CategorySizes:
    bytes_before: int | float
    bytes_after: int | float


@dataclass(kw_only=True)
class Sizes:
    bytes_before: int | float
    bytes_after: int | float
    gib_saved: float
    parameters: int | float
    bits_per_parameter_before: float | None
    bits_per_parameter_after: float | None
    by_category: dict[str, CategorySizes] = field(default_factory=dict)


@dataclass(kw_only=True)
class Manifest:
    """One run's record; `to_json` is what is written, `from_json` reads this and every older version."""

    manifest_version: int = MANIFEST_VERSION
    tool: Tool
    created_utc: str
    recipe: RecipeRecord
    source: SourceRecord
    tensors: TensorCounts
    sizes: Sizes
    #: Where the statistics of a calibrated scheme came from; written only when set.
    calibration: CalibrationRecord | None = None
    #: Where the KV-cache scales `calibrate-kv` added came from (its latest run); written only when set.
    kv_calibration: CalibrationRecord | None = None
    #: How the values were chosen when a data-aware method did it (from version 3 on); written only when set.
    method: MethodRecord | None = None
    #: The pre-pass the weights went through before quantizing (from version 4 on); written only when set.
    pre_pass: PrePassRecord | None = None
    #: Source files not carried over (links out of the source, FIFOs, ...) and why; written only when any.
    skipped_files: dict[str, str] = field(default_factory=dict)
    #: Source files carried over unchanged (relative paths); written only when any. With the source's
    #: shard names (`source.files`) they say which entries of an output folder the run wrote, so that
    #: `--force` replaces only a folder holding nothing else (`outputdir.not_ours`).
    copied_files: list[str] = field(default_factory=list)

    @property
    def quantize_calibration(self) -> CalibrationRecord | None:
        """The quantize run's own calibration record, or None when it had none.

        `calibrate-kv` on a checkpoint with no calibration record writes its one record as both
        `calibration` and `kv_calibration`; equal records are that one run, not a quantize run's."""
        return self.calibration if self.calibration != self.kv_calibration else None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values in the written order; fields that are written only when set are left out.

        This is always the current layout: a version-1 manifest read in and written out again keeps
        its `manifest_version` and shows the fields it lacked as null.
        """
        out: dict[str, Any] = jsonable(self)
        for key in ("calibration", "kv_calibration", "method", "pre_pass", "skipped_files", "copied_files"):
            if not out[key]:
                del out[key]
        for key in ("fingerprint", "hub"):  # a source not fingerprinted (older manifests), not from the Hub
            if out["source"][key] is None:
                del out["source"][key]
        return out

    @classmethod
    def from_json(cls, data: Any, file: str | Path = MANIFEST_FILE) -> Manifest:
        """The manifest in `data` (any version weightsmith wrote), or one line naming `file` and the field."""
        if not isinstance(data, dict):
            raise _error(file, f"the top level is {_kind(data)}, not an object")
        if "manifest_version" not in data:
            raise _error(file, "has no field manifest_version; it is not a `weightsmith quantize` manifest")
        version = _read(int, data["manifest_version"], "manifest_version", file)
        if not 1 <= version <= MANIFEST_VERSION:
            raise _error(
                file,
                f"manifest_version {_shown(version)} is not one this weightsmith reads (1 to {MANIFEST_VERSION})",
            )
        manifest: Manifest = _read(cls, data, "", file)
        _check_values(manifest, file)
        return manifest


def load_manifest(path: str | Path) -> Manifest:
    """Read and check a `weightsmith.json` file."""
    return Manifest.from_json(read_json(Path(path), finite=False), path)  # from_json names a non-finite field


def write_manifest(folder: Path, manifest: Manifest) -> None:
    write_json_new(folder, MANIFEST_FILE, manifest.to_json())


# --- reading: every field's type from the dataclasses above, with the card's wording ---

#: Every integer in a manifest is a count, a size or a bit width; beyond this it is not one we wrote.
MAX_INT = 2**63 - 1
#: A scheme name goes into the card's front matter: one plain token, no spaces or line breaks.
_SCHEME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
          dict: "an object", type(None): "null"}  # fmt: skip


def _error(file: str | Path, message: str) -> WeightsmithError:
    return WeightsmithError(message, file=file, code="manifest.field")


def _kind(value: Any) -> str:
    return _WORDS.get(type(value), type(value).__name__)


def _shown(value: int) -> str:
    """An integer as written, or its length when printing it would flood the line."""
    text = str(value)
    return text if len(text) <= 24 else f"a {len(text)}-digit integer"


def _expected(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_expected(t) for t in typing.get_args(tp)))
    if dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict:
        return "an object"
    if typing.get_origin(tp) is list:
        return "a list"
    return _WORDS[tp]


def _fits(tp: Any, value: Any) -> bool:
    """Whether `value` is the JSON shape of `tp` (one level; the parts are checked as they are read)."""
    if dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict:
        return isinstance(value, dict)
    if typing.get_origin(tp) is list:
        return isinstance(value, list)
    if tp is float:  # an integer is a fine number
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:  # true is an integer in Python, not in JSON
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


@functools.cache
def _hints(tp: type) -> dict[str, Any]:
    """A record's field types (resolved once: a manifest may list thousands of source files)."""
    return typing.get_type_hints(tp)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _read(tp: Any, value: Any, where: str, file: str | Path) -> Any:
    """`value` as type `tp`, or a one-line error naming `file` and the field at `where`.

    Values are kept as they are (an integer where a number is allowed stays an integer), so a
    manifest read and written again is the same JSON.
    """
    options = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    chosen = next((t for t in options if _fits(t, value)), None)
    if chosen is None:
        raise _error(file, f"{where or 'the top level'} is {_kind(value)}, not {_expected(tp)}")
    if isinstance(chosen, type) and dataclasses.is_dataclass(chosen):
        hints = _hints(chosen)
        given = {}
        for f in dataclasses.fields(chosen):
            if f.name in value:
                given[f.name] = _read(hints[f.name], value[f.name], _join(where, f.name), file)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _error(file, f"has no field {_join(where, f.name)}")
        return chosen(**given)
    if typing.get_origin(chosen) is list:
        (inner,) = typing.get_args(chosen)
        return [_read(inner, v, f"{where}[{i}]", file) for i, v in enumerate(value)]
    if typing.get_origin(chosen) is dict:
        _, inner = typing.get_args(chosen)
        return {k: _read(inner, v, f"{where}[{k[:80]}]", file) for k, v in value.items()}
    if chosen is int and not 0 <= value <= MAX_INT:
        raise _error(file, f"{where} is {_shown(value)}, not a count from 0 to 2**63-1")
    if chosen is float and not math.isfinite(value):
        raise _error(file, f"{where} is {value}, not a finite number")
    return value


def _check_values(m: Manifest, file: str | Path) -> None:
    """What the card relies on beyond types: scheme names fit on one line of front matter; known words."""
    schemes = [("recipe.scheme", m.recipe.scheme)]
    schemes += [(f"recipe.rules[{i}].scheme", r.scheme) for i, r in enumerate(m.recipe.rules or [])]
    for where, name in schemes:
        if not _SCHEME_NAME.fullmatch(name):
            raise _error(file, f"{where} {name[:40]!r} is not a scheme name")
    for i, r in enumerate(m.recipe.rules or []):
        if r.quantized and r.config_group is None:
            raise _error(file, f"recipe.rules[{i}].config_group is null, yet the rule quantized {r.quantized} weights")
    for where, record in (("calibration", m.calibration), ("kv_calibration", m.kv_calibration)):
        if record is not None and record.activations not in ACTIVATIONS:
            raise _error(file, f"{where}.activations must be one of {', '.join(ACTIVATIONS)}")
        if record is not None and record.experts not in (None, *EXPERT_TOKENS):
            raise _error(file, f"{where}.experts must be one of {', '.join(EXPERT_TOKENS)}")


# --- writing: the record of one run ---


def hash_files(paths: list[Path]) -> dict[str, str]:
    """sha256 of each file, streamed (hashlib releases the GIL while it digests)."""
    out = {}
    for p in paths:
        with os.fdopen(open_regular(p), "rb") as f:
            out[p.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def source_fingerprint(ckpt: Checkpoint, model_fingerprint: str, activations: str) -> str | None:
    """The original model behind statistics measured on `ckpt` (`Provenance.source_fingerprint`).

    A checkpoint weightsmith wrote names its source in its manifest, whatever its format (a static
    FP8 checkpoint runs as an FP8 original does, yet was quantized from SRC). Otherwise an original
    is its own source, and a quantized checkpoint's source is unknown (None).
    """
    path = ckpt.root / MANIFEST_FILE
    recorded = load_manifest(path).source.fingerprint if path.is_file() else None
    if recorded is not None:
        return recorded
    return model_fingerprint if activations == "original" else None


def measured_activations(activations: str, model_fingerprint: str, source: str | None) -> str:
    """`quantized` for a checkpoint quantized from another model (its manifest says so), else as the engine ran it."""
    return "quantized" if source is not None and source != model_fingerprint else activations
