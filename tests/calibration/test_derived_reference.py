"""The calibrated schemes against llm-compressor's `oneshot` on CPU, SmolLM2-135M, the same tokens.

The anchor of issue 11: `weightsmith calibrate`'s maxima (the layer-streamed engine) through
`quantize --scheme nvfp4|fp8 --kv-cache fp8` against `oneshot` with a QuantizationModifier of the
NVFP4 or FP8 preset and an FP8 `kv_cache_scheme`, on 4 sequences of 128 tokens:
- weights byte-identical (NVFP4 packed values, FP8 scales, global scales: data-free, as model_free_ptq);
- `input_global_scale`, `input_scale`, `k_scale`, `v_scale` within 1% (the issue's bar; they agree
  to about 2e-6, the float32 rounding of activations computed in another order);
- the config's group and `kv_cache_scheme` equal to oneshot's, accepted by compressed-tensors;
- read back by transformers on CPU with the scales in place, and `verify` clean.

The KV cache's observer: oneshot's default for a `kv_cache_scheme` is `minmax`, a moving average
(each batch's maximum moves the running value by 1%), so its scales depend on the order of the
shuffled batches and are dominated by the first one (on these tokens up to 26% off the maximum).
The reference here names `static_minmax`, the maximum over every token, which is what we measure
and what our `kv_cache_scheme` declares; the activation observers of both presets are
`static_minmax` already.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models import smollm2_fp32
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.audit.verify import verify
from weightsmith.calibration import stats_file

llmcompressor = pytest.importorskip("llmcompressor")
torch = pytest.importorskip("torch")
# two oneshot runs and an engine run on a real model: about a minute on an idle machine
pytestmark = pytest.mark.e2e  # llm-compressor's oneshot on a real model

SEQUENCES, SEQ_LEN = 4, 128
KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
SCALES = ("input_global_scale", "input_scale", "k_scale", "v_scale")
#: The issue's bar for measured scales against oneshot's.
REL = 0.01


@pytest.fixture(scope="module")
def token_ids() -> list[list[int]]:
    """The tokens `weightsmith calibrate --builtin code --tokens 512 --seq-len 128` runs."""
    from weightsmith.calibration.measure import calibration_tokens

    sequences = calibration_tokens(smollm2_fp32(), None, "code", SEQUENCES * SEQ_LEN, SEQ_LEN).sequences
    assert [len(s) for s in sequences] == [SEQ_LEN] * SEQUENCES
    return sequences


@pytest.fixture(scope="module")
def stats(tmp_path_factory: pytest.TempPathFactory, token_ids: list[list[int]]) -> Path:
    """`weightsmith calibrate` on those tokens (the layer-streamed engine)."""
    from weightsmith.calibration.cli import calibrate_command

    path = tmp_path_factory.mktemp("stats") / "stats.safetensors"
    calibrate_command(smollm2_fp32(), path, builtin="code", tokens=SEQUENCES * SEQ_LEN, seq_len=SEQ_LEN)
    assert stats_file.read(path).provenance.tokens == SEQUENCES * SEQ_LEN
    return path


def _oneshot(out: Path, scheme: str, token_ids: list[list[int]]) -> Path:
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_fp32(), dtype=torch.float32)
    data = Dataset.from_dict({"input_ids": token_ids, "attention_mask": [[1] * len(s) for s in token_ids]})
    recipe = QuantizationModifier(
        targets="Linear",
        scheme=scheme,
        ignore=["lm_head"],
        kv_cache_scheme=dict(KV_SCHEME, observer="static_minmax"),
    )
    oneshot(
        model=model,
        dataset=data,
        recipe=recipe,
        num_calibration_samples=len(token_ids),
        max_seq_length=SEQ_LEN,
        output_dir=str(out),
    )
    return out


@pytest.fixture(scope="module", params=[("nvfp4", "NVFP4"), ("fp8", "FP8")], ids=["nvfp4", "fp8"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, token_ids, stats) -> tuple:
    """(our checkpoint, oneshot's) for one scheme."""
    ours_scheme, preset = request.param
    base = tmp_path_factory.mktemp(ours_scheme)
    ref = _oneshot(base / "ref", preset, token_ids)
    quantize(
        QuantizeRequest(
            smollm2_fp32(),
            base / "ours",
            scheme=ours_scheme,
            workers=2,
            calibration=stats,
            kv_cache="fp8",
            pre_pass=None,
        )
    )
    return base / "ours", ref, preset


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_weights_identical_and_scales_within_one_percent(pair: tuple) -> None:
    ours_dir, ref_dir, _ = pair
    ours, ref = _tensors(ours_dir), _tensors(ref_dir)
    assert set(ours) == set(ref)
    worst: dict[str, float] = {}
    for name, r in ref.items():
        o = ours[name]
        assert (o.dtype, o.shape) == (r.dtype, r.shape), name
        leaf = name.rpartition(".")[2]
        if leaf in SCALES:
            worst[leaf] = max(worst.get(leaf, 0.0), abs(o.item() / r.item() - 1))
        else:
            assert torch.equal(o.view(torch.uint8), r.view(torch.uint8)), name
    assert {"k_scale", "v_scale"} <= set(worst) and len(worst) == 3
    assert all(rel < REL for rel in worst.values()), worst


def test_config_matches_oneshot_and_validates(pair: tuple) -> None:
    from compressed_tensors.quantization import QuantizationConfig

    ours_dir, ref_dir, preset = pair
    ours = json.loads((ours_dir / "config.json").read_text())["quantization_config"]
    ref = json.loads((ref_dir / "config.json").read_text())["quantization_config"]
    (ref_group,) = ref["config_groups"].values()
    assert ours["config_groups"][preset] == ref_group
    assert ours["kv_cache_scheme"] == ref["kv_cache_scheme"]
    assert ours["format"] == ref["format"]
    QuantizationConfig.model_validate(ours)
    assert verify(ours_dir).clean


def test_transformers_reads_it_back_with_the_scales(pair: tuple) -> None:
    from transformers import AutoModelForCausalLM

    ours_dir, _, preset = pair
    # transformers decompresses NVFP4 weights to bfloat16 (oneshot's own output too), so that model is bf16
    dtype = torch.bfloat16 if preset == "NVFP4" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(ours_dir, dtype=dtype)
    stored = _tensors(ours_dir)
    for i, layer in enumerate(model.model.layers):
        for kind in ("k", "v"):
            loaded = getattr(layer.self_attn, f"{kind}_scale")
            assert torch.equal(loaded, stored[f"model.layers.{i}.self_attn.{kind}_scale"].to(dtype))
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()
