"""A checkpoint folder: its config, its index, its shards and where every tensor lives.

Opening a checkpoint reads the config, the index and every shard header, never tensor data, and
checks that they agree: each index entry resolves to a tensor in the named shard, each shard
tensor is listed in the index under that shard, and no tensor lives in two places. Shards may be
symlinks into a blob store, as in a hub cache snapshot; they are read through the links. The
index is a stranger's text: its shard names must be relative names inside the folder
(`shard_problem`) before any of them is opened, and each must be a regular file.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightsmith.core.errors import CheckpointError, HeaderError
from weightsmith.core.files import (
    MAX_JSON_BYTES,
    NotRegularFile,
    TooLarge,
    exists,
    kind,
    name_problem,
    open_regular,
    outside,
    read_regular,
)
from weightsmith.core.lfs import parse_pointer, pointer_message
from weightsmith.core.terminal import short_repr
from weightsmith.safetensors.header import MAX_TENSORS, Header, TensorInfo, read_header

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SHARD_SUFFIX = ".safetensors"
#: The shard `transplant` and `calibrate-kv` add to a checkpoint (KV-cache scales, usually).
DEFAULT_SHARD = "model-kvscales.safetensors"

#: Index problems that do not stop a reader from finding every tensor.
TOLERABLE_INDEX_CODES = frozenset({"index.total-size"})


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives: its shard's file name (relative to the root) and its header entry."""

    shard: str
    info: TensorInfo


def read_json(path: Path, what: str | None = None, *, unique_keys: bool = False, finite: bool = True) -> dict[str, Any]:
    """A JSON object file, with every way it can be wrong reported as one line.

    Only a regular file of at most `MAX_JSON_BYTES` is read: its size is a stranger's to choose.

    `what` names a file every checkpoint needs (config.json, the index), for the missing-file line.
    `unique_keys` refuses a key given twice in one object: in an index that is one tensor listed
    under two shards, which JSON readers settle silently by keeping the last.
    `finite` refuses NaN, Infinity and numbers beyond a float's range (`1e400`): Python's reader
    accepts them, JSON does not, and a config holding one would be copied on as if it were valid.
    A reader with its own wording for them (the manifest's) passes False.
    """
    try:
        data = read_regular(path, MAX_JSON_BYTES)
    except FileNotFoundError:
        why = f"does not exist (every checkpoint needs its {what})" if what else "does not exist"
        raise CheckpointError(why, file=path, code="file.missing") from None
    except NotRegularFile as exc:
        raise CheckpointError(exc.strerror or str(exc), file=path, code="file.not-regular") from None
    except TooLarge as exc:
        raise CheckpointError(f"{exc.strerror}, the cap on a JSON file", file=path, code="file.too-large") from None
    except OSError as exc:
        raise CheckpointError(f"cannot be read ({exc.strerror})", file=path, code="file.unreadable") from None
    pointer = parse_pointer(data)
    if pointer is not None:
        raise CheckpointError(pointer_message(pointer), file=path, code="lfs-pointer")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError("cannot be read (not UTF-8)", file=path, code="file.unreadable") from None
    duplicates: list[tuple[dict[str, Any], str, object, object]] = []
    not_finite: list[str] = []  # each NaN, Infinity or out-of-range number, as written

    def number(written: str) -> float:
        value = float(written)
        if not math.isfinite(value):
            not_finite.append(written)
        return value

    try:
        doc = json.loads(
            text,
            object_pairs_hook=_recording_duplicates(duplicates) if unique_keys else None,
            parse_float=number,
            parse_constant=number,
        )
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"is not valid JSON ({exc.msg}, line {exc.lineno})", file=path, code="json.invalid"
        ) from None
    except RecursionError:
        raise CheckpointError("is JSON nested too deeply to read", file=path, code="json.invalid") from None
    except ValueError:  # the only other thing json.loads raises: an integer longer than Python will convert
        raise CheckpointError(
            "is not valid JSON (an integer of more than 4300 digits)", file=path, code="json.invalid"
        ) from None
    if not isinstance(doc, dict):
        raise CheckpointError("is not a JSON object", file=path, code="json.invalid")
    if duplicates:
        raise _duplicate_key_error(path, doc, duplicates)
    if finite and not_finite:
        raise CheckpointError(
            f"holds {short_repr(not_finite[0], 40)} at {_first_non_finite(doc)}, not a finite number "
            "(JSON has no NaN or Infinity); write the real value",
            file=path,
            code="json.non-finite",
        )
    return doc


