"""The calibration statistics file: round trip, provenance, and refusals of a hostile file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from tests.synth import llama_tensors, write_checkpoint

from weightsmith.calibration import stats_file
from weightsmith.core.errors import CheckpointError, OutputError
from weightsmith.io import provenance, textchunks
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.safetensors.writer import ShardWriter, TensorSpec


def _stats(fp: str = "sha256:" + "0" * 64) -> stats_file.CalibrationStats:
    prov = provenance.Provenance(fp, 8192, 4, 2048, "builtin:code", "ab" * 32, "original")
    return stats_file.CalibrationStats(
        prov,
        kv={"model.layers.0.self_attn": (3.5, 0.25)},
        inputs={"model.layers.0.self_attn.q_proj": 12.0, "model.layers.0.mlp.down_proj": 80.5},
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "stats.safetensors"
    stats_file.write(path, _stats())
    back = stats_file.read(path)
    assert back == _stats()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.safetensors"]


def test_the_text_chunks_round_trip_and_older_files_lack_them(tmp_path: Path) -> None:
    """What `eval` compares its text with travels in the file, and from it into a manifest."""
    stats = _stats()
    stats.provenance = dataclasses.replace(stats.provenance, text_chunks=textchunks.record("def f():\n    pass\n"))
    stats_file.write(tmp_path / "new.safetensors", stats)
    assert stats_file.read(tmp_path / "new.safetensors").provenance.text_chunks == stats.provenance.text_chunks
    stats_file.write(tmp_path / "old.safetensors", _stats())
    assert stats_file.read(tmp_path / "old.safetensors").provenance.text_chunks is None


def test_existing_file_is_refused_unless_replaced(tmp_path: Path) -> None:
    """Replaced only when asked, and only a statistics file: anything else may be a model's weights."""
    path = tmp_path / "stats.safetensors"
    path.write_bytes(b"mine")
    with pytest.raises(OutputError, match="already exists"):
        stats_file.write(path, _stats())
    with pytest.raises(OutputError, match="not a weightsmith statistics file"):
        stats_file.write(path, _stats(), replace=True)
    assert path.read_bytes() == b"mine"
    path.unlink()
    stats_file.write(path, _stats())
    stats_file.write(path, _stats(), replace=True)
    assert stats_file.read(path).inputs["model.layers.0.mlp.down_proj"] == 80.5


def _raw(tmp_path: Path, values: dict[str, np.ndarray], meta: dict[str, str]) -> Path:
    specs = [TensorSpec(n, "F32", a.shape) for n, a in values.items()]
    with ShardWriter(tmp_path, "bad.safetensors", specs, meta) as w:
        for n, a in values.items():
            w.write(n, a.astype(np.float32))
    return tmp_path / "bad.safetensors"


def _meta(**over: str) -> dict[str, str]:
    record = provenance.Provenance("sha256:x", 1, 1, 1, "t", "h", "original").__dict__.items()
    base = {k: str(v) for k, v in record if v is not None}  # as `stats_file.write` leaves absent fields out
    return {"format": stats_file.FORMAT, **base, **over}


@pytest.mark.parametrize(
    ("values", "meta", "code"),
    [
        ({"a.input_absmax": np.array(1.0)}, {"format": "other"}, "calibration.format"),
        ({"a.input_absmax": np.array(np.nan)}, _meta(), "calibration.value"),
        ({"a.input_absmax": np.array(-1.0)}, _meta(), "calibration.value"),
        ({"a.weight": np.array(1.0)}, _meta(), "calibration.name"),
        ({"../x.input_absmax": np.array(1.0)}, _meta(), "calibration.name"),
        ({"a.input_absmax": np.ones(3)}, _meta(), "calibration.shape"),
        ({"a.key_absmax": np.array(1.0)}, _meta(), "calibration.kv"),
        ({"a.input_absmax": np.array(1.0)}, _meta(tokens="-5"), "calibration.metadata"),
        ({"a.input_absmax": np.array(1.0)}, _meta(activations="guessed"), "calibration.metadata"),
    ],
)
def test_hostile_file_is_one_error(tmp_path: Path, values: dict, meta: dict, code: str) -> None:
    path = _raw(tmp_path, values, meta)
    with pytest.raises(CheckpointError) as err:
        stats_file.read(path)
    assert err.value.code == code
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_fingerprint_tells_models_apart(tmp_path: Path) -> None:
    tensors = llama_tensors(seed=0)
    write_checkpoint(tmp_path / "a", tensors)
    other = llama_tensors(seed=1)
    write_checkpoint(tmp_path / "b", other)
    a, b = Checkpoint.open(tmp_path / "a"), Checkpoint.open(tmp_path / "b")
    assert provenance.fingerprint(a) == provenance.fingerprint(Checkpoint.open(tmp_path / "a"))
    assert provenance.fingerprint(a) != provenance.fingerprint(b)
    stats = _stats(provenance.fingerprint(a))
    stats_file.check_model("s.safetensors", stats, a)
    with pytest.raises(CheckpointError, match="another model"):
        stats_file.check_model("s.safetensors", stats, b)
    json.dumps(stats.provenance.__dict__)
