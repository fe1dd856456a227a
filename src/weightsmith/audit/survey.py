"""Read everything a checkpoint folder says about itself, collecting problems instead of stopping.

`Checkpoint.open` stops at the first problem, which is right for a command that must trust its
input. The doctor needs the opposite: read every config, index and shard header it can, record each
thing that is wrong as a `Finding`, and hand the readable rest to the checks. Only a path that is
not a checkpoint at all (nothing to read) raises.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from weightsmith.audit.findings import ERROR, WARNING, Finding, from_error, relative
from weightsmith.audit.modules import Located
from weightsmith.core.errors import CheckpointError, HeaderError
from weightsmith.core.files import exists
from weightsmith.formats.modelopt import HF_QUANT_CONFIG_FILE
from weightsmith.io.checkpoint import (
    CONFIG_FILE,
    INDEX_FILE,
    SHARD_SUFFIX,
    SINGLE_FILE,
    duplicate_tensors,
    index_problems,
    index_shape_problem,
    read_json,
    unsafe_shards,
)
from weightsmith.safetensors.header import MAX_TENSORS, Header, read_header

#: What to do about each problem the shared readers report (their messages say what is wrong).
ACTIONS = {
    "header.too-small": "re-download or rewrite the file",
    "header.too-large": "the file is not a safetensors file, or its first 8 bytes are damaged",
    "header.truncated": "the file was cut short; re-download it",
    "header.not-utf8": "rewrite the shard with a safetensors writer",
    "header.not-json": "rewrite the shard with a safetensors writer",
    "header.duplicate-name": "the reference reader silently keeps one of them; rewrite the shard with each name once",
    "header.metadata": "rewrite the shard",
    "header.entry": "rewrite the shard with a safetensors writer",
    "header.dtype": "use one of the safetensors dtype codes (packed int4 lives in I32 or U8)",
    "header.misaligned": "sub-byte tensors must fill whole bytes; pad the last dimension",
    "header.size-mismatch": "shape, dtype and data_offsets disagree; rewrite the shard",
    "offsets.gap": "tensors must be packed back to back from offset 0; rewrite the shard",
    "offsets.overlap": "tensors must not share bytes; rewrite the shard",
    "size.truncated": "re-download the file",
    "size.trailing": "the reference reader refuses such files; truncate it to the declared size or rewrite it",
    "index.missing-tensor": "remove the entry or restore the tensor to that shard",
    "index.duplicate-tensor": "keep one copy and point the index at it",
    "index.unlisted-tensor": "add it to the index weight_map",
    "index.wrong-shard": "point its index entry at the shard that holds it",
    "index.total-size": "set metadata.total_size to the sum of tensor data bytes",
    "json.invalid": "fix the JSON or download the file again",
    "file.unreadable": "check its permissions, or download it again",
    "file.not-regular": "put the real file in its place",
    "file.too-large": "the file is not what its name says; download it again",
    "index.invalid": "rebuild the index",
    "index.duplicate-entry": "list each tensor once, under the shard that holds it",
}

#: Index problems no command may read past: a shard name that leads out of the folder, a tensor
#: listed under two shards. `verify` reports them; every other command refuses the checkpoint.
HOSTILE_INDEX_CODES = frozenset({"index.unsafe-shard", "index.duplicate-entry"})


@dataclass
class Survey:
    """A checkpoint as far as it could be read."""

    root: Path
    #: True when the user named one `.safetensors` file rather than a folder.
    single_file: bool
    config: dict[str, Any] | None
    hf_quant_config: dict[str, Any] | None
    index: dict[str, Any] | None
    shard_names: list[str]
    headers: dict[str, Header]
    findings: list[Finding] = field(default_factory=list)

    @cached_property
    def tensors(self) -> dict[str, Located]:
        """Every tensor by name; where two shards hold one name, the first shard's copy."""
        tensors: dict[str, Located] = {}
        for shard, header in self.headers.items():
            for name, info in header.tensors.items():
                if name not in tensors:
                    tensors[name] = Located(shard, info)
        return tensors

    @property
    def unreadable_shards(self) -> list[str]:
        return [s for s in self.shard_names if s not in self.headers]

    def path(self, shard: str) -> Path:
        """The file of a shard that was read (its name passed `unsafe_shards` before it was opened)."""
        return self.root / shard

    def refuse_hostile_index(self) -> None:
        """Raise the first finding in `HOSTILE_INDEX_CODES`: what a command that reads on must not skip."""
        for f in self.findings:
            if f.check in HOSTILE_INDEX_CODES:
                raise CheckpointError(f.message, file=self.root / (f.file or ""), tensor=f.tensor, code=f.check)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while headers turn into many small acyclic objects.

    A 100k-tensor checkpoint allocates about a million objects; left on, the collector rescans the
    growing heap again and again, which doubled the time `inspect` took on such a checkpoint.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def survey(path: str | os.PathLike[str], cross_check: bool = True) -> Survey:
    """Read a checkpoint folder (or a single shard), raising only when there is nothing to read.

    `cross_check` compares the index with the shard headers both ways; inspect, which only counts,
    skips it.
    """
    path = Path(path)
    if path.is_file():
        if not path.name.endswith(SHARD_SUFFIX):
            raise CheckpointError(
                f"is not a {SHARD_SUFFIX} file (expected a checkpoint folder or one shard)",
                file=path,
                code="file.missing",
            )
        return _survey_file(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is neither a folder nor a file"
        raise CheckpointError(
            f"{what} (expected a checkpoint folder or a .safetensors file)", file=path, code="file.missing"
        )

    root = path
    findings: list[Finding] = []
    config = _json(root / CONFIG_FILE, CONFIG_FILE, root, findings, required=True)
    hf_quant = _json(root / HF_QUANT_CONFIG_FILE, HF_QUANT_CONFIG_FILE, root, findings, required=False)
    index, listed = _index(root, findings)
    present = sorted(p.name for p in root.iterdir() if p.name.endswith(SHARD_SUFFIX))
    if listed is not None:
        shard_names = listed
    elif (root / SINGLE_FILE).exists() or (root / SINGLE_FILE).is_symlink():
        shard_names = [SINGLE_FILE]
    else:
        shard_names = present
    if not shard_names and index is None and not (root / INDEX_FILE).exists():
        raise CheckpointError(
            f"is not a checkpoint: no {SINGLE_FILE}, no {INDEX_FILE} and no other .safetensors file",
            file=root,
            code="file.missing",
        )
    if listed is None and (root / INDEX_FILE).exists() and not shard_names:
        findings.append(Finding("file.missing", ERROR, "no .safetensors shard is present at all", None))

    unsafe = unsafe_shards(root, root / INDEX_FILE, index["weight_map"]) if index is not None else {}
    findings.extend(_actionable(from_error(problem, root)) for problem in unsafe.values())
    headers = _headers(root, [s for s in shard_names if s not in unsafe], index is not None, findings)
    if index is not None and cross_check:
        findings.extend(_index_findings(root, index, headers, len(headers) < len(shard_names)))
        for stray in sorted(set(present) - set(shard_names)):
            findings.append(
                Finding(
                    "shard.stray",
                    WARNING,
                    f"is not named in {INDEX_FILE}; loaders skip it (delete it or index it)",
                    stray,
                )
            )
    elif cross_check:
        findings.extend(_duplicates(root, headers))
    return Survey(root, False, config, hf_quant, index, shard_names, headers, findings)


def _survey_file(path: Path) -> Survey:
    findings: list[Finding] = []
    headers = _headers(path.parent, [path.name], False, findings)
    return Survey(path.parent, True, None, None, None, [path.name], headers, findings)


def _json(path: Path, what: str, root: Path, findings: list[Finding], required: bool) -> dict[str, Any] | None:
    if not required and not (path.exists() or path.is_symlink()):
        return None
    try:
        return read_json(path, what, unique_keys=what == "index")
    except CheckpointError as exc:
        findings.append(_actionable(from_error(exc, root)))
        return None


def _index(root: Path, findings: list[Finding]) -> tuple[dict[str, Any] | None, list[str] | None]:
    """The index and the shards it names, or (None, None) when there is no usable index."""
    path = root / INDEX_FILE
    if not (path.exists() or path.is_symlink()):
        return None, None
    index = _json(path, "index", root, findings, required=True)
    if index is None:
        return None, None
    problem = index_shape_problem(path, index)
    if problem is not None:
        findings.append(_actionable(from_error(problem, root)))
        return None, None
    weight_map = index["weight_map"]
    if not weight_map:
        findings.append(Finding("index.invalid", ERROR, "has an empty weight_map; rebuild the index", INDEX_FILE))
        return None, None
    return index, sorted(set(weight_map.values()))


def _headers(root: Path, shard_names: list[str], indexed: bool, findings: list[Finding]) -> dict[str, Header]:
    headers: dict[str, Header] = {}
    budget = MAX_TENSORS  # tensors the shards still to be read may hold, as in `Checkpoint.open`
    for name in shard_names:
        path = root / name
        if not exists(path):
            why = (
                f"is named in {INDEX_FILE} but does not exist; download it, or drop its entries from the index"
                if indexed
                else "does not exist"
            )
            if path.is_symlink():
                why += f" (a broken link to {os.readlink(path)}; the blob was never downloaded?)"
            findings.append(Finding("index.missing-shard" if indexed else "file.missing", ERROR, why, name))
            continue
        try:
            headers[name] = read_header(path, budget)
            budget -= len(headers[name].tensors)
        except HeaderError as exc:
            findings.append(_actionable(from_error(exc, root)))
    return headers


def _index_findings(root: Path, index: dict[str, Any], headers: dict[str, Header], incomplete: bool) -> list[Finding]:
    """Index-versus-header disagreements, and a missing `total_size` when every shard was read."""
    found = [_actionable(from_error(problem, root)) for problem in index_problems(root / INDEX_FILE, index, headers)]
    metadata = index.get("metadata")
    if not incomplete and (not isinstance(metadata, dict) or metadata.get("total_size") is None):
        found.append(
            Finding(
                "index.total-size", WARNING, "has no metadata.total_size; add the sum of tensor data bytes", INDEX_FILE
            )
        )
    return found


def _actionable(finding: Finding) -> Finding:
    action = ACTIONS.get(finding.check)
    if action is None or action in finding.message:
        return finding
    return replace(finding, message=f"{finding.message}; {action}")


def _duplicates(root: Path, headers: dict[str, Header]) -> list[Finding]:
    return [
        Finding(p.code, ERROR, f"{p.message}; keep one", relative(p.file, root), p.tensor)
        for p in duplicate_tensors(headers)
    ]
