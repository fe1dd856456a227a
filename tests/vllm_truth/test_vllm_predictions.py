"""What `verify` and `preflight` predict about a damaged checkpoint, checked against vLLM's CPU build itself.

One fp8-dynamic SmolLM2-135M in two shards is the healthy checkpoint; each test plants one defect
in a copy of it, asserts our finding (the real command line), then starts vLLM CPU on the copy and
asserts vLLM's own error line. The healthy checkpoint is what each finding's fix gives back, so one
start of it (shared by the module) shows that every fix serves.

(The folder is not named `vllm`: with tests/ on sys.path, a `vllm` folder here would be what
`importlib.util.find_spec("vllm")` finds, and preflight would read it as an installation.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

import vllm_cpu
from clirun import run
from models import smollm2_fp32
from weightsmith.bench.servers import ServerError
from weightsmith.fidelity.logits import load_tokenizer
from weightsmith.preflight.report import LOAD, WRONG

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


PROMPT = "The capital of France is"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"
#: Layers below this go to the first shard, the rest (and nothing else) to the second.
SPLIT_LAYER = 15


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else None


def write_shards(folder: Path, tensors: dict[str, Any]) -> None:
    """`tensors` as two shards and an index, as a hub checkpoint comes."""
    first = {k: v for k, v in tensors.items() if (layer := _layer(k)) is None or layer < SPLIT_LAYER}
    parts = (first, {k: v for k, v in tensors.items() if k not in first})
    weight_map = {}
    for name, part in zip(SHARDS, parts, strict=True):
        safetensors_torch.save_file(part, folder / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX).write_text(json.dumps(index, indent=2))


def copy_of(src: Path, dst: Path) -> Path:
    """A copy to damage: small files copied, shards hard-linked (a defect replaces or cuts its own shard)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            os.link(f, dst / f.name)
        elif f.is_file():
            shutil.copy(f, dst / f.name)
    return dst


