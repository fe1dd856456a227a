"""The index against the shard headers: every problem code `index_problems` reports, and what `open` makes of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from synth import write_checkpoint
from weightsmith.core.errors import CheckpointError
from weightsmith.io.checkpoint import INDEX_FILE, Checkpoint, duplicate_tensors, index_problems
from weightsmith.safetensors.header import Header, read_header

TENSORS = {
    "model.embed_tokens.weight": np.ones((8, 4), np.float32),
    "model.layers.0.mlp.up_proj.weight": np.ones((6, 4), np.float32),
    "model.layers.0.mlp.down_proj.weight": np.ones((4, 6), np.float32),
    "model.norm.weight": np.ones(4, np.float32),
}
FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
TOTAL = sum(a.nbytes for a in TENSORS.values())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = write_checkpoint(tmp_path / "ckpt", TENSORS, shards=2)
    assert _index(root)["weight_map"]["model.embed_tokens.weight"] == FIRST
    assert _index(root)["weight_map"]["model.layers.0.mlp.up_proj.weight"] == SECOND
    return root


def _index(root: Path) -> dict:
    return json.loads((root / INDEX_FILE).read_text())


def _edit_index(root: Path, change: Callable[[dict], object]) -> dict:
    doc = _index(root)
    change(doc)
    (root / INDEX_FILE).write_text(json.dumps(doc))
    return doc


def _headers(root: Path) -> dict[str, Header]:
    return {shard: read_header(root / shard) for shard in (FIRST, SECOND)}


def _problems(root: Path, headers: dict[str, Header] | None = None) -> list[CheckpointError]:
    return index_problems(root / INDEX_FILE, _index(root), _headers(root) if headers is None else headers)


def _codes(problems: list[CheckpointError]) -> set[str]:
    return {p.code for p in problems}


def test_a_consistent_index_has_no_problems(root: Path) -> None:
    assert _problems(root) == []
    assert Checkpoint.open(root).tensor_bytes == TOTAL


def test_missing_tensor(root: Path) -> None:
    _edit_index(root, lambda d: d["weight_map"].update({"model.extra.weight": FIRST}))
    [problem] = _problems(root)
    assert (problem.code, problem.tensor) == ("index.missing-tensor", "model.extra.weight")
    assert problem.file == str(root / INDEX_FILE) and FIRST in problem.message
    with pytest.raises(CheckpointError) as err:
        Checkpoint.open(root)
    assert err.value.code == "index.missing-tensor"


def test_unlisted_tensor(root: Path) -> None:
    _edit_index(root, lambda d: d["weight_map"].pop("model.norm.weight"))
    [problem] = _problems(root)
    assert (problem.code, problem.tensor) == ("index.unlisted-tensor", "model.norm.weight")
    assert problem.file == str(root / SECOND)


def test_wrong_shard(root: Path) -> None:
    _edit_index(root, lambda d: d["weight_map"].update({"model.norm.weight": FIRST}))
    problems = {p.code: p for p in _problems(root)}
    assert set(problems) == {"index.wrong-shard", "index.missing-tensor"}
    assert problems["index.wrong-shard"].tensor == "model.norm.weight"
    assert problems["index.wrong-shard"].file == str(root / SECOND)
    assert FIRST in problems["index.wrong-shard"].message


def test_duplicate_tensor(root: Path) -> None:
    second = {n: TENSORS[n] for n, shard in _index(root)["weight_map"].items() if shard == SECOND}
    save_file({**second, "model.embed_tokens.weight": TENSORS["model.embed_tokens.weight"]}, str(root / SECOND))
    problems = _problems(root)
    assert _codes(problems) == {"index.duplicate-tensor", "index.total-size"}
    duplicate = next(p for p in problems if p.code == "index.duplicate-tensor")
    assert duplicate.tensor == "model.embed_tokens.weight" and duplicate.file == str(root / SECOND)
    assert f"both {FIRST} and {SECOND}" in duplicate.message
    with pytest.raises(CheckpointError) as err:
        Checkpoint.open(root)
    assert err.value.code == "index.duplicate-tensor"


def test_duplicate_tensor_without_an_index(tmp_path: Path) -> None:
    root = tmp_path / "shards"
    root.mkdir()
    (root / "config.json").write_text("{}")
    save_file({"a": np.ones(2, np.float32)}, str(root / "one.safetensors"))
    save_file({"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, str(root / "two.safetensors"))
    headers = {name: read_header(root / name) for name in ("one.safetensors", "two.safetensors")}
    [problem] = duplicate_tensors(headers)
    assert (problem.code, problem.tensor) == ("index.duplicate-tensor", "a")
    with pytest.raises(CheckpointError) as err:
        Checkpoint.open(root)
    assert err.value.code == "index.duplicate-tensor"


def test_total_size_mismatch_is_tolerated_by_open(root: Path) -> None:
    _edit_index(root, lambda d: d["metadata"].update(total_size=12345))
    [problem] = _problems(root)
    assert problem.code == "index.total-size" and problem.file == str(root / INDEX_FILE)
    assert f"12,345 but the shards hold {TOTAL:,} bytes" in problem.message
    assert Checkpoint.open(root).index["metadata"]["total_size"] == 12345


@pytest.mark.parametrize("total", ["12345", str(TOTAL), 12345.0, True, [TOTAL], {"bytes": TOTAL}])
def test_total_size_that_is_not_an_integer(root: Path, total: object) -> None:
    _edit_index(root, lambda d: d["metadata"].update(total_size=total))
    [problem] = _problems(root)
    assert problem.code == "index.total-size" and problem.file == str(root / INDEX_FILE)
    assert problem.message == f"metadata.total_size is {total!r}, not an integer byte count"
    Checkpoint.open(root)  # tolerated, like a wrong total


@pytest.mark.parametrize("change", [lambda d: d.pop("metadata"), lambda d: d.update(metadata={"total_size": None})])
def test_no_total_size_is_no_problem_here(root: Path, change: Callable[[dict], object]) -> None:
    _edit_index(root, change)
    assert _problems(root) == []


def test_total_size_is_only_summed_when_every_shard_was_read(root: Path) -> None:
    only_first = {FIRST: read_header(root / FIRST)}
    assert _problems(root, only_first) == []
    _edit_index(root, lambda d: d["metadata"].update(total_size=12345))
    assert _problems(root, only_first) == []
    _edit_index(root, lambda d: d["metadata"].update(total_size="12345"))
    assert _codes(_problems(root, only_first)) == {"index.total-size"}
