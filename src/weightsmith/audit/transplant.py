"""Copy selected tensors (typically KV-cache scales) from a donor checkpoint into a target.

The tensors go into one new shard; the index gains their entries and a recomputed `total_size`;
for KV-cache scales the target's config gains a KV-cache scheme if it declares none. The new
shard's `__metadata__` records the donor and a blake2b hash of every copied tensor.

The result is staged in a partial folder beside the destination: unchanged files are hard links
(or copies where links are impossible), the new and changed files are written fresh, the staged
checkpoint is verified, and only then renamed into place. In place, the target folder is replaced
whole by that rename; with `--out` the target is never written to. The donor is only read.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightsmith.audit.findings import ERROR
from weightsmith.audit.values import CHUNK_BYTES, chunks
from weightsmith.audit.verify import FAMILIES, VerifyReport, verify
from weightsmith.core.errors import CheckpointError, OutputError
from weightsmith.core.files import copy_new, name_problem, write_json_new
from weightsmith.core.lazy import lazy_module
from weightsmith.core.version import __version__
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.declaration import MODELOPT, read_declaration
from weightsmith.formats.modelopt import HF_QUANT_CONFIG_FILE
from weightsmith.formats.targets import Targets
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE, DEFAULT_SHARD, INDEX_FILE, SHARD_SUFFIX, Checkpoint, read_json
from weightsmith.io.outputdir import CHOOSE_ANOTHER, check_destination, remove_stale, staged
from weightsmith.safetensors.dtypes import from_numpy
from weightsmith.safetensors.header import read_header
from weightsmith.safetensors.reader import ShardReader
from weightsmith.safetensors.writer import ShardWriter, TensorSpec

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


HASH = "blake2b-256"
#: What llm-compressor writes for a static, per-tensor FP8 KV cache (the scales' meaning).
CT_FP8_KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
#: ModelOpt's `convert_hf_quant_config_format` form of `kv_cache_quant_algo: FP8`.
MODELOPT_FP8_KV_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}
_MAX_REASONS = 3


@dataclass
class CopiedTensor:
    name: str
    dtype: str
    shape: list[int]
    donor_shard: str
    blake2b: str
    #: Tensors of the target this one replaces (itself, or the same KV scale under another name).
    replaces: list[str] = field(default_factory=list)


@dataclass
class TransplantResult:
    donor: str
    target: str
    output: str
    shard: str
    tensors: list[CopiedTensor]
    rewritten_shards: list[str]
    declared: str | None
    verify_errors: int
    verify_warnings: int
    notes: list[str]
    summary: str


@dataclass
class _Plan:
    copies: list[CopiedTensor]
    #: shard -> names to drop from it (for --replace).
    removals: dict[str, set[str]]
    config_changes: dict[str, dict[str, Any]]
    declared: str | None


def select(names_available: list[str], patterns: list[str]) -> list[str]:
    """Names matching any pattern: `re:` regexes (anchored at the start, as in compressed-tensors) or exact names."""
    wanted = Targets(patterns, "--select")
    return sorted(n for n in names_available if wanted.matches(n))


def transplant(
    donor: str | Path,
    target: str | Path,
    patterns: list[str],
    shard: str = DEFAULT_SHARD,
    out: str | Path | None = None,
    replace: bool = False,
) -> TransplantResult:
    """Copy the donor tensors that `patterns` select into a new shard of the target (or of `out`)."""
    if name_problem(shard) or "/" in shard or not shard.endswith(SHARD_SUFFIX) or shard in (INDEX_FILE, CONFIG_FILE):
        raise OutputError(
            f"shard name {shard!r} must be a plain file name ending in {SHARD_SUFFIX}", code="transplant.shard-name"
        )
    # first, so that a target a killed in-place run had renamed aside is back before it is opened
    stale = remove_stale(Path(out) if out is not None else Path(target), keep=[Path(donor), Path(target)])
    donor_ck = Checkpoint.open(donor, require_config=False)
    target_ck = Checkpoint.open(target, require_config=False)
    chosen = select(sorted(donor_ck.tensors), patterns)
    if not chosen:
        raise CheckpointError(
            f"has no tensor matching {patterns}", file=donor_ck.root, code="transplant.nothing-selected"
        )
    plan = _plan(donor_ck, target_ck, chosen, shard, replace)
    dest, report, rewritten = _apply(
        target_ck,
        out,
        shard,
        plan,
        lambda folder: _write_new_shard(donor_ck, folder, shard, plan.copies),
        sources=(donor_ck.root,),
    )
    replaced = sum(1 for c in plan.copies if c.replaces)
    notes = [*stale, f"{len(plan.copies) - replaced} new, {replaced} replaced"]
    if report.errors:
        notes.append(
            f"the result still has {report.errors} verify error(s), none of them structural; "
            f"run `weightsmith verify {dest}`"
        )
    where = "in place" if out is None else f"into {dest}"
    summary = (
        f"transplant: copied {len(plan.copies)} tensor(s) from {donor_ck.root} {where} as {shard}"
        f"{f', declared {plan.declared}' if plan.declared else ''}; verify afterwards: "
        + ("clean" if report.clean else f"{report.errors} error(s)")
    )
    return TransplantResult(
        str(donor_ck.root), str(target_ck.root), str(dest), shard, plan.copies, rewritten, plan.declared,
        report.errors, report.warnings, notes, summary,
    )  # fmt: skip


def _apply(
    target_ck: Checkpoint,
    out: str | Path | None,
    shard: str,
    plan: _Plan,
    write_shard: Callable[[Path], None],
    *,
    sources: tuple[Path, ...] = (),
    clean: bool = False,
) -> tuple[Path, VerifyReport, list[str]]:
    """Stage the target with the new shard (`write_shard(folder)`), the index and config changes, verify, rename.

    In place (`out` None) the target folder is replaced whole by the rename; otherwise `out` must
    not exist, nor lie inside the target or the other `sources` read, and those are only read.
    Returns (destination, its verify report, rewritten shards).
    `clean`: any verify error in the staged result refuses it, not only a structural one (`_check_result`).
    """
    dest = Path(out) if out is not None else target_ck.root
    if out is not None:
        check_destination(target_ck.root, dest, False, *sources, remedy=CHOOSE_ANOTHER)
    rewritten = sorted(s for s in plan.removals if s != shard)
    try:
        with staged(dest, force=out is None) as folder:
            skip = {INDEX_FILE, shard, *plan.removals, *plan.config_changes}
            _link_tree(target_ck.root, folder, skip, absolute_links=out is not None)
            write_shard(folder)
            for name in rewritten:
                _rewrite_without(target_ck, name, plan.removals[name], folder)
            _write_index(target_ck, folder, shard, plan)
            for file, doc in plan.config_changes.items():
                write_json_new(folder, file, doc)
            _keep_modes(target_ck.root, folder, [INDEX_FILE, shard, *rewritten, *plan.config_changes])
            report = _check_result(folder, shard, plan.copies, clean)
    except OSError as exc:
        raise OutputError(
            f"could not be written ({exc.strerror or exc})", file=exc.filename or dest, code="output.io"
        ) from None
    return dest, report, rewritten


def _plan(donor: Checkpoint, target: Checkpoint, chosen: list[str], shard: str, replace: bool) -> _Plan:
    reasons: list[str] = []
    reasons += _architecture_reasons(donor, target)
    homes = _module_prefixes(target.tensors)
    removals: dict[str, set[str]] = {}
    copies = []
    for name in chosen:
        ref = donor.tensors[name]
        info = ref.info
        parent = names.split(name)[0]
        if parent not in homes:
            reasons.append(f"{name}: the target has no module {parent} (layer counts or architectures differ?)")
            continue
        if names.is_kv_scale_name(name) and (info.dtype.code != "F32" or info.numel != 1):
            reasons.append(
                f"{name}: a KV-cache scale must be one F32 value; the donor's is {info.dtype.code} {list(info.shape)}"
            )
            continue
        clashes = _clashes(name, target)
        existing = target.tensors.get(name)
        if existing is not None and (existing.info.dtype.code, existing.info.shape) != (info.dtype.code, info.shape):
            reasons.append(
                f"{name}: donor {info.dtype.code} {list(info.shape)} "
                f"but target {existing.info.dtype.code} {list(existing.info.shape)}"
            )
            continue
        if clashes and not replace:
            reasons.append(f"{name}: the target already has {', '.join(clashes)} (pass --replace to overwrite)")
            continue
        for clash in clashes:
            removals.setdefault(target.tensors[clash].shard, set()).add(clash)
        copies.append(CopiedTensor(name, info.dtype.code, list(info.shape), ref.shard, "", clashes))
    _shard_reasons(target, shard, removals, reasons)
    config_changes: dict[str, dict[str, Any]] = {}
    declared: str | None = None
    if any(names.is_kv_scale_name(c.name) for c in copies):
        donor_qc = donor.config.get("quantization_config") or {}
        scheme = donor_qc.get("kv_cache_scheme") if isinstance(donor_qc, dict) else None
        config_changes, declared = _kv_declaration(scheme if isinstance(scheme, dict) else None, target, reasons)
    _refuse(target, reasons)
    return _Plan(copies, removals, config_changes, declared)


def _shard_reasons(target: Checkpoint, shard: str, removals: dict[str, set[str]], reasons: list[str]) -> None:
    """Why the new shard's name cannot be used in the target, if it cannot."""
    if shard in target.headers:
        remaining = set(target.headers[shard].tensors) - removals.get(shard, set())
        if remaining:
            reasons.append(
                f"{shard}: the target already has a shard of this name holding other tensors (choose --shard)"
            )
        removals.setdefault(shard, set())
    elif (target.root / shard).exists():
        reasons.append(f"{shard}: a file of this name exists in the target (choose --shard)")


