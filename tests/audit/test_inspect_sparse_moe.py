"""`inspect` on synthetic sparse MoE checkpoints built by benchmarks/inspect_speed.py.

The accounting is checked against sums computed here from the generator's own tensor list, so
every byte and parameter is accounted for exactly. A full-size (200+ GB) run is included where the
filesystem makes sparse files, since it costs only a few seconds and a few MB of disk.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from weightsmith.audit.inspect import BY_CATEGORY, BY_DTYPE, BY_LAYER, inspect
from weightsmith.safetensors.reader import ShardReader

_BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
sys.path.append(str(_BENCHMARKS))  # the benchmark imports its neighbour `common`
_SPEC = importlib.util.spec_from_file_location("inspect_speed", _BENCHMARKS / "inspect_speed.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("inspect_speed", bench)  # dataclasses look their module up while it executes
_SPEC.loader.exec_module(bench)

SMALL = bench.MoeShape(
    layers=4, experts=16, hidden=256, moe_intermediate=128, shared_intermediate=128, dense_intermediate=512,
    heads=4, kv_heads=2, head_dim=64, vocab=1000,
)  # fmt: skip


def all_specs(shape) -> list:
    return [s for i in range(shape.layers) for s in bench.layer_specs(shape, i)] + bench.outer_specs(shape)


def logical(spec) -> int:
    """Parameters a tensor holds: two FP4 values per packed byte, none for scales."""
    name = spec.name
    if name.endswith(("weight_scale", "weight_global_scale", "k_scale", "v_scale")):
        return 0
    return math.prod(spec.shape) * (2 if name.endswith("weight_packed") else 1)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bench.build_checkpoint(tmp_path_factory.mktemp("moe") / "small", SMALL)


def test_totals_and_headline(small: Path) -> None:
    specs = all_specs(SMALL)
    report = inspect(small)
    total_bytes = sum(s.nbytes for s in specs)
    params = sum(logical(s) for s in specs)
    assert (report.shards, report.tensors) == (SMALL.layers + 1, len(specs))
    assert (report.tensor_bytes, report.params) == (total_bytes, params)
    assert report.bits_per_param == pytest.approx(total_bytes * 8 / params)
    assert sum(m.bits_per_param for m in report.makeup) == pytest.approx(report.bits_per_param)


def test_routed_experts_are_nvfp4(small: Path) -> None:
    rows = {r.key: r for r in inspect(small, BY_CATEGORY).rows}
    experts = rows["routed experts"]
    h, i, e, sparse = SMALL.hidden, SMALL.moe_intermediate, SMALL.experts, SMALL.layers - 1
    assert experts.params == sparse * e * 3 * h * i
    assert experts.bits_per_param == 4.0
    scale_bytes = sparse * e * 3 * (h * i // 16 + 4)  # FP8 block scales plus one F32 global scale
    assert experts.bits_with_overhead == pytest.approx((experts.weight_bytes + scale_bytes) * 8 / experts.params)
    assert rows["attention"].bits_per_param == rows["embeddings"].bits_per_param == 16.0
    assert rows["kv scales"].params == 0 and rows["kv scales"].bytes == SMALL.layers * 2 * 4
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)


def test_views_agree(small: Path) -> None:
    totals = {by: sum(r.bytes for r in inspect(small, by).rows) for by in (BY_CATEGORY, BY_DTYPE, BY_LAYER)}
    assert len(set(totals.values())) == 1
    by_dtype = {r.key: r for r in inspect(small, BY_DTYPE).rows}
    assert by_dtype["U8"].bits_per_param == 4.0 and by_dtype["F8_E4M3"].params == 0
    layers = [r.key for r in inspect(small, BY_LAYER).rows]
    assert layers == [f"layer {i}" for i in range(SMALL.layers)] + ["outside layers"]


def test_coverage(small: Path) -> None:
    statuses = {g.status: g.modules for g in inspect(small).quantization.statuses}
    sparse = SMALL.layers - 1
    assert statuses == {
        "quantized": sparse * (SMALL.experts + 1) * 3 + 3,
        "ignored, kept dense": SMALL.layers * 5 + sparse + 1,  # q/k/v/o/g_proj, routers, lm_head
    }


def test_reads_headers_only(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("inspect read tensor data")

    monkeypatch.setattr(ShardReader, "read_bytes_into", refuse)
    monkeypatch.setattr(os, "preadv", refuse)
    assert inspect(small).tensors > 0


def test_int4_without_bits_in_config_reads_weight_shape(tmp_path: Path) -> None:
    from doctor_builders import tiny_moe, write

    model = tiny_moe("int4")
    del model.qc["config_groups"]["group_0"]["weights"]["num_bits"]
    report = inspect(write(model, tmp_path / "i4"))
    experts = next(r for r in report.rows if r.key == "routed experts")
    assert experts.bits_per_param == 4.0
    assert any("weight_shape" in note for note in report.notes)


def _sparse_files_supported(folder: Path) -> bool:
    probe = folder / "probe"
    with open(probe, "wb") as f:
        f.truncate(1 << 30)
    sparse = os.stat(probe).st_blocks * 512 < (1 << 20)
    probe.unlink()
    return sparse


def test_full_size_checkpoint(tmp_path: Path) -> None:
    """48 layers, 256 experts: 200+ GB of sparse shards, accounted from headers alone."""
    if not _sparse_files_supported(tmp_path):
        pytest.skip("this filesystem does not make sparse files")
    root = bench.build_checkpoint(tmp_path / "big")
    try:
        report = inspect(root)
    finally:
        shutil.rmtree(root)  # 25 MB on disk, but 223 GB to tools that read apparent sizes
    specs = all_specs(bench.MoeShape())
    assert report.file_bytes > 200e9 and report.tensor_bytes == sum(s.nbytes for s in specs)
    assert report.tensors == len(specs) and report.shards == 49
    assert report.bits_per_param == pytest.approx(sum(s.nbytes for s in specs) * 8 / sum(logical(s) for s in specs))
    assert np.isclose(next(r for r in report.rows if r.key == "routed experts").bits_with_overhead, 4.5, atol=1e-3)