def edit_quant_config(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config["quantization_config"])
    (folder / "config.json").write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """SmolLM2-135M quantized fp8-dynamic by the CLI, then split into two shards with an index."""
    work = tmp_path_factory.mktemp("healthy")
    single = work / "single"
    subprocess.run(
        [sys.executable, "-m", "weightsmith", "quantize", str(smollm2_fp32()), str(single), "--scheme", "fp8-dynamic"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    out = work / "fp8-dynamic-2-shards"
    out.mkdir()
    for f in single.iterdir():
        if f.suffix != ".safetensors" and f.name != "weightsmith.json":
            shutil.copy(f, out / f.name)
    write_shards(out, safetensors_torch.load_file(single / "model.safetensors"))
    shutil.rmtree(single)
    yield out
    shutil.rmtree(work, ignore_errors=True)  # a test run's disk stays bounded by a few checkpoints


@pytest.fixture(scope="module")
def healthy_completion(healthy: Path, tmp_path_factory: pytest.TempPathFactory) -> vllm_cpu.Completion:
    """The healthy checkpoint served (started, one completion, stopped: never two servers at once)."""
    with vllm_cpu.serve(healthy, tmp_path_factory.mktemp("healthy-log")) as s:
        assert s.choices() == [("ChannelWiseTorchFP8ScaledMMLinearKernel", "CompressedTensorsW8A8Fp8")]
        return s.complete(PROMPT, 4)


@pytest.fixture(scope="module")
def vllm_site() -> Path:
    vllm_cpu.require()
    return vllm_cpu.site_packages()


def verify_findings(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, folder: Path) -> list[dict]:
    code, out, _ = run(capsys, monkeypatch, "verify", folder, "--json")
    report = json.loads(out)
    assert code == (0 if report["clean"] else 1)
    return list(report["findings"])


def preflight_items(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, folder: Path, site: Path):
    code, out, _ = run(capsys, monkeypatch, "preflight", folder, "--vllm", site, "--json")
    report = json.loads(out)
    assert code == (0 if report["passed"] else 1)
    return list(report["findings"])


def test_the_healthy_checkpoint_is_clean_and_serves(healthy, healthy_completion, vllm_site, capsys, monkeypatch):
    assert verify_findings(capsys, monkeypatch, healthy) == []
    assert [i["impact"] for i in preflight_items(capsys, monkeypatch, healthy, vllm_site)] == []
    assert load_tokenizer(healthy).decode(healthy_completion.ids) == " Paris.\n\n"


def test_a_shard_the_index_names_is_absent(healthy, healthy_completion, vllm_site, tmp_path, capsys, monkeypatch):
    broken = copy_of(healthy, tmp_path / "missing")
    (broken / SHARDS[1]).unlink()
    [finding] = verify_findings(capsys, monkeypatch, broken)
    assert (finding["check"], finding["file"]) == ("index.missing-shard", SHARDS[1])
    [item] = preflight_items(capsys, monkeypatch, broken, vllm_site)
    assert (item["check"], item["impact"]) == ("checkpoint.damaged", LOAD)

    line = vllm_cpu.refusal(broken, tmp_path / "log")
    assert line == f"FileNotFoundError: Weight files referenced in index but missing: {{'{broken / SHARDS[1]}'}}"
    # The fix ("download it") is the healthy checkpoint, which serves.
    assert len(healthy_completion.ids) == 4


@pytest.mark.e2e  # another vLLM server start; the absent-shard case holds the same prediction
def test_a_truncated_shard(healthy, healthy_completion, vllm_site, tmp_path, capsys, monkeypatch):
    broken = copy_of(healthy, tmp_path / "truncated")
    cut = broken / SHARDS[1]
    data = cut.read_bytes()
    cut.unlink()  # a hard link: the healthy shard must stay whole
    cut.write_bytes(data[:-4096])
    [finding] = verify_findings(capsys, monkeypatch, broken)
    assert (finding["check"], finding["file"]) == ("size.truncated", SHARDS[1])
    [item] = preflight_items(capsys, monkeypatch, broken, vllm_site)
    assert (item["check"], item["impact"]) == ("checkpoint.damaged", LOAD)

    line = vllm_cpu.refusal(broken, tmp_path / "log")
    assert line == (
        "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: "
        "incomplete metadata, file not fully covered"
    )
    assert len(healthy_completion.ids) == 4


@pytest.mark.e2e  # another vLLM server start; verify's own tests hold the finding
def test_a_quantized_linear_no_config_group_targets(
    healthy, healthy_completion, vllm_site, tmp_path, capsys, monkeypatch
):
    broken = copy_of(healthy, tmp_path / "untargeted")

    def leave_out_down_proj(q: dict[str, Any]) -> None:
        (group,) = q["config_groups"].values()
        group["targets"] = [r"re:.*self_attn\.(q|k|v|o)_proj$", r"re:.*mlp\.(gate|up)_proj$"]

    edit_quant_config(broken, leave_out_down_proj)
    findings = verify_findings(capsys, monkeypatch, broken)
    assert {f["check"] for f in findings} == {"quant.not-targeted"}
    assert sorted(f["tensor"] for f in findings) == sorted(f"model.layers.{i}.mlp.down_proj.weight" for i in range(30))
    [item] = preflight_items(capsys, monkeypatch, broken, vllm_site)
    assert (item["check"], item["impact"]) == ("quant.not-targeted", LOAD)

    line = vllm_cpu.refusal(broken, tmp_path / "log")
    assert line.startswith(
        "ValueError: There is no module or parameter named 'layers.0.mlp.down_proj.weight_scale' in LlamaModel."
    ), line
    # The fix (target it again: `Linear`) is the healthy checkpoint, which serves.
    assert len(healthy_completion.ids) == 4


@pytest.mark.e2e  # another vLLM server start; verify's own tests hold the finding
def test_a_dense_linear_a_config_group_targets(healthy, healthy_completion, vllm_site, tmp_path, capsys, monkeypatch):
    """Not a refusal: vLLM starts, builds the FP8 layer, casts the dense weight into it and never writes
    its scale, so it serves numbers made from uninitialised memory (seen: non-finite logprobs, which the
    server cannot put in JSON)."""
    broken = tmp_path / "dense-down-proj"
    broken.mkdir()
    for f in healthy.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, broken / f.name)
    tensors = {}
    for shard in SHARDS:
        tensors.update(safetensors_torch.load_file(healthy / shard))
    with safe_open(smollm2_fp32() / "model.safetensors", "pt") as source:
        for i in range(30):
            name = f"model.layers.{i}.mlp.down_proj"
            del tensors[f"{name}.weight_scale"]
            tensors[f"{name}.weight"] = source.get_tensor(f"{name}.weight").to(torch.bfloat16)
    write_shards(broken, tensors)
    findings = verify_findings(capsys, monkeypatch, broken)
    assert {f["check"] for f in findings} == {"quant.not-quantized"}
    assert len(findings) == 30
    [item] = preflight_items(capsys, monkeypatch, broken, vllm_site)
    assert (item["check"], item["impact"]) == ("quant.not-quantized", WRONG)

    log_dir = tmp_path / "log"
    with vllm_cpu.serve(broken, log_dir) as s:
        assert s.choices() == [("ChannelWiseTorchFP8ScaledMMLinearKernel", "CompressedTensorsW8A8Fp8")]
        try:
            got: vllm_cpu.Completion | None = s.complete(PROMPT, 4)
        except ServerError as exc:
            assert "Out of range float values are not JSON compliant" in str(exc)
            got = None
    assert vllm_cpu.error_line((log_dir / "server.log").read_text(errors="replace")) is None
    if got is not None:
        gap = max(abs(a - b) for a, b in zip(got.logprobs, healthy_completion.logprobs, strict=True))
        assert got.ids != healthy_completion.ids or gap > 1.0


KV_FP8 = ["--kv-cache-dtype", "fp8"]


@pytest.mark.e2e  # another vLLM server start; verify's own tests hold the finding
def test_an_fp8_kv_cache_declared_without_its_scales(
    healthy, healthy_completion, vllm_site, tmp_path, capsys, monkeypatch
):
    """vLLM reads the k_scale/v_scale `calibrate-kv` writes, and without them quantizes its cache at scale
    1.0: it serves, other numbers (measured on AVX-512, 24 tokens of three prompts: the same tokens as
    the calibrated checkpoint for the first 13, 5 and 4, logprobs up to 0.52 nats apart before that;
    scales divided by 100 give other tokens from the first). On AVX2 vLLM CPU refuses any FP8 cache."""
    from weightsmith.calibration.kv import calibrate_kv

    calibrated = copy_of(healthy, tmp_path / "calibrated")
    calibrate_kv(calibrated, smollm2_fp32(), builtin="code", tokens=512, seq_len=128)
    assert verify_findings(capsys, monkeypatch, calibrated) == []
    missing = copy_of(healthy, tmp_path / "missing")
    scheme = json.loads((calibrated / "config.json").read_text())["quantization_config"]["kv_cache_scheme"]
    edit_quant_config(missing, lambda qc: qc.__setitem__("kv_cache_scheme", scheme))
    findings = verify_findings(capsys, monkeypatch, missing)
    assert {f["check"] for f in findings} == {"kv.missing-scale"} and len(findings) == 60
    items = preflight_items(capsys, monkeypatch, missing, vllm_site)
    assert [(i["check"], i["impact"]) for i in items] == [("kv.scales", WRONG)]

    if vllm_cpu.isa() == "avx2":
        line = vllm_cpu.refusal(missing, tmp_path / "log", KV_FP8)
        assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in line, line
        return
    served = {}
    for name, folder in (("calibrated", calibrated), ("missing", missing)):
        with vllm_cpu.serve(folder, tmp_path / f"log-{name}", KV_FP8) as s:
            served[name] = s.complete(PROMPT, 16)
    good, bad = served["calibrated"], served["missing"]
    assert good.ids[:4] == healthy_completion.ids, good  # " Paris.\n\n", as with a BF16 cache
    shared = next((i for i, (a, b) in enumerate(zip(good.ids, bad.ids, strict=True)) if a != b), len(good.ids))
    gap = max((abs(a - b) for a, b in zip(good.logprobs[:shared], bad.logprobs[:shared], strict=True)), default=0.0)
    assert shared < len(good.ids) or gap > 0.05, (good, bad)