def _refuse(target: Checkpoint, reasons: list[str]) -> None:
    if reasons:
        shown = "; ".join(reasons[:_MAX_REASONS]) + (
            f"; and {len(reasons) - _MAX_REASONS} more" if len(reasons) > _MAX_REASONS else ""
        )
        raise CheckpointError(f"refused, nothing written: {shown}", file=target.root, code="transplant.refused")


def check_kv_target(target: Checkpoint) -> None:
    """Refuse, before any work, a target that cannot take KV-cache scales (no quantization method to declare them)."""
    reasons: list[str] = []
    _kv_declaration(None, target, reasons)
    _refuse(target, reasons)


@dataclass
class AddResult:
    output: Path
    shard: str
    declared: str | None
    replaced: list[str]
    report: VerifyReport


def add_tensors(
    target: str | Path,
    values: dict[str, np.ndarray],
    metadata: dict[str, str],
    *,
    kv_scheme: dict[str, Any],
    shard: str = DEFAULT_SHARD,
    out: str | Path | None = None,
    replace: bool = False,
    documents: dict[str, dict[str, Any]] | None = None,
    sources: tuple[Path, ...] = (),
) -> AddResult:
    """Add tensors computed here (measured KV-cache scales) to the target as one new shard, as `transplant` does.

    Same staging, index re-resolution, KV-cache declaration (`kv_scheme` for compressed-tensors)
    and verification; `metadata` goes into the new shard's `__metadata__` and `documents` (file
    name -> JSON) are written in place of those files. Tensors the target already has under the
    same name or another spelling of the same KV scale are refused unless `replace`. `out` may not
    lie inside the target or the other `sources` the values were measured on.
    """
    target_ck = Checkpoint.open(target, require_config=False)
    homes = _module_prefixes(target_ck.tensors)
    reasons: list[str] = []
    removals: dict[str, set[str]] = {}
    copies = []
    for name, value in values.items():
        if names.split(name)[0] not in homes:
            reasons.append(f"{name}: the target has no module {names.split(name)[0]}")
            continue
        clashes = _clashes(name, target_ck)
        if clashes and not replace:
            reasons.append(f"{name}: the target already has {', '.join(clashes)}")
            continue
        for clash in clashes:
            removals.setdefault(target_ck.tensors[clash].shard, set()).add(clash)
        digest = hashlib.blake2b(np.ascontiguousarray(value).tobytes(), digest_size=32).hexdigest()
        code = from_numpy(value.dtype).code
        copies.append(CopiedTensor(name, code, list(value.shape), "", digest, clashes))
    _shard_reasons(target_ck, shard, removals, reasons)
    config_changes, declared = _kv_declaration(kv_scheme, target_ck, reasons)
    _refuse(target_ck, reasons)
    config_changes.update(documents or {})
    plan = _Plan(copies, removals, config_changes, declared)

    def write(folder: Path) -> None:
        specs = [TensorSpec(c.name, c.dtype, tuple(c.shape)) for c in copies]
        with ShardWriter(folder, shard, specs, {"format": "pt", **metadata}) as writer:
            for c in copies:
                writer.write(c.name, np.ascontiguousarray(values[c.name]))

    dest, report, _ = _apply(target_ck, out, shard, plan, write, sources=sources, clean=True)
    return AddResult(dest, shard, declared, sorted(n for c in copies for n in c.replaces), report)


