"""Logits on a tiny Llama with a real tokenizer: figures match a direct computation; every
way this machine or the checkpoint can fall short is reported, not raised."""

from __future__ import annotations

import json
import math
import shutil
import sys
import warnings
from pathlib import Path

import pytest
from eval_checkpoints import TINY_LM_CONFIG, TOKENIZER_FILES, quantize, write_fp8
from safetensors.numpy import load_file, save_file

from clirun import run
from synth import llama_tensors
from weightsmith.core.errors import WeightsmithError
from weightsmith.fidelity import logits
from weightsmith.fidelity.logits import FAILED, OK, UNAVAILABLE, compare
from weightsmith.io import texts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

TOKENS = 64


def _direct(orig: Path, quant: Path, text: str, tokens: int) -> dict[str, float]:
    """The same figures computed here from plain transformers calls.

    QUANT is dequantized at load by transformers' compressed-tensors loader, then each weight is rounded
    to BF16, the scales' dtype, in which a server's kernels dequantize (and eval's own decompressors give;
    the checkpoint's other tensors are BF16 already): that loader as a cross-check of ours.
    """
    tok = transformers.AutoTokenizer.from_pretrained(orig)
    ids = tok(text, return_tensors="pt").input_ids[:, :tokens]
    extra = {"quantization_config": transformers.CompressedTensorsConfig(dequantize=True)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "loading attributes ... will be overwritten": as intended
        ref = transformers.AutoModelForCausalLM.from_pretrained(orig, dtype=torch.float32)(ids).logits[0]
        quantized = transformers.AutoModelForCausalLM.from_pretrained(quant, dtype=torch.float32, **extra)
        for param in quantized.parameters():
            param.data = param.data.to(torch.bfloat16).to(torch.float32)
        got = quantized.to(torch.float32)(ids).logits[0]
    p, q = torch.softmax(ref.double(), -1), torch.softmax(got.double(), -1)
    kl_per_position = (p * (p.log() - q.log())).sum(-1)
    targets = ids[0, 1:]

    def ppl(logits_: torch.Tensor) -> float:
        logp = torch.log_softmax(logits_[:-1].double(), -1)
        return math.exp(-logp[torch.arange(len(targets)), targets].mean().item())

    return {
        "kl": kl_per_position.mean().item(),
        "top1_agreement": (ref.argmax(-1) == got.argmax(-1)).double().mean().item(),
        "ppl_orig": ppl(ref),
        "ppl_quant": ppl(got),
    }


@pytest.mark.parametrize("scheme", ["w4a16", "nvfp4a16"])
def test_figures_match_a_direct_computation(tiny_lm: tuple[Path, Path], tmp_path: Path, scheme: str) -> None:
    orig, quant = tiny_lm
    if scheme == "nvfp4a16":
        quant = quantize(orig, tmp_path / "nvfp4", scheme=scheme, group=None)
    text = texts.default_text().text
    report = compare(orig, quant, text, TOKENS, text_source="sample")
    assert report.status == OK and report.reason is None
    assert report.tokens == TOKENS and report.text_source == "sample"
    expected = _direct(orig, quant, text, TOKENS)
    assert report.kl == pytest.approx(expected["kl"], rel=1e-9)
    assert report.top1_agreement == expected["top1_agreement"]
    assert report.ppl_orig == pytest.approx(expected["ppl_orig"], rel=1e-9)
    assert report.ppl_quant == pytest.approx(expected["ppl_quant"], rel=1e-9)
    assert report.kl > 0 and report.ppl_orig != report.ppl_quant


def test_cli_table_and_json_with_logits(tiny_lm: tuple[Path, Path], tmp_path: Path, capsys, monkeypatch) -> None:
    orig, quant = tiny_lm
    text = tmp_path / "sample.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20)
    args = ["eval", str(orig), str(quant), "--text", str(text), "--tokens", "40"]
    code, out, _ = run(capsys, monkeypatch, *args, "--json")
    doc = json.loads(out)["logits"]
    assert code == 0 and doc["status"] == OK and doc["tokens"] == 40 and doc["text_source"] == str(text)
    assert doc["kl"] > 0 and 0 <= doc["top1_agreement"] <= 1 and doc["ppl_orig"] > 1 and doc["ppl_quant"] > 1
    code, out, _ = run(capsys, monkeypatch, *args)
    assert code == 0
    kl, top1 = f"KL {doc['kl']:.4f} nats", f"top-1 agreement {100 * doc['top1_agreement']:.1f} %"
    ppl = f"perplexity {doc['ppl_orig']:.3f} -> {doc['ppl_quant']:.3f} ("
    assert out.strip().splitlines()[-1].startswith(f"logits (40 tokens of {text}): {kl}, {top1}, {ppl}")


def test_quant_loads_as_served_where_transformers_refuses(tiny_lm: tuple[Path, Path], tmp_path: Path) -> None:
    """With lm_head no longer ignored, compressed-tensors' loader expects it packed and refuses the
    checkpoint; vLLM keeps lm_head dense either way (verify warns), and so does eval, which loads QUANT
    through our own decompressors: its figures are the served model's."""
    orig, quant = tiny_lm
    changed = shutil.copytree(quant, tmp_path / "lm-head-targeted")
    config = json.loads((changed / "config.json").read_text())
    config["quantization_config"]["ignore"].remove("lm_head")
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception):  # noqa: B017 (transformers raises what it raises)
        logits.load_model(changed)
    report = compare(orig, changed, tokens=16)
    assert report.status == OK
    assert report.kl == compare(orig, quant, tokens=16).kl


