"""Transplanting KV-cache scales between checkpoints with different shard layouts.

The round trip: a donor with calibrated scales, one shard per layer; a target of the same model
without scales or a declared scheme, split into two shards by name. After the transplant the
target verifies clean, every tensor it had is byte-identical (diff), and the scales are the
donor's, byte for byte, with their hashes recorded in the new shard's metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from doctor_builders import FP8_KV, cli, halves, single, tiny_modelopt, tiny_moe, write

from weightsmith.audit.diff import IDENTICAL, ONLY_B, diff
from weightsmith.audit.findings import INFO, Finding
from weightsmith.audit.transplant import DEFAULT_SHARD, transplant
from weightsmith.audit.verify import VerifyReport, verify
from weightsmith.core.errors import CheckpointError
from weightsmith.safetensors.header import read_header
from weightsmith.safetensors.reader import ShardReader


def problems(report: VerifyReport) -> list[Finding]:
    """Errors and warnings: the architecture family's note on what it did not check (info) left out."""
    return [f for f in report.findings if f.severity != INFO]


KV = r"re:.*\.(k|v)_scale$"


def donor_and_target(tmp: Path, target_layout=halves, **target_args) -> tuple[Path, Path]:
    donor = write(tiny_moe(kv_scales=True, seed=1), tmp / "donor")
    model = tiny_moe(kv_scales=False, seed=2, **target_args)
    model.shard_of = target_layout
    return donor, write(model, tmp / "target", index=target_layout is not single)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_round_trip_in_place(tmp_path: Path) -> None:
    donor, target = donor_and_target(tmp_path)
    before = tmp_path / "before"
    shutil.copytree(target, before)
    assert problems(verify(target)) == []  # no scales and no KV scheme: consistent, just uncalibrated
    donor_before = snapshot(donor)

    assert cli(["transplant", str(donor), str(target), "--select", KV]) == 0

    report = verify(target, scan=True)
    assert report.clean and problems(report) == [], [f.line() for f in report.findings]
    config = json.loads((target / "config.json").read_text())
    assert config["quantization_config"]["kv_cache_scheme"] == FP8_KV

    changes = diff(before, target)
    scales = {f"model.layers.{i}.self_attn.{k}_scale" for i in range(3) for k in "kv"}
    assert {t.name for t in changes.tensors if t.status == ONLY_B} == scales
    assert changes.only_a == 0 and changes.differ == 0
    assert all(t.status == IDENTICAL for t in changes.tensors if t.name not in scales)

    against_donor = {t.name: t for t in diff(donor, target).tensors}
    assert all(against_donor[n].status == IDENTICAL for n in scales)
    assert snapshot(donor) == donor_before, "the donor was written to"

    new_shard = read_header(target / DEFAULT_SHARD)
    recorded = json.loads(new_shard.metadata["transplant.tensors"])
    assert new_shard.metadata["transplant.donor"] == str(donor.resolve())
    with ShardReader(target / DEFAULT_SHARD) as reader:
        for name in scales:
            assert (
                recorded[name]["blake2b-256"]
                == hashlib.blake2b(reader.read(name).tobytes(), digest_size=32).hexdigest()
            )
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert all(index["weight_map"][n] == DEFAULT_SHARD for n in scales)
    assert not list(tmp_path.glob("*.partial-*")) and not list(tmp_path.glob("*.replaced-*"))


def test_out_leaves_the_target_untouched(tmp_path: Path) -> None:
    donor, target = donor_and_target(tmp_path, target_layout=single)
    untouched = snapshot(target)
    result = transplant(donor, target, [KV], out=tmp_path / "out", shard="model-kv.safetensors")
    assert snapshot(target) == untouched
    assert result.verify_errors == 0 and len(result.tensors) == 6
    out = tmp_path / "out"
    assert verify(out).clean
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model-kv.safetensors", "model.safetensors"]
    changes = diff(target, out)
    assert changes.identical == len(read_header(target / "model.safetensors").tensors) and changes.only_b == 6


def test_refusals_write_nothing(tmp_path: Path) -> None:
    donor, target = donor_and_target(tmp_path, layers=2)
    untouched = snapshot(target)
    with pytest.raises(CheckpointError, match="num_hidden_layers is 3 but the target's is 2") as exc:
        transplant(donor, target, [KV])
    assert "no module model.layers.2.self_attn" in str(exc.value) and "nothing written" in str(exc.value)
    with pytest.raises(CheckpointError, match="has no tensor matching"):
        transplant(donor, target, ["re:.*\\.nothing$"])
    assert snapshot(target) == untouched
    assert cli(["transplant", str(donor), str(target), "--select", KV]) == 2


