"""`quantize --method gptq` against llm-compressor's `oneshot` with a GPTQModifier, on SmolLM2-135M.

Layer 0, exactly: the same hidden states enter it in both pipelines, the same Hessian (up to the
order of float32 sums) and the same values of q/k/v_proj but for a few rows, where one value on a
rounding tie went the other way and moved the rest of its row (GPTQ propagates each error along the
row). Those few flipped rows are what separates the two runs from layer 1 on.

Same tokens (4 sequences of 128 from the built-in code text), W4A16 group 64 (576 and 1536 are not
multiples of 128), actorder static (both defaults), dampening 0.01, block 128, lm_head kept. In layer
0, 675 of q/k/v's 552,960 values differ, in 11 of 960 rows. End to end, both calibrate on 8 sequences
of 256 and are compared with the original on held-out text (`textwrap.py`, not in the calibration
text): our KL must be at or below oneshot's within the noise of such tie flips (runs that differ
only in float32 order differ by up to 12 % in KL, see NOISE; ours 0.3211, oneshot's 0.2869,
round-to-nearest 0.4035, here and in benchmarks/gptq_speed.py), and both below round-to-nearest's by a
clear margin. Our output
is `verify` clean and loads in transformers (the KL is computed on the model transformers loads).
"""

from __future__ import annotations

import sysconfig
import tempfile
from contextlib import suppress
from pathlib import Path

import pytest

from weightsmith.api import GptqOptions, QuantizeRequest, quantize
from weightsmith.audit.verify import verify
from weightsmith.fidelity.logits import compare
from weightsmith.quantization.recipe import LLM_COMPRESSOR_DAMPENING

pytest.importorskip("llmcompressor")
torch = pytest.importorskip("torch")
# a oneshot run, a streamed GPTQ run and three evals on a real model

SEQUENCES, SEQ_LEN, GROUP = 4, 128, 64
#: The end-to-end comparison calibrates on 2,048 tokens: on 512, GPTQ is no better than round-to-nearest
#: on held-out text (ours 0.4025 against 0.4035), and tie flips decide more than the algorithm.
KL_SEQUENCES, KL_SEQ_LEN = 8, 256
#: Our KL may exceed oneshot's by this fraction: the spread of runs that differ in float32 order only. On a
#: 2-core AMD EPYC: oneshot 0.2869 in our order, 0.3125-0.3265 shuffled (3 seeds); ours 0.3037-0.3211 over four
#: such variants (sequences reversed, torch's products instead of oneDNN's). On the machine of docs/engine.md's
#: earlier figures: oneshot 0.3253, ours 0.3134.
NOISE = 0.15
#: What GPTQ must take off round-to-nearest's KL on held-out text at 2,048 tokens (ours took 22 %).
GAIN = 0.10


def _held_out() -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8")


def _kl(orig: Path, quant: Path) -> float:
    report = compare(orig, quant, text=_held_out(), tokens=512, text_source="textwrap.py")
    assert report.status == "ok", report.reason
    assert report.kl is not None
    return report.kl


def _oneshot(src: Path, out: Path, token_ids: list[list[int]], seq_len: int) -> Path:
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    data = Dataset.from_dict({"input_ids": token_ids, "attention_mask": [[1] * len(s) for s in token_ids]})
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP}
    recipe = GPTQModifier(
        config_groups={"group_0": {"targets": ["Linear"], "weights": weights}},
        ignore=["lm_head"],  # actorder: its default, static, as ours
        dampening_frac=LLM_COMPRESSOR_DAMPENING,
        block_size=128,
    )
    # in our order: shuffled (oneshot's default, by the global random state) its KL spread 0.28-0.33
    oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(token_ids),
            max_seq_length=seq_len, shuffle_calibration_samples=False, output_dir=str(out))  # fmt: skip
    return out


def test_layer0_is_llm_compressors(smollm2: Path) -> None:
    """The hidden states, the q/k/v Hessian and the quantized q/k/v values of layer 0, against oneshot's."""
    import numpy as np

    from weightsmith.calibration.measure import calibration_tokens
    from weightsmith.engine import gptq
    from weightsmith.schemes import make_scheme

    token_ids = calibration_tokens(smollm2, None, "code", SEQUENCES * SEQ_LEN, SEQ_LEN).sequences
    qkv = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    ours = _our_layer0(smollm2, token_ids, qkv, gptq, make_scheme("w4a16", GROUP, "none"), np.dtype(np.float32))
    theirs = _their_layer0(smollm2, token_ids, qkv)
    assert len(ours["hidden"]) == len(theirs["hidden"]) == SEQUENCES
    assert all(torch.equal(a, b) for a, b in zip(ours["hidden"], theirs["hidden"], strict=True))
    h_ours, h_theirs = ours["hessian"], theirs["hessian"][qkv[0]]
    assert float((h_ours - h_theirs).norm() / h_theirs.norm()) < 1e-5  # float32 sums in another order
    mine = ours["values"]
    theirs_all = torch.cat([theirs["values"][m] for m in qkv])
    differ = mine != theirs_all
    rows = int(differ.any(dim=1).sum())
    print(f"layer 0 q/k/v: {int(differ.sum())} of {differ.numel()} values differ, in {rows} of {len(mine)} rows")
    assert rows <= 0.02 * len(mine) and float(differ.float().mean()) < 0.005


