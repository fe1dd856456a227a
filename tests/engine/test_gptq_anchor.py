"""`quantize --method gptq` against llm-compressor's `oneshot` with a GPTQModifier, on SmolLM2-135M.

Same tokens (4 sequences of 128 from the built-in code text), W4A16 group 64 (576 and 1536 are not
multiples of 128), `actorder=None`, dampening 0.01, block 128, lm_head kept. Both outputs are
compared with the original on held-out text (`textwrap.py`, not in the calibration text): our KL
must be at or below oneshot's within the noise: the first layer's values agree to 0.05% (float32 sums
in another order), but each tie broken otherwise moves every later column of GPTQ, and by the last
layers 14% of the values differ; such runs differ by 5-7% in KL (on 2,048 tokens: ours 0.423-0.431,
oneshot's 0.404, round-to-nearest 0.404, benchmarks/gptq_speed.py). Our output is `verify` clean and
loads in transformers (the KL is computed on the model transformers loads). Times and peak RSS:
`benchmarks/gptq_speed.py`.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from weightsmith.audit.verify import verify
from weightsmith.cli_quantize import GptqOptions, run_quantize
from weightsmith.fidelity.logits import compare

pytest.importorskip("llmcompressor")
torch = pytest.importorskip("torch")
# a oneshot run, a streamed GPTQ run and three evals on a real model
pytestmark = pytest.mark.slow

SEQUENCES, SEQ_LEN, GROUP = 4, 128, 64
#: Our KL may exceed oneshot's by this fraction (the spread of runs that differ in float32 order only).
NOISE = 0.10


def _held_out() -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8")


def _kl(orig: Path, quant: Path) -> float:
    report = compare(orig, quant, text=_held_out(), tokens=512, text_source="textwrap.py")
    assert report.status == "ok", report.reason
    assert report.kl is not None
    return report.kl


def _oneshot(src: Path, out: Path, token_ids: list[list[int]]) -> Path:
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    data = Dataset.from_dict({"input_ids": token_ids, "attention_mask": [[1] * len(s) for s in token_ids]})
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP}
    recipe = GPTQModifier(
        config_groups={"group_0": {"targets": ["Linear"], "weights": weights}},
        ignore=["lm_head"],
        actorder=None,
        dampening_frac=0.01,
        block_size=128,
    )
    oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(token_ids),
            max_seq_length=SEQ_LEN, output_dir=str(out))  # fmt: skip
    return out


def _ours(src: Path, out: Path, method: str) -> Path:
    gptq = GptqOptions(None, "code", SEQUENCES * SEQ_LEN, SEQ_LEN, 0.01) if method == "gptq" else None
    run_quantize(src, out, scheme="w4a16", group_size=GROUP, ignore=[], preset=None, workers=2, force=False,
                 show_progress=False, gptq=gptq, scale_search=None if gptq else "none")  # fmt: skip
    return out


def test_gptq_kl_within_noise_of_oneshots(smollm2: Path, tmp_path: Path) -> None:
    from weightsmith.engine.calibrate import calibration_tokens

    token_ids, _, _ = calibration_tokens(smollm2, None, "code", SEQUENCES * SEQ_LEN, SEQ_LEN)
    assert [len(s) for s in token_ids] == [SEQ_LEN] * SEQUENCES
    ours = _ours(smollm2, tmp_path / "ours", "gptq")
    assert verify(ours).clean
    theirs = _oneshot(smollm2, tmp_path / "oneshot", token_ids)
    rtn = _ours(smollm2, tmp_path / "rtn", "rtn")
    kl_ours, kl_theirs, kl_rtn = _kl(smollm2, ours), _kl(smollm2, theirs), _kl(smollm2, rtn)
    print(f"KL on held-out text: ours {kl_ours:.4f}, oneshot {kl_theirs:.4f}, RTN {kl_rtn:.4f}")
    assert kl_ours <= kl_theirs * (1 + NOISE)
