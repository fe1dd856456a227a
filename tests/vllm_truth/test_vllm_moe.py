"""What preflight predicts for MoE checkpoints, checked against vLLM's CPU build itself.

Tiny random models of each MoE family (Qwen2-MoE, Qwen3-MoE, Mixtral, Laguna, DeepSeek-V3: 8 experts
with top-2 routing; layer 0 dense and a shared expert where the family has them), quantized as users quantize
them. vLLM builds routed experts as FusedMoE, whose CPU classes for quantized experts all need AMX
tiles, and routes them in `CPURouter`, which asserts softmax scoring. For each checkpoint preflight
says "served" (no finding) or names why not, and vLLM CPU must agree: what it serves is token-checked
against our own reference (the checkpoint decoded by our decompressors, `served_logits`); what it
refuses, it refuses with the line preflight cites.

Every checkpoint is loaded by vLLM's offline engine in one interpreter (`vllm_cpu.load_outcomes`: the
engine, loader and kernels the server runs, seconds per checkpoint); one is also served by a real
server started as a user starts it, to show the server path serves what the engine does.

On a CPU with AMX tiles a quantized-experts class runs, and whether it takes the experts' quantization
keys (`_supports_quant_scheme`) is not read: preflight notes it, and the test asserts only that note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

import vllm_cpu
import weightsmith as ws
from engine.tiny_models import SEED3, SERVABLE, moe_shapes, save_tiny, sharpen
from models import smollm2_fp32
from synth import split_expert_scheme
from weightsmith.fidelity.logits import load_tokenizer, served_logits
from weightsmith.preflight.checks import preflight
from weightsmith.preflight.moe_kernel import BACKEND, ONE_SCHEME, ROUTER
from weightsmith.preflight.native_op import machine_flags
from weightsmith.preflight.report import LOAD, NOTE, Item

torch = pytest.importorskip("torch")

#: vLLM CPU's latent-attention kernel takes only DeepSeek's own cache width, kv_lora_rank 512 +
#: qk_rope_head_dim 64.
LATENT = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, head_dim=64)  # rotary on 64
PROMPTS = ("def fibonacci(n):", "The capital of France is", "Once upon a time")
TOKENS = 8
#: Measured here (3 prompts x 8 tokens, each family in BF16 and with W4A16 around BF16 experts): a chosen
#: token's logprob within 0.11 nats of the reference's (chosen tokens' logprobs run from -0.5 to -2.5),
#: up to 0.41 on DeepSeek-V3 with its latent-attention projections in W4A16; where greedy decoding parts,
#: vLLM's token was the reference's second choice, 0.01 to 0.14 nats down, 0.42 at the eighth token of
#: one Mixtral prompt. A wrong weight parts by nats at once.
GAP_TOL, SPLIT_TOL = 0.5, 0.6
#: Families whose router vLLM CPU runs (softmax; DeepSeek-V3's grouped sigmoid); Laguna's it refuses.
SERVED_FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3")

#: Everything but the routed experts in W4A16 (groups of 32): attention, shared expert, layer 0's dense MLP.
AROUND_EXPERTS = """\
[[rule]]
targets = ["category:attention", "category:shared expert", "category:dense mlp"]
scheme = "w4a16"
group_size = 32
"""
#: Only the routed experts quantized, NVFP4 weights.
EXPERTS_NVFP4 = """\
[[rule]]
targets = ["category:routed experts"]
scheme = "nvfp4a16"
"""


@dataclass(frozen=True)
class Case:
    family: str
    #: QuantizeRequest fields (None: the BF16 model itself); "recipe" is the text of one
    request: dict | None
    #: vLLM's words when it refuses (None: it serves); `amx`: these serve on a CPU with AMX tiles
    refused: str | None = None
    check: str | None = None
    amx: bool = False


CASES = {
    **{f"{f} bf16": Case(f, None) for f in SERVED_FAMILIES},
    **{f"{f} around experts": Case(f, {"recipe": AROUND_EXPERTS}) for f in SERVED_FAMILIES},
    "experts w4a16": Case("qwen2_moe", {"scheme": "w4a16", "group_size": 32},
                          "No WNA16 MoE backend supports the deployment configuration", BACKEND, amx=True),
    "experts w8a8": Case("qwen2_moe", {"scheme": "w8a8"},
                         "No Int8 MoE backend supports the deployment configuration", BACKEND, amx=True),
    "experts fp8-dynamic": Case("qwen2_moe", {"scheme": "fp8-dynamic"}, "Unsupported FP8 MoE backend: NONE",
                                BACKEND, amx=True),
    "experts nvfp4a16": Case("qwen2_moe", {"recipe": EXPERTS_NVFP4},
                             "No NvFp4 MoE backend supports the deployment configuration", BACKEND),
    # down_proj given a config group of its own (`synth.split_expert_scheme`), as another tool may write it
    "experts of two schemes": Case("qwen2_moe", {"scheme": "w4a16", "group_size": 32, "split": True},
                                   "All MoE projections need to have same quantization scheme", ONE_SCHEME),
    # vLLM builds layer 1's FusedMoE before anything runs: the NVFP4 experts refuse first (the static FP8
    # attention would fail next, on `static_scaled_fp8_quant`, docs/vllm.md)
    "seed 3": Case("qwen2_moe", {"recipe": SEED3, "calibrate": True, "kv_cache": "fp8"},
                   "No NvFp4 MoE backend supports the deployment configuration", BACKEND),
    # last: it fails at its first request, which can leave the engine's process state behind it
    "laguna bf16": Case("laguna", None, "AssertionError", ROUTER),
}  # fmt: skip


def _quantized(src: Path, out: Path, request: dict) -> Path:
    fields = dict(request)
    if fields.pop("calibrate", False):  # every Linear's input maximum, each expert's on every token
        fields["calibration"] = out.with_suffix(".stats.safetensors")
        ws.calibrate(src, fields["calibration"], tokens=256, seq_len=64, all_experts=True)
    if "recipe" in fields:
        recipe = out.with_suffix(".toml")
        recipe.write_text(fields["recipe"])
        fields["recipe"] = recipe
    split = fields.pop("split", False)
    ws.quantize(ws.QuantizeRequest(source=src, output=out, hash_sources=False, **fields))
    return split_expert_scheme(out) if split else out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    tok = smollm2_fp32()
    families = {c.family for c in CASES.values()}
    sizes = {f: {**SERVABLE, **(LATENT if f == "deepseek_v3" else {})} for f in families}
    bf16 = {f: sharpen(save_tiny(root / f, f, 0, tok, moe_shapes(f, **sizes[f]))) for f in families}
    return {
        name: bf16[case.family] if case.request is None else _quantized(bf16[case.family], root / f"q{i}", case.request)
        for i, (name, case) in enumerate(CASES.items())
    }


@pytest.fixture(scope="module")
def prompts(checkpoints: dict[str, Path]) -> list[list[int]]:
    tok = load_tokenizer(next(iter(checkpoints.values())))
    return [tok(p)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def outcomes(
    checkpoints: dict[str, Path], prompts: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[Path, vllm_cpu.Outcome]:
    log = tmp_path_factory.mktemp("vllm") / "load.log"
    return vllm_cpu.load_outcomes(list(checkpoints.values()), log, prompts, TOKENS)


def _predicted(model: Path) -> list[Item]:
    result = preflight(model, vllm_cpu.site_packages())
    return [i for i in result.items if i.check in (BACKEND, ROUTER, ONE_SCHEME) or i.impact == LOAD]  # notes too


def _amx() -> bool:
    return "amx_tile" in (machine_flags() or frozenset())


def _check_tokens(model: Path, prompts: list[list[int]], completions: list[vllm_cpu.Completion]) -> None:
    """vLLM's greedy tokens against our reference's, token by token."""
    for ids, got in zip(prompts, completions, strict=True):
        logprobs = torch.log_softmax(served_logits(model, torch.tensor([ids + got.ids])).float(), dim=-1)
        for i, token in enumerate(got.ids):
            step = logprobs[len(ids) - 1 + i]
            best = int(step.argmax())
            if best != token:
                assert float(step[best] - step[token]) <= SPLIT_TOL, (ids, i, got.ids)
                break
            assert abs(float(step[token]) - got.logprobs[i]) <= GAP_TOL, (ids, i, got.logprobs)


@pytest.mark.parametrize("name", list(CASES))
def test_preflight_predicts_what_vllm_cpu_does(
    name: str, checkpoints: dict[str, Path], prompts: list[list[int]], outcomes: dict[Path, vllm_cpu.Outcome]
) -> None:
    case, model = CASES[name], checkpoints[name]
    items, outcome = _predicted(model), outcomes[model]
    if case.request == {"recipe": AROUND_EXPERTS}:
        config = json.loads((model / "config.json").read_text())["quantization_config"]
        assert any(".experts." in entry for entry in config["ignore"])  # the experts stay BF16
    if case.amx and _amx():  # a quantized-experts class runs: preflight notes it, vLLM's load decides
        assert [(i.check, i.impact) for i in items] == [(BACKEND, NOTE)], items
        return
    if case.refused is None:
        assert items == [] and outcome.served, (items, outcome)
        _check_tokens(model, prompts, list(outcome.completions))
        return
    assert [i.check for i in items] == [case.check], items
    (item,) = items
    assert not outcome.served and case.refused in outcome.error, outcome
    # vLLM raised at the very line preflight cites
    cited = {f"{e.file.rpartition('/')[2]}:{e.line}": e.text for e in item.evidence}
    assert outcome.where in cited and cited[outcome.where] == outcome.line.strip(), (outcome, cited)
    if case.check == BACKEND and case.amx:
        assert "AMX tiles" in item.message, item.message


def test_a_server_started_as_users_start_it_serves_the_same(
    checkpoints: dict[str, Path], prompts: list[list[int]], tmp_path: Path
) -> None:
    """The mixed Qwen2-MoE checkpoint through `python -m vllm.entrypoints.openai.api_server`."""
    model = checkpoints["qwen2_moe around experts"]
    with vllm_cpu.serve(model, tmp_path / "logs") as served:
        _check_tokens(model, prompts, [served.complete(ids, TOKENS) for ids in prompts])