def _first_non_finite(doc: dict[str, Any]) -> str:
    """Where the first non-finite float in a parsed document lies, as `a.b[2].c`."""
    stack: list[tuple[str, object]] = [("", doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "the top level"
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, child in reversed(list(children)):
            stack.append(
                (f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key), child)
            )
    return "the top level"


#: The files whose `auto_map` makes transformers import Python files shipped in the checkpoint's folder.
REMOTE_CODE_FILES = (CONFIG_FILE, "tokenizer_config.json")


def refuse_remote_code(folder: Path, trusted: bool) -> None:
    """Refuse a checkpoint whose config or tokenizer config names its own code, unless `trusted`.

    transformers imports the modules an `auto_map` names from the folder, running whatever they
    hold; left to decide (trust_remote_code unset) it asks `[y/N]` on stdin and runs it on `y`.
    So every load through transformers passes trust_remote_code explicitly and calls this first:
    without `--trust-remote-code` nothing from the checkpoint runs and nothing asks, and the line
    names the file and the key. A tokenizer config is optional; config.json is not.
    """
    if trusted:
        return
    for name in REMOTE_CODE_FILES:
        path = Path(folder) / name
        if name != CONFIG_FILE and not exists(path):
            continue
        if read_json(path, name).get("auto_map"):
            raise CheckpointError(
                "'auto_map' names Python code shipped with the checkpoint, which transformers would run; "
                "pass --trust-remote-code to allow it",
                file=path,
                code="remote-code",
            )


#: The files transformers reads to build a tokenizer: JSON, vocabularies and SentencePiece models.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
)
#: The most bytes one tokenizer file may hold. The largest real ones (a tokenizer.json of a 256k-entry
#: vocabulary with its merges) are about 33 MB; four times that leaves room, while a stranger's 2 GB
#: file, which transformers would read and parse whole (4.7 GB held), is refused unread.
MAX_TOKENIZER_BYTES = 128 * 1024 * 1024


def check_tokenizer_files(folder: Path) -> None:
    """Refuse, with one line naming the file, a tokenizer file that is not a regular file or is past
    `MAX_TOKENIZER_BYTES`: checked here, before transformers opens them, since it reads each whole
    with no cap of its own (and would block on a FIFO)."""
    for name in TOKENIZER_FILES:
        path = Path(folder) / name
        if not exists(path):
            continue
        try:
            fd = open_regular(path)
            try:
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        except NotRegularFile as exc:
            raise CheckpointError(exc.strerror or str(exc), file=path, code="file.not-regular") from None
        except OSError as exc:
            raise CheckpointError(f"cannot be read ({exc.strerror})", file=path, code="file.unreadable") from None
        if size > MAX_TOKENIZER_BYTES:
            raise CheckpointError(
                f"is larger than {MAX_TOKENIZER_BYTES:,} bytes, the cap on a tokenizer file",
                file=path,
                code="file.too-large",
            )


