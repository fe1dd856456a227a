"""`diff`: byte identity by streamed hash, error magnitudes where dtypes compare, one-side tensors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from doctor_builders import cli, halves, tiny_moe, write

from weightsmith.audit import diff as diff_module
from weightsmith.audit.diff import DIFFERS, IDENTICAL, ONLY_A, ONLY_B, RETYPED, diff
from weightsmith.core.errors import CheckpointError

Q = "model.layers.1.self_attn.q_proj.weight"
PACKED = "model.layers.1.mlp.experts.0.up_proj.weight_packed"


def pair(tmp: Path, change) -> tuple[Path, Path, dict, dict]:
    a_model = tiny_moe()
    b_model = tiny_moe()
    b_model.shard_of = halves  # a different layout must not matter
    change(b_model)
    return write(a_model, tmp / "a"), write(b_model, tmp / "b"), a_model.tensors, b_model.tensors


def test_identical_across_layouts(tmp_path: Path) -> None:
    a, b, ta, _ = pair(tmp_path, lambda m: None)
    report = diff(a, b)
    assert report.same and report.identical == len(ta)
    t = next(t for t in report.tensors if t.name == Q)
    assert t.blake2b_a == t.blake2b_b == hashlib.blake2b(ta[Q].tobytes(), digest_size=32).hexdigest()
    assert report.summary.startswith(f"diff: {len(ta):,} tensors: {len(ta):,} identical, 0 differ")


def test_errors_where_floats_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diff_module, "CHUNK_BYTES", 1000)  # many chunks per tensor, uneven tail

    def change(m) -> None:
        m.tensors[Q] = (m.tensors[Q].astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)
        m.tensors[PACKED] = m.tensors[PACKED] ^ np.uint8(1)
        m.tensors["model.layers.0.self_attn.k_norm.weight"] = m.tensors[
            "model.layers.0.self_attn.k_norm.weight"
        ].astype(np.float32)
        m.tensors["model.extra.weight"] = np.zeros(3, np.float32)
        del m.tensors["lm_head.weight"]

    a, b, ta, tb = pair(tmp_path, change)
    report = diff(a, b)
    by_name = {t.name: t for t in report.tensors}
    q = by_name[Q]
    x, y = ta[Q].astype(np.float64), tb[Q].astype(np.float64)
    assert q.status == DIFFERS
    assert q.max_abs_error == pytest.approx(np.max(np.abs(x - y)))
    assert q.relative_error == pytest.approx(np.linalg.norm(x - y) / np.linalg.norm(x))
    packed = by_name[PACKED]
    assert packed.status == DIFFERS and packed.max_abs_error is None  # packed codes have no magnitude
    norm = by_name["model.layers.0.self_attn.k_norm.weight"]
    assert norm.status == RETYPED and norm.max_abs_error == 0.0 and "BF16 [16] -> F32 [16]" in norm.detail
    assert by_name["model.extra.weight"].status == ONLY_B and by_name["lm_head.weight"].status == ONLY_A
    assert (report.differ, report.only_a, report.only_b) == (3, 1, 1)
    assert report.identical == len(ta) - 4 and all(
        t.status == IDENTICAL
        for t in report.tensors
        if t.name not in {Q, PACKED, "model.layers.0.self_attn.k_norm.weight", "model.extra.weight", "lm_head.weight"}
    )
    assert "largest relative error" in report.summary


def test_cli_exit_status_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, _, _ = pair(tmp_path, lambda m: m.tensors.pop("lm_head.weight"))
    assert cli(["diff", str(a), str(a)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("diff: 139 tensors: 139 identical")
    assert cli(["diff", str(a), str(b), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["only_a"], doc["differ"], doc["identical"]) == (1, 0, 138)
    assert doc["summary"] == "diff: 139 tensors: 138 identical, 0 differ, 1 only in A, 0 only in B"


def test_unreadable_side_is_one_clear_error(tmp_path: Path) -> None:
    a, b, _, _ = pair(tmp_path, lambda m: None)
    shard = next(b.glob("model-0000*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(CheckpointError, match=r"cannot be compared: .*is truncated"):
        diff(a, b)