def test_quant_missing_a_weight_fails(tiny_lm: tuple[Path, Path], tmp_path: Path, capsys, monkeypatch) -> None:
    """A tensor the model needs but the weight pass never reads (a norm) is caught at load, one line
    naming it; the command exits 1 for it."""
    orig, quant = tiny_lm
    broken = shutil.copytree(quant, tmp_path / "no-norm")
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    report = compare(orig, broken, tokens=16)
    assert report.status == FAILED and report.kl is None
    assert report.reason == (
        f"QUANT does not load as served (CheckpointError: {broken}: tensor 'model.norm.weight': is missing: the "
        "engine cannot build LlamaForCausalLM without it)"
    )
    code, out, _ = run(capsys, monkeypatch, "eval", str(orig), str(broken))
    assert code == 1 and "logits: FAILED: QUANT does not load as served" in out


@pytest.mark.parametrize("style", ["hf-fp8", "ct-fp8"])
def test_fp8_original_runs_on_cpu(tiny_lm: tuple[Path, Path], tmp_path: Path, style: str) -> None:
    """An FP8 original is dequantized at load (transformers' FP8 path needs a GPU otherwise)."""
    orig, _ = tiny_lm
    src = tmp_path / "fp8"
    write_fp8(src, llama_tensors(TINY_LM_CONFIG, seed=3), TINY_LM_CONFIG, style)
    for name in TOKENIZER_FILES:
        shutil.copy(orig / name, src / name)
    report = compare(src, quantize(src, tmp_path / "q", group=32), tokens=16)
    assert report.status == OK, report.reason
    assert report.kl > 0 and report.tokens == 16


def _unknown_architecture(orig: Path, tmp_path: Path) -> Path:
    folder = shutil.copytree(orig, tmp_path / "unknown-arch")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="notamodel", architectures=["NotAModel"])))
    return folder


def test_unavailable_reasons(
    tiny_lm: tuple[Path, Path], synthetic: Path, synthetic_w4: Path, tmp_path: Path, monkeypatch
) -> None:
    orig, quant = tiny_lm
    no_tokenizer = compare(synthetic, synthetic_w4, tokens=16)
    assert no_tokenizer.status == UNAVAILABLE and no_tokenizer.reason.startswith("no tokenizer transformers can load")
    unknown = compare(_unknown_architecture(orig, tmp_path), quant, tokens=16)
    assert unknown.status == UNAVAILABLE and unknown.reason.startswith("transformers cannot build ORIG on CPU")
    with monkeypatch.context() as m:
        m.setattr(logits, "available_memory", lambda: 2**20)
        small = compare(orig, quant, tokens=16)
    assert small.status == UNAVAILABLE and "GiB in float32 on CPU and 0.0 GiB is available" in small.reason
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "compressed_tensors", None)
        missing = compare(orig, quant, tokens=16)
    assert missing.status == UNAVAILABLE and missing.reason.startswith("compressed-tensors is not installed")
    for report in (no_tokenizer, unknown, small, missing):
        assert report.kl is None and report.ppl_quant is None


def test_text_without_tokens_is_bad_input(tiny_lm: tuple[Path, Path], tmp_path: Path, capsys, monkeypatch) -> None:
    orig, quant = tiny_lm
    with pytest.raises(WeightsmithError, match="gives 0 token"):
        compare(orig, quant, "", tokens=16)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, _, err = run(capsys, monkeypatch, "eval", str(orig), str(quant), "--text", str(empty))
    assert code == 2 and err.strip() == f"error: {empty}: gives 0 token(s); at least 2 are needed"