def _our_layer0(src: Path, token_ids: list[list[int]], modules: list[str], gptq, scheme, dtype) -> dict:
    """Our engine on `token_ids` with only `modules` (layer 0's q/k/v) to quantize: what enters layer 0,
    their shared Hessian, their dequantized values stacked."""
    out: dict = {}
    arguments, quantize_weight = gptq.layer_arguments, gptq.quantize_weight

    def recording_arguments(*args, **kwargs):
        states, calls = arguments(*args, **kwargs)
        out["hidden"] = [s.clone() for s in states]
        return states, calls

    def recording_quantize(weight, hessian, *args, **kwargs):
        out["hessian"] = hessian.clone()
        codes, values, singular = quantize_weight(weight, hessian, *args, **kwargs)
        out["values"] = values.clone()
        return codes, values, singular

    targets = {m: gptq.Target(scheme, dtype) for m in modules}
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as work:
        mp.setattr(gptq, "layer_arguments", recording_arguments)
        mp.setattr(gptq, "quantize_weight", recording_quantize)
        gptq.run(src, token_ids, targets, Path(work), actorder="static", dampening=LLM_COMPRESSOR_DAMPENING)
    return out


class _Stop(Exception):
    pass


def _their_layer0(src: Path, token_ids: list[list[int]], modules: list[str]) -> dict:
    """oneshot (GPTQModifier, its defaults but the group) stopped at layer 1: what entered layer 0,
    the Hessians and the dequantized values of `modules`."""
    import llmcompressor.modifiers.gptq.base as base
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    names = {id(m): n for n, m in model.named_modules()}
    out: dict = {"hidden": [], "hessian": {}, "values": {}}
    batch_names: list[str] = []
    prepare, quantize_weight = base.prepare_batch, base.quantize_weight

    def recording_prepare(batch, *args):
        batch_names[:] = [names[id(m)] for m in batch]
        weights, hessians, *rest = prepare(batch, *args)
        out["hessian"].update({n: hessians[i].clone() for i, n in enumerate(batch_names)})
        return (weights, hessians, *rest)

    def recording_quantize(**kwargs):
        values, *rest = quantize_weight(**kwargs)
        out["values"].update({n: values[i].clone() for i, n in enumerate(batch_names)})
        return (values, *rest)

    def layer0(_module, args, kwargs):
        states = args[0] if args else kwargs["hidden_states"]
        if states.device.type != "meta" and len(out["hidden"]) < len(token_ids):  # the calibration pass
            out["hidden"].append(states.detach().clone())

    def layer1(_module, args, kwargs):
        raise _Stop

    model.model.layers[0].register_forward_pre_hook(layer0, with_kwargs=True)
    model.model.layers[1].register_forward_pre_hook(layer1, with_kwargs=True)
    data = Dataset.from_dict({"input_ids": token_ids, "attention_mask": [[1] * len(s) for s in token_ids]})
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP}
    recipe = GPTQModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights}}, ignore=["lm_head"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(base, "prepare_batch", recording_prepare)
        mp.setattr(base, "quantize_weight", recording_quantize)
        with suppress(_Stop):
            oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(token_ids),
                    max_seq_length=SEQ_LEN, shuffle_calibration_samples=False)  # fmt: skip
    assert all(m in out["values"] for m in modules), "oneshot stopped before quantizing layer 0"
    return out


def _ours(src: Path, out: Path, method: str) -> Path:
    tokens = KL_SEQUENCES * KL_SEQ_LEN
    gptq = (
        GptqOptions(None, "code", tokens, KL_SEQ_LEN, LLM_COMPRESSOR_DAMPENING) if method == "gptq" else GptqOptions()
    )
    quantize(QuantizeRequest(src, out, scheme="w4a16", group_size=GROUP, workers=2, method=method, gptq=gptq,
                             scale_search="none", pre_pass=None))  # fmt: skip
    return out


@pytest.mark.e2e  # five oneshots and five of ours on a real model, about 9 minutes
def test_gptq_kl_within_noise_of_oneshots(smollm2: Path, tmp_path: Path) -> None:
    from weightsmith.calibration.measure import calibration_tokens

    token_ids = calibration_tokens(smollm2, None, "code", KL_SEQUENCES * KL_SEQ_LEN, KL_SEQ_LEN).sequences
    assert [len(s) for s in token_ids] == [KL_SEQ_LEN] * KL_SEQUENCES
    ours = _ours(smollm2, tmp_path / "ours", "gptq")
    assert verify(ours).clean
    theirs = _oneshot(smollm2, tmp_path / "oneshot", token_ids, KL_SEQ_LEN)
    rtn = _ours(smollm2, tmp_path / "rtn", "rtn")
    kl_ours, kl_theirs, kl_rtn = _kl(smollm2, ours), _kl(smollm2, theirs), _kl(smollm2, rtn)
    print(f"KL on held-out text: ours {kl_ours:.4f}, oneshot {kl_theirs:.4f}, RTN {kl_rtn:.4f}")
    assert kl_ours <= kl_theirs * (1 + NOISE)
    assert kl_ours <= kl_rtn * (1 - GAIN) and kl_theirs <= kl_rtn * (1 - GAIN)
