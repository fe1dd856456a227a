"""vLLM's CPU build serving what weightsmith writes for SmolLM2-135M, checked token for token.

Each checkpoint is served by a real vLLM CPU server (`vllm_cpu.serve`, started as a user starts it) and
its greedy tokens and logprobs are scored against the reference that computes what vLLM should
(`vllm_reference.Reference`: transformers' dequantized model, BF16 weights, activations quantized as
the scheme says). A scheme vLLM CPU cannot serve on this machine is a finding, asserted by vLLM's own
error line, never a skip: which library vLLM loads depends on the CPU (`vllm_cpu.isa`), and the AVX2
one lacks the int4 weight-only GEMM, so W4A16 serves only where AVX-512 with BF16 is present.

Tolerances are measured (docs/vllm.md, `make vllm-table`, three prompts of 24 tokens, on an AVX2 and an
AVX-512 machine): a chosen token's logprob differs from the reference's by at most 0.15 nats for the
unquantized model served in BF16 and for W4A16 (RTN, asymmetric, GPTQ), 0.21 for W8A8 and 0.40 for
FP8-dynamic (GAP_TOL: 0.5). Where greedy decoding parts from the reference, vLLM's token was the
reference's second choice by at most 0.06 nats (BF16, W4A16) and 0.89 (FP8-dynamic); for W8A8 on AVX-512
its eighth, 1.47 nats down, at a flat point of the distribution: BF16 activations round differently
before they are quantized (SPLIT_TOL: 2.5). A wrong scale or a misread layout parts at the first
tokens, by several nats.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import vllm_cpu
import weightsmith
from models import smollm2_fp32
from vllm_reference import Reference
from weightsmith.fidelity.logits import load_tokenizer

PROMPTS = ("def fibonacci(n):", "The capital of France is")
TOKENS = 16
GAP_TOL = 0.5
SPLIT_TOL = 2.5


@dataclass(frozen=True)
class Case:
    scheme: str
    group_size: int | None
    #: (kernel, vLLM scheme class) the log must name
    choice: tuple[str, str]
    #: isa -> substring of vLLM's error line, for a machine where it cannot serve the scheme
    refused_on: tuple[tuple[str, str], ...] = ()
    #: `--pre-pass`: the norms and v/up_proj rows it rewrites are served as written
    pre_pass: str | None = None


_NO_WNA16_GEMM = "object has no attribute 'cpu_gemm_wna16'"
SERVED = {
    "w4a16": Case("w4a16", 64, ("CPUWNA16LinearKernel", "CompressedTensorsWNA16"), (("avx2", _NO_WNA16_GEMM),)),
    "w4a16-asym": Case(
        "w4a16-asym", 64, ("CPUWNA16LinearKernel", "CompressedTensorsWNA16"), (("avx2", _NO_WNA16_GEMM),)
    ),
    # the default recipe (`quantize` with no flags on a Llama: test_sinq holds them byte-identical), group 64
    "w4a16-asym + sinq": Case(
        "w4a16-asym",
        64,
        ("CPUWNA16LinearKernel", "CompressedTensorsWNA16"),
        (("avx2", _NO_WNA16_GEMM),),
        pre_pass="sinq",
    ),
    "fp8-dynamic": Case("fp8-dynamic", None, ("ChannelWiseTorchFP8ScaledMMLinearKernel", "CompressedTensorsW8A8Fp8")),
    "w8a8": Case("w8a8", None, ("CPUInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8")),
}
#: Schemes vLLM CPU 0.32 has no kernel for on any x86 machine: scheme -> its error line's words.
REFUSED = {
    "w8a16": "Failed to find a kernel that can implement the WNA16 linear layer",
    "nvfp4a16": "Marlin FP4 not available",
}


@pytest.fixture(scope="module")
def isa() -> str:
    return vllm_cpu.isa()


@pytest.fixture(scope="module")
def src() -> Path:
    return smollm2_fp32()


def _quantize(src: Path, out: Path, scheme: str, group_size: int | None, pre_pass: str | None = None) -> Path:
    weightsmith.quantize(
        weightsmith.QuantizeRequest(
            src, out, scheme=scheme, group_size=group_size, pre_pass=pre_pass, hash_sources=False
        )
    )
    return out


@pytest.mark.parametrize("name", list(SERVED))
def test_served_token_for_token(name: str, src: Path, isa: str, tmp_path: Path) -> None:
    case = SERVED[name]
    model = _quantize(src, tmp_path / "out", case.scheme, case.group_size, case.pre_pass)
    refused = dict(case.refused_on).get(isa)
    if refused is not None:
        line = vllm_cpu.refusal(model, tmp_path / "logs", prompt="def fibonacci(n):")
        assert refused in line, line
        return
    tok = load_tokenizer(model)
    ref = Reference(model)
    with vllm_cpu.serve(model, tmp_path / "logs") as s:
        assert case.choice in s.choices(), s.choices()
        for prompt in PROMPTS:
            ids = tok(prompt)["input_ids"]
            got = s.complete(ids, TOKENS)
            score = ref.score(ids, got.ids, got.logprobs)
            assert score.max_gap <= GAP_TOL, (prompt, score)
            if score.agree < score.total:
                assert score.margin_at_split is not None and score.margin_at_split <= SPLIT_TOL, (prompt, score)


@pytest.mark.e2e  # a facts-of-vLLM-CPU check: vLLM 0.32.0 CPU has no kernel for these schemes
@pytest.mark.parametrize("scheme", list(REFUSED))
def test_refused_with_vllms_own_error(scheme: str, src: Path, tmp_path: Path) -> None:
    model = _quantize(src, tmp_path / scheme, scheme, 64 if scheme == "w8a16" else None)
    line = vllm_cpu.refusal(model, tmp_path / "logs")
    assert REFUSED[scheme] in line, line