def test_existing_tensors_need_replace(tmp_path: Path) -> None:
    donor = write(tiny_moe(kv_scales=True, seed=1), tmp_path / "donor")
    target = write(tiny_moe(kv_scales=True, seed=2), tmp_path / "target")
    with pytest.raises(CheckpointError, match=r"already has model\.layers\.0\.self_attn\.k_scale \(pass --replace"):
        transplant(donor, target, [KV])
    before = tmp_path / "before"
    shutil.copytree(target, before)
    result = transplant(donor, target, [KV], replace=True)
    assert sorted(result.rewritten_shards) == [
        "model-layer00.safetensors",
        "model-layer01.safetensors",
        "model-layer02.safetensors",
    ]
    assert verify(target).clean
    changes = diff(before, target)
    assert changes.differ == 6 and changes.only_a == changes.only_b == 0
    against_donor = {t.name: t.status for t in diff(donor, target).tensors}
    assert all(against_donor[f"model.layers.{i}.self_attn.{k}_scale"] == IDENTICAL for i in range(3) for k in "kv")


def test_a_scale_under_another_name_is_a_clash(tmp_path: Path) -> None:
    donor = write(tiny_moe(kv_scales=True, seed=1), tmp_path / "donor")
    model = tiny_moe(kv_scales=True, seed=2)
    for i in range(3):
        a = f"model.layers.{i}.self_attn"
        model.tensors[f"{a}.k_proj.k_scale"] = model.tensors.pop(f"{a}.k_scale")
    target = write(model, tmp_path / "target")
    with pytest.raises(CheckpointError, match=r"already has model\.layers\.0\.self_attn\.k_proj\.k_scale"):
        transplant(donor, target, [r"re:.*\.k_scale$"])
    transplant(donor, target, [r"re:.*self_attn\.k_scale$"], replace=True)
    report = verify(target)
    assert report.clean, [f.line() for f in report.findings]
    names = set(json.loads((target / "model.safetensors.index.json").read_text())["weight_map"])
    assert "model.layers.0.self_attn.k_scale" in names and "model.layers.0.self_attn.k_proj.k_scale" not in names


def test_kv_scales_must_be_f32_scalars(tmp_path: Path) -> None:
    model = tiny_moe(kv_scales=True, seed=1)
    model.tensors["model.layers.0.self_attn.k_scale"] = np.array(0.5, ml_dtypes.bfloat16)
    donor = write(model, tmp_path / "donor")
    _, target = donor_and_target(tmp_path / "t")
    with pytest.raises(CheckpointError, match="must be one F32 value; the donor's is BF16"):
        transplant(donor, target, [KV])


def test_unquantized_target_is_refused(tmp_path: Path) -> None:
    donor, _ = donor_and_target(tmp_path)
    model = tiny_moe(kv_scales=False)
    del model.config["quantization_config"]
    target = write(model, tmp_path / "bare")
    with pytest.raises(CheckpointError, match="declares no quantization method"):
        transplant(donor, target, [KV])


def test_modelopt_target_gets_kv_cache_quant_algo(tmp_path: Path) -> None:
    donor = write(tiny_modelopt(kv_scales=True), tmp_path / "donor")
    target = write(tiny_modelopt(kv_scales=False), tmp_path / "target")
    result = transplant(donor, target, [KV])
    assert result.declared == "hf_quant_config.json quantization.kv_cache_quant_algo"
    hf_quant = json.loads((target / "hf_quant_config.json").read_text())
    assert hf_quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    report = verify(target)
    assert report.clean and problems(report) == [], [f.line() for f in report.findings]


def test_symlinked_snapshot_in_place(tmp_path: Path) -> None:
    """A hub-cache-like target: shards are relative links into a blob store; links survive."""
    donor, target = donor_and_target(tmp_path)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    snap = tmp_path / "snapshots" / "rev"
    snap.mkdir(parents=True)
    for p in sorted(target.iterdir()):
        shutil.copy(p, blobs / p.name)
        os.symlink(os.path.join("..", "..", "blobs", p.name), snap / p.name)
    transplant(donor, snap, [KV])
    assert verify(snap).clean
    assert (snap / "config.json").is_file() and not (snap / "config.json").is_symlink()
    shard = next(p for p in snap.iterdir() if p.name.startswith("model-0000"))
    assert shard.is_symlink() and os.readlink(shard).startswith("..")
    assert json.loads((blobs / "config.json").read_text())["quantization_config"]["kv_cache_scheme"] is None