def _recording_duplicates(
    found: list[tuple[dict[str, Any], str, object, object]],
) -> Callable[[list[tuple[str, object]]], dict[str, Any]]:
    """A JSON object hook that notes each repeated key (with the object and both values)."""

    def hook(pairs: list[tuple[str, object]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: dict[str, object] = {}
            for key, value in pairs:
                if key in seen:
                    found.append((obj, key, seen[key], value))
                seen.setdefault(key, value)
        return obj

    return hook


def _duplicate_key_error(
    path: Path, doc: dict[str, Any], found: list[tuple[dict[str, Any], str, object, object]]
) -> CheckpointError:
    weight_map = doc.get("weight_map")
    for obj, key, first, second in found:
        if obj is weight_map:
            return CheckpointError(
                f"is listed twice in weight_map, under {short_repr(first, 200)} and {short_repr(second, 200)} "
                "(readers silently keep the last)",
                file=path,
                tensor=key,
                code="index.duplicate-entry",
            )
    _, key, _, _ = found[0]
    return CheckpointError(
        f"has the key {short_repr(key, 200)} twice in one object (readers silently keep the last)",
        file=path,
        code="json.duplicate-key",
    )


def index_shape_problem(index_path: Path, index: dict[str, Any]) -> CheckpointError | None:
    """Why the index is not `{"weight_map": {tensor: shard name}, "metadata": {...}}`, or None."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        return CheckpointError(
            f"has no weight_map of tensor names to shard files (it is {type(weight_map).__name__})",
            file=index_path,
            code="index.invalid",
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            return CheckpointError(
                f"maps to {short_repr(shard, 200)}, not a shard file name",
                file=index_path,
                tensor=name,
                code="index.invalid",
            )
    metadata = index.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return CheckpointError(
            f"metadata is {type(metadata).__name__}, not an object", file=index_path, code="index.invalid"
        )
    return None


def shard_problem(root: Path, name: object) -> str | None:
    """Why `name` cannot be a shard of the folder `root`, or None: the rule every reader and writer applies."""
    why = name_problem(name)
    if why is None and isinstance(name, str):  # name_problem refuses anything but a string
        why = outside(root, name)
    return why


def unsafe_shards(root: Path, index_path: Path, weight_map: dict[str, str]) -> dict[str, CheckpointError]:
    """Shard names of the index that are not files inside `root`, each with its error (naming one entry)."""
    first_tensor: dict[str, str] = {}
    for tensor, shard in weight_map.items():
        first_tensor.setdefault(shard, tensor)  # each name is checked once: a MoE index lists 100k tensors
    problems: dict[str, CheckpointError] = {}
    for shard, tensor in first_tensor.items():
        why = shard_problem(root, shard)
        if why is not None:
            problems[shard] = CheckpointError(
                f"names the shard {short_repr(shard, 200)}, which {why}; "
                "shard names must be relative file names inside the checkpoint folder",
                file=index_path,
                tensor=tensor,
                code="index.unsafe-shard",
            )
    return problems


def index_problems(index_path: Path, index: dict[str, Any], headers: dict[str, Header]) -> list[CheckpointError]:
    """Every way the index and the shard headers disagree, both directions.

    `headers` may lack shards that could not be read: their entries are not resolved, and
    `metadata.total_size` is then only checked for being an integer, not against the sum.
    """
    problems: list[CheckpointError] = []
    weight_map: dict[str, str] = index["weight_map"]
    held: dict[str, str] = {}  # each name -> the first shard that holds it, built without a Python loop
    for holder, holder_header in reversed(headers.items()):
        held.update(dict.fromkeys(holder_header.tensors, holder))
    agree = held == weight_map  # then no entry is missing, unlisted or misplaced: only duplicates are left
    for name, shard in () if agree else weight_map.items():
        header = headers.get(shard)
        if header is not None and name not in header.tensors:
            problems.append(
                CheckpointError(
                    f"is listed in the index under {shard} but that shard lacks it",
                    file=index_path,
                    tensor=name,
                    code="index.missing-tensor",
                )
            )
    problems.extend(duplicate_tensors(headers))
    seen: set[str] = set()
    for shard, header in () if agree else headers.items():
        for name in header.tensors:
            if name in seen:  # a duplicate, reported above
                continue
            seen.add(name)
            listed = weight_map.get(name)
            if listed is None:
                problems.append(
                    CheckpointError(
                        "is in the shard but not in the index (loaders may skip it)",
                        file=header.path,
                        tensor=name,
                        code="index.unlisted-tensor",
                    )
                )
            elif listed != shard:
                problems.append(
                    CheckpointError(
                        f"is in this shard but the index says {listed}",
                        file=header.path,
                        tensor=name,
                        code="index.wrong-shard",
                    )
                )
    metadata = index.get("metadata")
    declared = metadata.get("total_size") if isinstance(metadata, dict) else None
    if declared is None:
        return problems
    if not isinstance(declared, int) or isinstance(declared, bool):
        problems.append(
            CheckpointError(
                f"metadata.total_size is {declared!r}, not an integer byte count",
                file=index_path,
                code="index.total-size",
            )
        )
    elif set(weight_map.values()) <= headers.keys():  # the sum is only known when every shard was read
        actual = sum(h.data_len for h in headers.values())
        if declared != actual:
            problems.append(
                CheckpointError(
                    f"metadata.total_size is {declared:,} but the shards hold {actual:,} bytes of tensor data",
                    file=index_path,
                    code="index.total-size",
                )
            )
    return problems


def duplicate_tensors(headers: dict[str, Header]) -> list[CheckpointError]:
    """Tensors stored in more than one shard, each reported at every shard after the first."""
    problems: list[CheckpointError] = []
    seen: dict[str, str] = {}
    for shard, header in headers.items():
        for name in header.tensors:
            if name in seen:
                problems.append(
                    CheckpointError(
                        f"is stored in both {seen[name]} and {shard}",
                        file=header.path,
                        tensor=name,
                        code="index.duplicate-tensor",
                    )
                )
            else:
                seen[name] = shard
    return problems


class Checkpoint:
    """A validated checkpoint folder. Holds headers only; tensor bytes are read on demand."""

    def __init__(
        self, root: Path, config: dict[str, Any], index: dict[str, Any] | None, headers: dict[str, Header]
    ) -> None:
        self.root = root
        self.config = config
        self.index = index
        self.headers = headers
        self.tensors: dict[str, TensorRef] = {
            name: TensorRef(shard, info) for shard, h in headers.items() for name, info in h.tensors.items()
        }

    @classmethod
    def open(cls, root: str | os.PathLike[str], require_config: bool = True) -> Checkpoint:
        """Open a checkpoint folder, raising `CheckpointError` on the first thing that is wrong."""
        root = Path(root)
        if not root.is_dir():
            what = "does not exist" if not root.exists() else "is not a folder"
            raise CheckpointError(f"{what} (expected a checkpoint folder)", file=root, code="file.missing")
        config = read_json(root / CONFIG_FILE, "config.json") if require_config or (root / CONFIG_FILE).exists() else {}
        index = None
        index_path = root / INDEX_FILE
        if index_path.exists() or index_path.is_symlink():
            index = read_json(index_path, "index", unique_keys=True)
            problem = index_shape_problem(index_path, index)
            if problem is None:
                problem = next(iter(unsafe_shards(root, index_path, index["weight_map"]).values()), None)
            if problem is not None:
                raise problem
            shard_names = sorted(set(index["weight_map"].values()))
        elif (root / SINGLE_FILE).exists() or (root / SINGLE_FILE).is_symlink():
            shard_names = [SINGLE_FILE]
        else:
            shard_names = sorted(p.name for p in root.iterdir() if p.name.endswith(SHARD_SUFFIX))
            if not shard_names:
                raise CheckpointError(
                    f"has no {SINGLE_FILE}, no {INDEX_FILE} and no other .safetensors file",
                    file=root,
                    code="file.missing",
                )

        headers: dict[str, Header] = {}
        budget = MAX_TENSORS  # tensors the shards still to be read may hold, over the whole checkpoint
        for name in shard_names:
            path = root / name
            if not exists(path):
                code = "index.missing-shard" if index is not None else "file.missing"
                why = f"is named in {INDEX_FILE} but does not exist" if index is not None else "does not exist"
                if path.is_symlink():
                    why += f" (a broken link to {os.readlink(path)})"
                raise HeaderError(why, file=path, code=code)
            headers[name] = read_header(path, budget)
            budget -= len(headers[name].tensors)

        if index is not None:
            fatal = [p for p in index_problems(index_path, index, headers) if p.code not in TOLERABLE_INDEX_CODES]
            if fatal:
                raise fatal[0]
        else:
            duplicates = duplicate_tensors(headers)
            if duplicates:
                raise duplicates[0]
        return cls(root, config, index, headers)

    def path(self, shard: str) -> Path:
        """The file of one of this checkpoint's shards.

        Every shard name passed `shard_problem` in `open` (the only way a Checkpoint is made), so it
        is not judged again here: this is called per tensor where plans and errors name a file.
        """
        return self.root / shard

    def file_of(self, tensor: str) -> Path:
        """The file that holds `tensor` (for messages that name where a tensor lives)."""
        return self.path(self.tensors[tensor].shard)

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        qc = self.config.get("quantization_config")
        return qc if isinstance(qc, dict) else None

    @property
    def tensor_bytes(self) -> int:
        return sum(h.data_len for h in self.headers.values())

    @property
    def file_bytes(self) -> int:
        return sum(h.file_size for h in self.headers.values())

    def stray_shards(self) -> list[str]:
        """`.safetensors` files in the folder that are not part of the checkpoint (loaders skip them)."""
        return sorted(
            p.name for p in self.root.iterdir() if p.name.endswith(SHARD_SUFFIX) and p.name not in self.headers
        )

    def other_files(self) -> OtherFiles:
        """Files to carry over unchanged: everything but shards, the index and config.json.

        Hidden entries (a hub cache's `.cache/`, `.git`) and stray `.safetensors` files are left
        out. A link is followed only where it stays inside the folder, or, in a hub cache snapshot,
        leads into the snapshot's blob store: a link elsewhere could carry any file of the machine
        into an output meant for upload. Such links, broken links, loops and anything but regular
        files and folders are skipped, each with the reason.
        """
        real_root = self.root.resolve()
        allowed = [real_root]
        if real_root.parent.name == "snapshots":  # REPO/snapshots/REV links into REPO/blobs
            allowed.append(real_root.parent.parent / "blobs")
        written_fresh = {CONFIG_FILE, INDEX_FILE, *self.headers}
        files: list[Path] = []
        skipped: dict[str, str] = {}
        walked = {_identity(os.stat(real_root))}
        folders = [Path()]
        while folders:
            folder = folders.pop()
            try:
                names = sorted(entry.name for entry in os.scandir(self.root / folder))
            except OSError as exc:
                skipped[folder.as_posix()] = f"cannot be listed ({exc.strerror})"
                continue
            for name in names:
                rel = folder / name
                key = rel.as_posix()
                if name.startswith(".") or key in written_fresh or (folder == Path() and name.endswith(SHARD_SUFFIX)):
                    continue
                path = self.root / rel
                try:
                    if path.is_symlink():
                        real = path.resolve(strict=True)
                        if not any(real == a or a in real.parents for a in allowed):
                            skipped[key] = f"is a link out of the checkpoint folder (to {real}); not followed"
                            continue
                    st = os.stat(path)
                except (OSError, RuntimeError):  # RuntimeError: a link loop
                    skipped[key] = "is a broken link or a link loop"
                    continue
                if stat.S_ISREG(st.st_mode):
                    files.append(rel)
                elif not stat.S_ISDIR(st.st_mode):
                    skipped[key] = f"is {kind(st.st_mode)}, not a regular file"
                elif _identity(st) in walked:
                    skipped[key] = "is a link to a folder already walked (a loop or a repeat)"
                else:
                    walked.add(_identity(st))
                    folders.append(rel)
        return OtherFiles(sorted(files), skipped)


@dataclass(frozen=True)
class OtherFiles:
    """What `Checkpoint.other_files` found: files to copy, and entries skipped (path -> why)."""

    files: list[Path]
    skipped: dict[str, str]


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