def _architecture_reasons(donor: Checkpoint, target: Checkpoint) -> list[str]:
    reasons = []
    for key in ("model_type", "num_hidden_layers"):
        a, b = donor.config.get(key), target.config.get(key)
        if a is not None and b is not None and a != b:
            reasons.append(f"donor {key} is {a} but the target's is {b}")
    return reasons


def _module_prefixes(tensors: Mapping[str, object]) -> set[str]:
    """Every module path in the target, ancestors included (`model`, `model.layers`, ...)."""
    modules = {name.rpartition(".")[0] for name in tensors}
    prefixes = set()
    for module in modules:
        while module and module not in prefixes:
            prefixes.add(module)
            module = module.rpartition(".")[0]
    return prefixes


def _clashes(name: str, target: Checkpoint) -> list[str]:
    """Target tensors the copy would replace: the same name, or the same KV scale spelled otherwise."""
    found = [name] if name in target.tensors else []
    if names.is_kv_scale_name(name):
        for attention in {name.rsplit(".", 2)[0], name.rsplit(".", 1)[0]}:
            for kind in ("k", "v"):
                spellings = names.kv_scale_names(attention, kind)
                if name in spellings:
                    found += [n for n in spellings if n != name and n in target.tensors and n not in found]
    return found


def _kv_declaration(
    scheme: dict[str, Any] | None, target: Checkpoint, reasons: list[str]
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """New contents of the target's config file(s) declaring a KV-cache scheme, if it declares none.

    `scheme` is the compressed-tensors `kv_cache_scheme` to declare (None: the short FP8 form).
    """
    hf_quant = _optional_json(target.root / HF_QUANT_CONFIG_FILE)
    decl = read_declaration(target.config, hf_quant)
    if decl is not None and decl.kv_cache is not None:
        return {}, None
    if decl is None:
        reasons.append(
            "the target declares no quantization method, and runtimes only load KV-cache scales through one "
            "(compressed-tensors kv_cache_scheme or ModelOpt kv_cache_quant_algo); quantize it first"
        )
        return {}, None
    config = copy.deepcopy(target.config)
    qc = config.get("quantization_config")
    if decl.method == ct.QUANT_METHOD:
        assert isinstance(qc, dict)  # a compressed-tensors method is declared there
        qc["kv_cache_scheme"] = copy.deepcopy(scheme) if scheme is not None else dict(CT_FP8_KV_SCHEME)
        return {CONFIG_FILE: config}, f"{CONFIG_FILE} quantization_config.kv_cache_scheme"
    if decl.method == MODELOPT:
        changes, where = {}, []
        if isinstance(hf_quant, dict) and isinstance(hf_quant.get("quantization"), dict):
            hf_quant = copy.deepcopy(hf_quant)
            hf_quant["quantization"]["kv_cache_quant_algo"] = "FP8"
            changes[HF_QUANT_CONFIG_FILE] = hf_quant
            where.append(f"{HF_QUANT_CONFIG_FILE} quantization.kv_cache_quant_algo")
        if isinstance(qc, dict) and qc.get("quant_method") == MODELOPT:
            qc["kv_cache_scheme"] = dict(MODELOPT_FP8_KV_SCHEME)
            changes[CONFIG_FILE] = config
            where.append(f"{CONFIG_FILE} quantization_config.kv_cache_scheme")
        return changes, " and ".join(where)
    reasons.append(f"the target's quant_method {decl.method!r} has no KV-cache scheme this tool knows how to declare")
    return {}, None


def _optional_json(path: Path) -> dict[str, Any] | None:
    return read_json(path, path.name) if path.exists() else None


def _link_tree(src: Path, dst: Path, skip: set[str], absolute_links: bool) -> None:
    """Mirror `src` into `dst` without copying data: hard links for files, the same symlinks.

    Relative paths in `skip` are left out (they are written fresh: a link to them would let the
    writer reach the target's own file). Where a hard link is refused (another filesystem,
    protected links) the file is copied; nothing is opened that is not a regular file.
    """
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        entries = [*dirnames, *filenames]
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink() and (rel / d).as_posix() not in skip]
        for entry in entries:
            if (rel / entry).as_posix() in skip:
                continue
            source, target = Path(dirpath) / entry, dst / rel / entry
            if source.is_symlink():
                link = os.path.realpath(source) if absolute_links else os.readlink(source)
                os.symlink(link, target)
            elif source.is_dir():
                target.mkdir()
            else:
                try:
                    os.link(source, target)
                except OSError:
                    copy_new(source, dst, (rel / entry).as_posix())


