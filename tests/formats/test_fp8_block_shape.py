"""FP8 blocks and the layers vLLM builds from them: `quantize` keeps what vLLM would refuse, `verify` flags it.

vLLM's `validate_fp8_block_shape` refuses, at load, a fused layer (q/k/v, gate/up) whose shards other
than the last are not whole 128-row blocks; SmolLM2-135M's q_proj (576 rows) is one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.audit.findings import ERROR
from weightsmith.audit.verify import verify
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantization import plan as plan_module
from weightsmith.quantization.plan import KEEP, QUANTIZE, build_plan
from weightsmith.schemes import make_scheme

#: q_proj 192 rows (3 heads of 64) and gate/up 200 rows: both fused layers refused; o_proj (192
#: inputs) and down_proj (200 inputs) are Linears of their own, which take partial blocks.
REFUSED = dict(LLAMA_CONFIG, num_attention_heads=3, intermediate_size=200)
KEPT = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")


def _quantize(src: Path, out: Path, scheme: str = "fp8-block") -> Path:
    quantize(QuantizeRequest(src, out, scheme=scheme, workers=2, pre_pass=None))
    return out


@pytest.mark.parametrize(
    "partitions,refused",
    [
        ([("a.q_proj", 576), ("a.k_proj", 192), ("a.v_proj", 192)], "a.q_proj"),
        ([("a.q_proj", 256), ("a.k_proj", 64), ("a.v_proj", 64)], "a.k_proj"),
        ([("a.q_proj", 256), ("a.k_proj", 128), ("a.v_proj", 64)], None),  # the last shard may be ragged
        ([("m.gate_proj", 1536), ("m.up_proj", 1536)], None),
        ([("a.o_proj", 576)], None),  # a Linear of its own takes a partial block on one GPU
    ],
)
def test_block_shape_rule(partitions: list[tuple[str, int]], refused: str | None) -> None:
    found = ct.block_shape_refusal("layer", partitions, (128, 128))
    assert (found[0] if found else None) == refused


def test_plan_keeps_fused_layers_vllm_refuses_and_says_why(tmp_path: Path) -> None:
    ckpt = Checkpoint.open(write_checkpoint(tmp_path / "src", llama_tensors(REFUSED), REFUSED))
    plan = build_plan(ckpt, make_scheme("fp8-block"))
    d = {x.name: x for x in plan.decisions}
    for layer in (0, 1):
        p = f"model.layers.{layer}"
        for leaf in KEPT:
            kept = d[f"{p}.{leaf}.weight"]
            assert kept.action == KEEP and kept.rule is None, leaf
            assert kept.reason.startswith("kept unquantized, because vLLM refuses"), kept.reason
            assert f"{p}.{leaf}" in plan.ignore
            assert [s.dtype for s in kept.outputs] == ["BF16"]
        assert "q_proj has 192 output rows, not a multiple of 128" in d[f"{p}.self_attn.v_proj.weight"].reason
        assert "gate_proj has 200 output rows" in d[f"{p}.mlp.up_proj.weight"].reason
        assert d[f"{p}.self_attn.o_proj.weight"].action == QUANTIZE
        assert d[f"{p}.mlp.down_proj.weight"].action == QUANTIZE
    # the rule is the block strategy's: per-channel FP8 quantizes the same layers
    dynamic = build_plan(ckpt, make_scheme("fp8-dynamic"))
    assert all(x.action == QUANTIZE for x in dynamic.decisions if x.name.endswith("_proj.weight"))


def test_verify_flags_a_block_fp8_layer_vllm_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors(REFUSED), REFUSED)
    assert verify(_quantize(src, tmp_path / "ours")).errors == 0
    monkeypatch.setattr(plan_module, "_keep_refused_layers", lambda decisions: None)
    report = verify(_quantize(src, tmp_path / "planted"))
    found = [f for f in report.findings if f.check == "quant.block-shape"]
    assert {f.tensor for f in found} == {
        f"model.layers.{i}.{leaf}.weight" for i in (0, 1) for leaf in ("self_attn.q_proj", "mlp.gate_proj")
    }
    assert all(f.severity == ERROR for f in found)
    line = next(f.line() for f in found if f.tensor == "model.layers.0.self_attn.q_proj.weight")
    assert "\n" not in line
    assert "vLLM refuses qkv_proj in 128x128 blocks: q_proj has 192 output rows, not a multiple of 128" in line
    assert report.errors == len(found)


def test_smollm2_fp8_block_keeps_qkv_and_serves_the_rest(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from models import smollm2_fp32

    src = smollm2_fp32()
    out = _quantize(src, tmp_path / "smollm2-fp8-block")
    plan = build_plan(Checkpoint.open(src), make_scheme("fp8-block"))
    d = {x.name: x for x in plan.decisions}
    tensors = Checkpoint.open(out).tensors
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    for layer in range(30):
        p = f"model.layers.{layer}"
        for leaf in ("q_proj", "k_proj", "v_proj"):
            name = f"{p}.self_attn.{leaf}"
            assert tensors[f"{name}.weight"].info.dtype.code == "F32"  # the source's dtype
            assert name in ignore
            assert "q_proj has 576 output rows, not a multiple of 128" in d[f"{name}.weight"].reason
        for name in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            assert tensors[f"{p}.{name}.weight"].info.dtype.code == "F8_E4M3", name
    assert verify(out).errors == 0
