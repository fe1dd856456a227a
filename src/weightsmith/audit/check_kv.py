"""KV-cache scales: a declared static KV-cache scheme needs a usable k and v scale per attention layer.

When a checkpoint declares an FP8 KV cache but a layer has no scale, vLLM falls back to 1.0 with a
single warning in the log, and accuracy quietly drops. Scales must be one FP32 value each (vLLM:
"Only support per-tensor scaling factor"), finite and positive.
"""

from __future__ import annotations

import math

from weightsmith.audit.findings import ERROR, INFO, WARNING, Finding
from weightsmith.audit.modules import Located, Module
from weightsmith.audit.values import SmallReads
from weightsmith.formats.declaration import QuantDeclaration
from weightsmith.io import names


def attention_modules(modules: dict[str, Module]) -> list[str]:
    """Attention modules, recognised as the parents of a K (or fused QKV) projection."""
    found = {
        m.name.rpartition(".")[0] for m in modules.values() if names.leaf(m.name) in names.ATTENTION_KEY_PROJECTIONS
    }
    return sorted(found, key=lambda a: (len(a), a))


def check_kv_scales(
    decl: QuantDeclaration | None, modules: dict[str, Module], tensors: dict[str, Located], reads: SmallReads
) -> tuple[list[Finding], str]:
    attention = attention_modules(modules)
    stored = [n for n in tensors if names.is_kv_scale_name(n)]
    if decl is None or decl.kv_cache is None:
        if not stored:
            return [], f"no KV-cache scheme declared, no KV scales stored ({len(attention)} attention layers)"
        example = stored[0]
        return [
            Finding(
                "kv.undeclared-scales",
                WARNING,
                f"is one of {len(stored)} KV-cache scales stored while no KV-cache scheme is declared; "
                "the runtime ignores them "
                "(declare quantization_config.kv_cache_scheme, or kv_cache_quant_algo for ModelOpt)",
                tensors[example].shard,
                example,
            )
        ], f"{len(stored)} KV scales stored but no scheme declared"
    scope = f"{len(attention)} attention layers, KV cache {decl.kv_cache} declared in {decl.kv_source}"
    if not decl.kv_static:
        return [], scope + " (dynamic: no scales needed)"
    if not attention:
        return [
            Finding(
                "kv.no-attention",
                INFO,
                "no attention layer was recognised (no k_proj or qkv_proj), so KV scales were not checked",
                None,
            )
        ], scope
    found: list[Finding] = []
    for module in attention:
        for kind in ("k", "v"):
            found += _scale_findings(module, kind, decl, tensors, reads)
    return found, scope


def _scale_findings(
    attention: str, kind: str, decl: QuantDeclaration, tensors: dict[str, Located], reads: SmallReads
) -> list[Finding]:
    candidates = names.kv_scale_names(attention, kind)
    name = next((n for n in candidates if n in tensors), None)
    if name is None:
        accepted = ", ".join(n.rpartition(attention + ".")[2] for n in candidates)
        shard = next((loc.shard for n, loc in tensors.items() if n.startswith(attention + ".")), None)
        return [
            Finding(
                "kv.missing-scale",
                ERROR,
                f"is missing: {decl.kv_source} declares a static KV cache ({decl.kv_cache}), "
                f"so vLLM will use scale 1.0 for this layer; add it (any of {accepted}) "
                "or transplant it from a calibrated checkpoint",
                shard,
                candidates[0],
            )
        ]
    located = tensors[name]
    info = located.info
    found = []
    if name.endswith(f".{names.KV_SCALE}") and kind == "k":
        found.append(
            Finding(
                "kv.deprecated-name",
                WARNING,
                "uses the deprecated single kv_scale; vLLM copies it into k and v with a warning, "
                "store k_scale and v_scale",
                located.shard,
                name,
            )
        )
    if info.dtype.code != "F32":
        found.append(
            Finding(
                "kv.scale-dtype",
                ERROR,
                f"is {info.dtype.code}; KV-cache scales are loaded as FP32, store it as F32",
                located.shard,
                name,
            )
        )
        return found
    if info.numel != 1:
        found.append(
            Finding(
                "kv.scale-shape",
                ERROR,
                f"has shape {list(info.shape)}; vLLM only supports one per-tensor scale (shape [] or [1])",
                located.shard,
                name,
            )
        )
        return found
    value = reads.scalar(located.shard, name)
    if not (math.isfinite(value) and value > 0):
        found.append(
            Finding(
                "kv.scale-value",
                ERROR,
                f"is {value}; a KV-cache scale must be finite and positive "
                "(vLLM treats <= 0 as 'not loaded' and uses 1.0)",
                located.shard,
                name,
            )
        )
    return found
