"""The dflash-draft preset's reason, release by release, found in those releases' own files.

`presets.DFLASH_QKV_READS` says where each vLLM release reads a DFlash draft's `qkv_proj.weight`
and which guard it; the plan, the card and preflight quote it. Here preflight's own reader
(`code.weight_reads`) finds those reads in the released 0.25.1 and 0.33.0 wheels and in vLLM's CPU
build 0.32.0 as `make test` installs it: every recorded line is there, and nothing else reads it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import vllm_cpu
from vllm_wheels import vllm_wheel
from weightsmith.preflight import code
from weightsmith.preflight.source import VllmSource
from weightsmith.quantization.presets import DFLASH_QKV_READS, PRESETS, WeightRead

MODELS = "vllm/model_executor/models/"
RELEASES = sorted({r.version for r in DFLASH_QKV_READS})
FILES = sorted({r.file for r in DFLASH_QKV_READS})


def _source(version: str) -> VllmSource:
    if version == vllm_cpu.VERSION:
        return VllmSource.open(vllm_cpu.site_packages())
    return VllmSource.open(vllm_wheel(version))


@pytest.mark.parametrize("version", RELEASES)
def test_every_recorded_read_is_in_the_release_and_none_is_missing(version: str) -> None:
    src = _source(version)
    assert src.version == version
    found = set()
    for file in FILES:
        for read in code.weight_reads(src, MODELS + file):
            if read.module == "qkv_proj":
                guard = read.guard.line if read.guard is not None else None
                found.add(WeightRead(version, file, read.evidence.line, guard))
    assert found == {r for r in DFLASH_QKV_READS if r.version == version}


def test_the_gate_reason_is_the_cpu_kernels_own_line() -> None:
    """CPUWNA16 refuses output sizes that are not multiples of 32, at the line the preset cites."""
    why = PRESETS["dflash-draft"].why
    assert "kernels/linear/mixed_precision/cpu.py:52 in 0.32.0" in why
    lines = (vllm_cpu.site_packages() / "vllm/model_executor/kernels/linear/mixed_precision/cpu.py").read_text()
    assert lines.splitlines()[51].strip() == "if c.partition_weight_shape[1] % 32 != 0:"


def test_the_reason_names_every_release_and_line() -> None:
    why = PRESETS["dflash-draft"].why
    for read in DFLASH_QKV_READS:
        assert read.version in why and f"{read.file}:{read.line}" in why, read
    assert why.index("unguarded") < why.index("0.25.1 (qwen3_dflash.py:421") < why.index("only for an unquantized")


def test_preflight_quotes_the_other_releases_beside_the_one_it_reads(tmp_path: Path) -> None:
    """Against 0.33.0 a Qwen3 DFlash draft's quantized q/k/v are handled (a guard); preflight says so and
    names 0.25.1, which reads them unguarded."""
    import weightsmith as ws
    from models import smollm2_fp32
    from tiny_drafts import qwen3_dflash, target
    from weightsmith.preflight.checks import preflight

    tgt = target(tmp_path / "target", "qwen3", smollm2_fp32())
    draft = qwen3_dflash(tmp_path / "draft", tgt)
    ws.quantize(ws.QuantizeRequest(source=draft, output=tmp_path / "w4a16"))
    found = preflight(tgt, vllm_wheel("0.33.0"), draft=tmp_path / "w4a16", method="dflash")
    (note,) = [i for i in found.items if i.check == "draft.weight-read"]
    assert "guarded" in note.message and "unguarded in vLLM 0.25.1 (qwen3_dflash.py:421" in note.message
    old = preflight(tgt, vllm_wheel("0.25.1"), draft=tmp_path / "w4a16", method="dflash")
    (load,) = [i for i in old.items if i.check == "draft.weight-read"]
    assert load.impact == "will not load" and load.evidence[0].show().startswith("qwen3_dflash.py:421:")
