"""A checkpoint folder: its config, its index, its shards and where every tensor lives.

Opening a checkpoint reads the config, the index and every shard header, never tensor data, and
checks that they agree: each index entry resolves to a tensor in the named shard, each shard
tensor is listed in the index under that shard, and no tensor lives in two places. Shards may be
symlinks into a blob store, as in a hub cache snapshot; they are read through the links.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from weightsmith.errors import CheckpointError, HeaderError
from weightsmith.lfs import pointer_message, read_pointer
from weightsmith.safetensors.header import Header, TensorInfo, read_header

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SHARD_SUFFIX = ".safetensors"

#: Index problems that do not stop a reader from finding every tensor.
TOLERABLE_INDEX_CODES = frozenset({"index.total-size"})


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives: its shard's file name (relative to the root) and its header entry."""

    shard: str
    info: TensorInfo


def read_json(path: Path, what: str | None = None) -> dict:
    """A JSON object file, with LFS pointers and bad JSON reported as one line.

    `what` names a file every checkpoint needs (config.json, the index), for the missing-file line.
    """
    pointer = read_pointer(path)
    if pointer is not None:
        raise CheckpointError(pointer_message(pointer), file=path, code="lfs-pointer")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        why = f"does not exist (every checkpoint needs its {what})" if what else "does not exist"
        raise CheckpointError(why, file=path, code="file.missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise CheckpointError(f"cannot be read ({reason})", file=path, code="file.unreadable") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"is not valid JSON ({exc.msg}, line {exc.lineno})", file=path, code="json.invalid"
        ) from None
    if not isinstance(doc, dict):
        raise CheckpointError("is not a JSON object", file=path, code="json.invalid")
    return doc


def index_problems(index_path: Path, index: dict, headers: dict[str, Header]) -> list[CheckpointError]:
    """Every way the index and the shard headers disagree, both directions.

    `headers` may lack shards that could not be read: their entries are not resolved, and
    `metadata.total_size` is then only checked for being an integer, not against the sum.
    """
    problems: list[CheckpointError] = []
    weight_map: dict[str, str] = index["weight_map"]
    for name, shard in weight_map.items():
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
    for shard, header in headers.items():
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

    def __init__(self, root: Path, config: dict, index: dict | None, headers: dict[str, Header]) -> None:
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
            index = read_json(index_path, "index")
            if not isinstance(index.get("weight_map"), dict) or not all(
                isinstance(v, str) for v in index["weight_map"].values()
            ):
                raise CheckpointError(
                    "has no weight_map of tensor names to shard files", file=index_path, code="index.invalid"
                )
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
        for name in shard_names:
            path = root / name
            if not path.exists():
                code = "index.missing-shard" if index is not None else "file.missing"
                why = f"is named in {INDEX_FILE} but does not exist" if index is not None else "does not exist"
                if path.is_symlink():
                    why += f" (a broken link to {os.readlink(path)})"
                raise HeaderError(why, file=path, code=code)
            headers[name] = read_header(path)

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
        return self.root / shard

    @property
    def quantization_config(self) -> dict | None:
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

    def other_files(self) -> list[Path]:
        """Files to carry over unchanged: everything but shards, the index and config.json.

        Hidden entries (a hub cache's `.cache/`, `.git`) and stray `.safetensors` files are left out.
        """
        skip = {CONFIG_FILE, INDEX_FILE, *self.headers}
        out: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel_dir = Path(dirpath).relative_to(self.root)
            for fn in sorted(filenames):
                rel = rel_dir / fn
                if fn.startswith(".") or (rel_dir == Path(".") and (fn in skip or fn.endswith(SHARD_SUFFIX))):
                    continue
                out.append(rel)
        return out
