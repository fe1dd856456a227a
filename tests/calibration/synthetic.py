"""Statistics files for synthetic checkpoints, without running a model: values chosen by the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from weightsmith.calibration import stats_file
from weightsmith.io import names, provenance, texts
from weightsmith.io.checkpoint import Checkpoint

TOKENS = texts.MIN_TOKENS


def linear_modules(ckpt: Checkpoint) -> list[str]:
    return sorted(names.split(n)[0] for n in ckpt.tensors if n.endswith(".weight") and ("_proj." in n))


def write_stats(
    src: Path,
    out: Path,
    *,
    seed: int = 0,
    drop: tuple[str, ...] = (),
    kv: bool = True,
    fingerprint: str | None = None,
    inputs: dict[str, float] | None = None,
) -> tuple[Path, stats_file.CalibrationStats]:
    """A statistics file for every `*_proj` Linear of `src` and every attention layer, but `drop`."""
    ckpt = Checkpoint.open(src)
    rng = np.random.default_rng(seed)
    modules = linear_modules(ckpt)
    values = {m: float(rng.uniform(0.5, 40.0)) for m in modules if m not in drop}
    values.update(inputs or {})
    attention = sorted({m.rpartition(".")[0] for m in modules if m.endswith("k_proj")})
    maxima = {a: (float(rng.uniform(1, 30)), float(rng.uniform(0.1, 5))) for a in attention if a not in drop}
    prov = provenance.Provenance(
        fingerprint or provenance.fingerprint(ckpt), TOKENS, 4, TOKENS // 4, "test", "0" * 64, "original"
    )
    stats = stats_file.CalibrationStats(prov, maxima if kv else {}, values)
    stats_file.write(out, stats)
    return out, stats
