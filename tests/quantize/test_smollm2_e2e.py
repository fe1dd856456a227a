"""A real trained model end to end: SmolLM2-135M quantized by us, loaded by transformers on CPU.

The quantized model must load from our output alone (transformers + compressed-tensors), and its
next-token predictions must match a fake-quantized copy of the original built with
compressed-tensors' own quantize/dequantize functions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from weightsmith.api import QuantizeRequest, quantize

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

from models import fake_quant, quantized_modules, smollm2_fp32, stdlib_text  # noqa: E402
from weightsmith.fidelity.logits import kl_divergence, next_token_logits, perplexity, top1_agreement  # noqa: E402

N_TOKENS = 512


@pytest.fixture(scope="module")
def base() -> tuple[Path, object, object]:
    path = smollm2_fp32()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok(stdlib_text(), return_tensors="pt").input_ids[:, :N_TOKENS]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, ids, next_token_logits(model, ids)


def _score(logits: torch.Tensor, ref_logits: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
    return {
        "ppl": perplexity(logits, ids),
        "top1_agreement": top1_agreement(ref_logits, logits),
        "kl": kl_divergence(ref_logits, logits),
    }


@pytest.mark.parametrize("group", [64, 128])
def test_smollm2_quantized_loads_in_transformers_and_matches_fake_quant(base, tmp_path: Path, group: int) -> None:
    path, ids, ref_logits = base
    out = tmp_path / f"smollm2-w4a16-g{group}"
    started = time.perf_counter()
    result = quantize(
        QuantizeRequest(path, out, scheme="w4a16", group_size=group, workers=2, scale_search="none", pre_pass=None)
    )
    seconds = time.perf_counter() - started
    manifest = result.manifest
    quantized = quantized_modules(out)
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    if group == 64:
        assert len(quantized) == 30 * 7  # every Linear of 30 layers
    else:
        # 576-wide inputs do not divide by 128: only down_proj (1536 inputs) is quantized.
        assert quantized == {f"model.layers.{i}.mlp.down_proj" for i in range(30)}
        assert "model.layers.0.self_attn.q_proj" in ignore and "model.layers.0.mlp.up_proj" in ignore

    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    ours = _score(next_token_logits(model, ids), ref_logits, ids)
    fake = _score(next_token_logits(fake_quant(path, quantized, group), ids), ref_logits, ids)
    reference = _score(ref_logits, ref_logits, ids)
    report = {
        "group": group,
        "quantized_linears": len(quantized),
        "bits_per_param": manifest.sizes.bits_per_parameter_after,
        "seconds": round(seconds, 2),
        "fp32": reference,
        "weightsmith": ours,
        "fake_quant_reference": fake,
    }
    print(json.dumps(report, indent=2))
    assert abs(ours["ppl"] - fake["ppl"]) / fake["ppl"] < 0.01
    assert abs(ours["top1_agreement"] - fake["top1_agreement"]) < 0.02
    assert ours["ppl"] > reference["ppl"]  # quantization costs something: the test measures real error
    assert ours["top1_agreement"] > 0.5