def _keep_modes(root: Path, folder: Path, names: list[str]) -> None:
    """Give each file written anew in `folder` the permission bits its namesake in `root` had, so that a
    config.json kept private (600) stays private once transplant rewrote it."""
    for name in names:
        try:
            st = os.lstat(root / name)
        except OSError:
            continue  # new in this output
        if stat.S_ISREG(st.st_mode) and os.path.lexists(folder / name) and not (folder / name).is_symlink():
            os.chmod(folder / name, stat.S_IMODE(st.st_mode))


def _write_new_shard(donor: Checkpoint, folder: Path, shard: str, copies: list[CopiedTensor]) -> None:
    specs = [TensorSpec(c.name, c.dtype, tuple(c.shape)) for c in copies]
    buffer = np.empty(CHUNK_BYTES, dtype=np.uint8)
    readers: dict[str, ShardReader] = {}
    try:
        # Two passes: the hashes go into the header, which the writer lays down before any data.
        for c in copies:
            if c.donor_shard not in readers:
                readers[c.donor_shard] = ShardReader(donor.path(c.donor_shard), donor.headers[c.donor_shard])
            digest = hashlib.blake2b(digest_size=32)
            for chunk in chunks(readers[c.donor_shard], donor.tensors[c.name].info, buffer):
                digest.update(chunk.data)
            c.blake2b = digest.hexdigest()
        metadata = {
            "format": "pt",
            "transplant.tool": f"weightsmith {__version__}",
            "transplant.donor": str(donor.root.resolve()),
            "transplant.hash": HASH,
            "transplant.tensors": json.dumps(
                {c.name: {"donor_shard": c.donor_shard, HASH: c.blake2b} for c in copies}, sort_keys=True
            ),
        }
        with ShardWriter(folder, shard, specs, metadata) as writer:
            for c in copies:
                info = donor.tensors[c.name].info
                start = 0
                for chunk in chunks(readers[c.donor_shard], info, buffer):
                    writer.write(c.name, chunk, start)
                    start += len(chunk)
    finally:
        for reader in readers.values():
            reader.close()


def _rewrite_without(target: Checkpoint, shard: str, dropped: set[str], folder: Path) -> None:
    header = target.headers[shard]
    kept = [info for name, info in header.tensors.items() if name not in dropped]
    if not kept:
        return
    specs = [TensorSpec(i.name, i.dtype.code, i.shape) for i in kept]
    with (
        ShardReader(target.path(shard), header) as reader,
        ShardWriter(folder, shard, specs, header.metadata or None) as writer,
    ):
        for info in kept:
            writer.copy(info.name, reader.fd, info.offset, info.nbytes)


def _write_index(target: Checkpoint, folder: Path, shard: str, plan: _Plan) -> None:
    if target.index is not None:
        weight_map = dict(target.index["weight_map"])
        metadata = dict(target.index.get("metadata") or {})
    else:
        weight_map = {name: ref.shard for name, ref in target.tensors.items()}
        metadata = {}
    for dropped in plan.removals.values():
        for name in dropped:
            weight_map.pop(name, None)
    for c in plan.copies:
        weight_map[c.name] = shard
    shards = sorted(set(weight_map.values()))
    fresh = {shard, *plan.removals}
    metadata["total_size"] = sum(
        read_header(folder / s).data_len if s in fresh else target.headers[s].data_len for s in shards
    )
    index = {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}
    write_json_new(folder, INDEX_FILE, index)


def _check_result(folder: Path, shard: str, copies: list[CopiedTensor], clean: bool) -> VerifyReport:
    """Verify the staged checkpoint: its structure must be clean and the copies must hash as recorded.

    Other findings (a layer the selection did not cover, defects the target already had) are
    reported, not fatal: the transplant did not cause them. With `clean` every error is fatal: the
    caller verified the target first (`calibrate-kv`), so any error is one the new tensors made.
    """
    report = verify(folder)
    structural = [fam for fam in FAMILIES if fam.structural]
    broken = [
        f for f in report.findings if f.severity == ERROR and (clean or any(fam.owns(f.check) for fam in structural))
    ]
    if broken:
        raise OutputError(
            f"the staged result failed verification ({broken[0].line()}); nothing was replaced",
            file=folder,
            code="output.verify",
        )
    with ShardReader(folder / shard) as reader:
        buffer = np.empty(CHUNK_BYTES, dtype=np.uint8)
        for c in copies:
            digest = hashlib.blake2b(digest_size=32)
            for chunk in chunks(reader, reader.info(c.name), buffer):
                digest.update(chunk.data)
            if digest.hexdigest() != c.blake2b:
                raise OutputError(
                    f"the copy of {c.name} does not hash like the donor's; nothing was replaced",
                    file=folder,
                    code="output.verify",
                )
    return report
