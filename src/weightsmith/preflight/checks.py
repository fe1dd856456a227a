"""Preflight: what this vLLM will do with this target (and draft), before minutes of loading.

Each check joins a fact about the checkpoints (read from headers and configs, never loaded) with a
fact about vLLM's source (`code`), and reports what the user will see at serve time: it will not
load, it will load but serve wrong numbers, it will be slower than it could, or a note. The first
three make the command exit 1: each is a failure or a silent degradation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightsmith import names
from weightsmith.audit.check_kv import check_kv_scales
from weightsmith.audit.findings import ERROR, INFO, WARNING
from weightsmith.audit.modules import Module, group_modules
from weightsmith.audit.quant_config import MODELOPT, QuantDeclaration, read_declaration
from weightsmith.audit.survey import Survey, survey
from weightsmith.audit.values import SmallReads
from weightsmith.card.publish import serve_command
from weightsmith.card.target import TARGET_FIELDS, named_target
from weightsmith.checkpoint import CONFIG_FILE
from weightsmith.errors import WeightsmithError
from weightsmith.manifest import MANIFEST_FILE
from weightsmith.preflight import code
from weightsmith.preflight.code import Evidence
from weightsmith.preflight.source import VllmSource

LOAD, WRONG, SLOW, NOTE = "will not load", "serves wrong numbers", "slower than it could", "note"
#: The project's severity for each impact: what fails or silently degrades is an error or a warning.
SEVERITY = {LOAD: ERROR, WRONG: ERROR, SLOW: WARNING, NOTE: INFO}
IMPACTS = (LOAD, WRONG, SLOW, NOTE)
#: The `dflash-draft` preset's reason, quoted by the fix for a quantized draft attention projection.
DFLASH_PRESET = "dflash-draft"
CARD_FILE = "README.md"
FRESH_CACHE = "VLLM_CACHE_ROOT=$(mktemp -d)"
#: `--json` output identifies itself, so the card can tell a preflight report from any other JSON.
SCHEMA, SCHEMA_VERSION = "weightsmith.preflight", 1


@dataclass(frozen=True)
class Item:
    """One preflight finding: what happens, why (vLLM's own lines), and what to do."""

    check: str
    impact: str
    message: str
    fix: str | None = None
    evidence: tuple[Evidence, ...] = ()
    #: The checkpoint file (relative to its folder, prefixed by the folder's role) it concerns.
    file: str | None = None
    tensor: str | None = None

    @property
    def severity(self) -> str:
        return SEVERITY[self.impact]

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "impact": self.impact,
            "severity": self.severity,
            "message": self.message,
            "fix": self.fix,
            "file": self.file,
            "tensor": self.tensor,
            "evidence": [e.as_dict() for e in self.evidence],
        }


@dataclass
class Preflight:
    """The whole answer: which vLLM, which pair, the findings and the command to serve it."""

    vllm: str
    vllm_version: str
    target: str
    draft: str | None
    method: str | None
    items: list[Item] = field(default_factory=list)
    serve: str = ""

    @property
    def failed(self) -> bool:
        """Something would fail or silently degrade."""
        return any(i.severity in (ERROR, WARNING) for i in self.items)

    def as_dict(self) -> dict[str, Any]:
        counts = {impact: sum(i.impact == impact for i in self.items) for impact in IMPACTS}
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "vllm": {"path": self.vllm, "version": self.vllm_version},
            "target": self.target,
            "draft": self.draft,
            "method": self.method,
            "passed": not self.failed,
            "counts": counts,
            "findings": [i.as_dict() for i in sorted(self.items, key=lambda i: IMPACTS.index(i.impact))],
            "serve": self.serve,
        }


@dataclass
class Side:
    """One checkpoint of the pair as preflight needs it."""

    role: str
    found: Survey
    decl: QuantDeclaration | None
    modules: dict[str, Module]

    @property
    def config(self) -> dict:
        config = self.found.config
        return config if isinstance(config, dict) else {}

    def get(self, key: str) -> Any:
        """A config value, also looked for in `text_config` (multimodal targets keep the LM there)."""
        if key in self.config:
            return self.config[key]
        text = self.config.get("text_config")
        return text.get(key) if isinstance(text, dict) else None

    def where(self, file: str | None) -> str | None:
        return f"{self.role}/{file}" if file else self.role

    @property
    def depth(self) -> int | None:
        layers = self.get("num_hidden_layers")
        if isinstance(layers, int) and not isinstance(layers, bool):
            return layers
        seen = [m.layer for m in self.modules.values() if m.layer is not None]
        return max(seen) + 1 if seen else None

    @property
    def quant_method(self) -> str | None:
        """The `quant_method` vLLM looks its config class up by (`modelopt_fp4` for ModelOpt NVFP4)."""
        if self.decl is None:
            return None
        if self.decl.method == MODELOPT:
            algo = " ".join(s.format or "" for s in self.decl.schemes)
            return "modelopt_fp4" if "FP4" in algo.upper() else "modelopt"
        return self.decl.method


def open_side(path: Path, role: str) -> Side:
    found = survey(path)
    if found.single_file:
        raise WeightsmithError(
            "is one shard; preflight needs the checkpoint folder (its config.json names the architecture)",
            file=path,
            code="file.missing",
        )
    found.refuse_hostile_index()
    return Side(role, found, read_declaration(found.config, found.hf_quant_config), group_modules(found.headers))


def preflight(
    target: Path,
    vllm: Path | None = None,
    draft: Path | None = None,
    method: str | None = None,
    k: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Preflight:
    """Every check for TARGET (and DRAFT) against the vLLM at VLLM; `env` stands for os.environ."""
    env = os.environ if env is None else env
    src = VllmSource.open(vllm)
    tgt = open_side(target, "target")
    drf = open_side(draft, "draft") if draft is not None else None
    if drf is not None and method is None:
        method = infer_method(drf)
    result = Preflight(str(src.where), src.version, str(target), str(draft) if draft else None, method)
    items = result.items
    for side in (tgt, drf):
        if side is not None:
            items += _readable(side)
            items += _kv(side)
    moe_flag = None
    for side in (tgt, drf):
        if side is not None:
            found, flag = _w4a4_moe(src, side)
            items += found
            moe_flag = moe_flag or flag
    prefix = None
    if drf is not None and method is not None:
        items += _draft_code(src, drf, method)
        items += _pair(tgt, drf, method)
        found, prefix = _compile_cache(src, drf, env)
        items += found
    result.serve = _serve(target, draft, method, k, tgt, moe_flag, prefix)
    return result


def infer_method(draft: Side) -> str:
    """The speculative method a draft's config implies, as vLLM's `SpeculativeConfig` infers it."""
    if "dflash_config" in draft.config:
        return "dflash"
    listed = draft.config.get("architectures")
    archs = " ".join(a for a in listed if isinstance(a, str)) if isinstance(listed, list) else ""
    if "Eagle3" in archs or "eagle_aux_hidden_state_layer_ids" in draft.config:
        return "eagle3"
    raise WeightsmithError(
        "does not say which speculative method it is for (no dflash_config, no Eagle3 architecture); pass --method",
        file=draft.found.root / CONFIG_FILE,
        code="preflight.method",
    )


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


def _fp8_kv(side: Side) -> bool:
    """An FP8 KV cache declared with static scales that all ship: the serve line can carry it."""
    decl = side.decl
    if decl is None or decl.kv_cache is None or not decl.kv_static:
        return False
    declared = decl.kv_cache.startswith("8-bit float") or "FP8" in decl.kv_cache.upper()
    return declared and not _kv(side)


def _w4a4(decl: QuantDeclaration, module: Module) -> bool:
    scheme = decl.scheme_for(module.name, module.lm_head)
    if scheme is None or decl.ignored(module.name):
        return False
    if decl.method == MODELOPT:
        return (scheme.format or "").upper() == "NVFP4"
    return scheme.weight_type == "float" and scheme.num_bits == 4 and scheme.input_scale is not None


def _w4a4_moe(src: VllmSource, side: Side) -> tuple[list[Item], str | None]:
    """W4A4 NVFP4 experts, and the MoE backends of this vLLM that drop their activation scales."""
    decl = side.decl
    if decl is None:
        return [], None
    experts = [m for m in side.modules.values() if ".experts." in m.name and m.linear_like and _w4a4(decl, m)]
    if not experts:
        return [], None
    backends = code.nvfp4_moe_backends(src)
    count = f"{len(experts)} MoE expert Linear(s) are W4A4 NVFP4 (static activation scales)"
    if backends is None or not backends.drops:
        return [
            Item(
                "moe.w4a4-backend",
                NOTE,
                f"{count}; this vLLM's NVFP4 MoE backend code ({code.NVFP4_MOE}) was not found or drops no "
                "activation scale, so which backends honour them cannot be checked",
                file=side.where(experts[0].params[next(iter(experts[0].params))].shard),
                tensor=experts[0].name,
            )
        ], None
    keep = [backends.flag[b] for b in backends.keeps if b in backends.flag]
    flag = f"--moe-backend {keep[0]}" if keep else None
    dropped = ", ".join(sorted(backends.drops))
    return [
        Item(
            "moe.w4a4-backend",
            WRONG,
            f"{count}; under the {dropped} MoE backend(s), which vLLM picks where FP4 does not run natively, they "
            "load fine and the activation scales are dropped: W4A16 numerics, no warning",
            (f"pass `{flag}`" if flag else "choose a fused CUTLASS MoE backend")
            + f" ({', '.join(keep) or 'none found'} keep the activation scales); on GPUs without native FP4 the "
            "numbers this checkpoint was measured with cannot be reproduced",
            tuple(backends.drops[b] for b in sorted(backends.drops)),
            file=side.where(experts[0].params[next(iter(experts[0].params))].shard),
            tensor=experts[0].name,
        )
    ], flag


# ---- the draft against vLLM's code -------------------------------------------------------------------


def _draft_code(src: VllmSource, drf: Side, method: str) -> list[Item]:
    listed = drf.config.get("architectures")
    archs = [a for a in listed if isinstance(a, str)] if isinstance(listed, list) else []
    resolved = code.draft_model_file(src, archs, method)
    if resolved is None:
        if src.text(code.REGISTRY) is None:
            return [Item("draft.model-file", NOTE, f"this vLLM has no {code.REGISTRY}; the draft's code was not read")]
        return [
            Item(
                "draft.architecture",
                LOAD,
                f"names architecture(s) {archs or 'none'}, which vLLM's registry does not know under method "
                f"{method!r} (it looks them up as {code.ARCH_PREFIX.get(method, '')}<architecture>)",
                "set `architectures` to one this vLLM registers, or use a vLLM that has this draft's model",
                file=drf.where(CONFIG_FILE),
            )
        ]
    arch, model_file, registry_line = resolved
    items = [
        Item(
            "draft.model-file",
            NOTE,
            f"vLLM loads this draft as {arch} from {model_file}",
            evidence=(registry_line,),
            file=drf.where(CONFIG_FILE),
        )
    ]
    for rel in (model_file, *code.PROPOSERS.get(method, ())):
        if not code.parses(src, rel):
            items.append(
                Item(
                    "draft.model-file",
                    NOTE,
                    f"{rel} is missing or does not parse; what it calls and reads was not checked",
                )
            )
    items += _quant_calls(src, drf, model_file)
    for rel in (model_file, *code.PROPOSERS.get(method, ())):
        items += _weight_reads(src, drf, rel, method)
    items += _plain_builds(src, drf, model_file, method)
    return items


def _plain_builds(src: VllmSource, drf: Side, model_file: str, method: str) -> list[Item]:
    """An embedding or LM head vLLM builds without the quant config, which the draft stores quantized."""
    items = []
    for build in code.plain_builds(src, model_file):
        quantized = [m for m in drf.modules.values() if names.leaf(m.name) == build.module and m.quantized]
        if not quantized:
            continue
        first = quantized[0]
        fix = (
            "quantize the draft with `--preset eagle3-draft` (keeps embed_tokens and lm_head BF16)"
            if method == "eagle3"
            else f"keep {build.module} unquantized (list it in the recipe's ignore)"
        )
        items.append(
            Item(
                "draft.plain-build",
                LOAD,
                f"the draft stores {build.module} quantized, and {model_file} builds it without a quant config "
                "(a plain BF16 `weight`), so its packed tensors have nowhere to load",
                fix,
                (build.evidence,),
                file=drf.where(first.params[next(iter(first.params))].shard),
                tensor=first.name,
            )
        )
    return items


def _quant_calls(src: VllmSource, drf: Side, model_file: str) -> list[Item]:
    """A quant-config method the draft's config class lacks, called outside a guard: an AttributeError on load."""
    quant_method = drf.quant_method
    if quant_method is None:
        return []
    cls = code.quant_config_class(src, quant_method)
    if cls is None:
        return [
            Item(
                "draft.quant-config",
                NOTE,
                f"declares quant_method {quant_method!r}, which this vLLM's quantization table does not name; "
                "the methods its model file calls on it were not checked",
                file=drf.where(CONFIG_FILE),
            )
        ]
    items = []
    for call in code.quant_config_calls(src, model_file):
        if code.class_defines(src, cls, call.method) is not False:
            continue
        if call.guarded:
            items.append(
                Item(
                    "draft.quant-config-call",
                    NOTE,
                    f"{model_file} calls quant_config.{call.method}(), which {cls} does not define, behind a guard "
                    "(patched)",
                    evidence=(call.guard, call.evidence) if call.guard else (call.evidence,),
                )
            )
            continue
        items.append(
            Item(
                "draft.quant-config-call",
                LOAD,
                f"the draft declares {quant_method} ({cls}), and {model_file} calls quant_config.{call.method}() "
                f"unconditionally; {cls} has no such method, so loading dies with AttributeError: "
                f"'{cls}' object has no attribute '{call.method}'",
                f'guard the call (`hasattr(self.quant_config, "{call.method}") and ...`) in that file on every '
                "node, or use a vLLM whose model file does not call it",
                (call.evidence,),
                file=drf.where(CONFIG_FILE),
            )
        )
    return items


def _weight_reads(src: VllmSource, drf: Side, rel: str, method: str) -> list[Item]:
    """A direct `<linear>.weight` read where the draft stores that Linear quantized (no `weight` then)."""
    items = []
    for read in code.weight_reads(src, rel):
        parts = names.FUSED_LAYERS.get(read.module, (read.module,))
        quantized = [m for m in drf.modules.values() if names.leaf(m.name) in parts and m.quantized]
        if not quantized:
            continue
        first = quantized[0]
        if read.guarded:
            items.append(
                Item(
                    "draft.weight-read",
                    NOTE,
                    f"{rel} reads {read.module}.weight only where the layer is unquantized (guarded), so the "
                    f"draft's quantized {read.module} is handled",
                    evidence=(read.guard, read.evidence) if read.guard else (read.evidence,),
                )
            )
            continue
        fix = (
            f"quantize the draft with `--preset {DFLASH_PRESET}` (keeps q/k/v_proj BF16)"
            if method == "dflash"
            else f"keep {', '.join(parts)} unquantized (list them in the recipe's ignore)"
        )
        items.append(
            Item(
                "draft.weight-read",
                LOAD,
                f"{len(quantized)} quantized {'/'.join(parts)} module(s) in the draft, and {rel} reads "
                f"{read.module}.weight directly; a quantized {read.module} has no `weight`, so loading dies with "
                "AttributeError: 'QKVParallelLinear' object has no attribute 'weight'"
                if read.module == "qkv_proj"
                else f"{len(quantized)} quantized {'/'.join(parts)} module(s) in the draft, and {rel} reads "
                f"{read.module}.weight directly; a quantized {read.module} has no `weight`",
                fix,
                (read.evidence,),
                file=drf.where(first.params[next(iter(first.params))].shard),
                tensor=first.name,
            )
        )
    return items


# ---- the pair ------------------------------------------------------------------------------------------


def _pair(tgt: Side, drf: Side, method: str) -> list[Item]:
    items: list[Item] = []
    depth = tgt.depth
    ids, field_name = _aux_layers(drf, method)
    if ids is not None and depth is not None:
        bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < depth]
        if bad:
            items.append(
                Item(
                    "pair.layer-ids",
                    LOAD,
                    f"{field_name} {ids} names layer(s) {bad} but the target has {depth} layers (0..{depth - 1}); "
                    "those hidden states are never produced",
                    "pair the draft with the target it was trained on (same depth), or fix the layer ids",
                    file=drf.where(CONFIG_FILE),
                )
            )
    elif ids is None and method == "eagle3" and depth is not None:
        items.append(
            Item(
                "pair.layer-ids",
                NOTE,
                f"the draft names no eagle_aux_hidden_state_layer_ids; vLLM's default reads target layers "
                f"(2, {depth // 2}, {depth - 3}) of {depth}",
                file=drf.where(CONFIG_FILE),
            )
        )
    for key in ("hidden_size", "vocab_size"):
        a, b = tgt.get(key), drf.get(key)
        if a is not None and b is not None and a != b:
            items.append(
                Item(
                    f"pair.{key.replace('_', '-')}",
                    LOAD,
                    f"the draft's {key} is {b} and the target's is {a}; the draft reads the target's hidden states "
                    "and shares its vocabulary, so they must agree",
                    "pair the draft with the target it was trained on",
                    file=drf.where(CONFIG_FILE),
                )
            )
    items.append(_recorded_target(tgt, drf, method))
    return items


def _aux_layers(drf: Side, method: str) -> tuple[list | None, str]:
    config = drf.config
    if method == "dflash":
        nested = config.get("dflash_config")
        ids = nested.get("target_layer_ids") if isinstance(nested, dict) else None
        if ids is None:
            ids = config.get("target_layer_ids")
        return (ids if isinstance(ids, list) else None), "dflash_config.target_layer_ids"
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    nested = config.get("eagle_config")
    if ids is None and isinstance(nested, dict):
        ids = nested.get("eagle_aux_hidden_state_layer_ids")
    return (ids if isinstance(ids, list) else None), "eagle_aux_hidden_state_layer_ids"


def _recorded_target(tgt: Side, drf: Side, method: str) -> Item:
    """Where the draft records its target (config fields, its card's base_model), is it this target?"""
    records: list[tuple[str, str]] = []
    named = named_target(drf.config)
    if named is not None:
        records.append((named.name, f"{CONFIG_FILE} {named.field}"))
    card = drf.found.root / CARD_FILE
    if card.is_file():
        from weightsmith.card.front import read_metadata

        try:
            base = read_metadata(card.read_text(encoding="utf-8", errors="replace"), card).get("base_model")
        except WeightsmithError:
            base = None
        for value in base if isinstance(base, list) else [base]:
            if isinstance(value, str) and value:
                records.append((value, f"{CARD_FILE} base_model"))
    precision = "at the precision it was calibrated against " if method == "dflash" else ""
    if not records:
        return Item(
            "pair.recorded-target",
            NOTE,
            f"the draft records no target ({', '.join(TARGET_FIELDS)} in {CONFIG_FILE}, base_model in its "
            f"{CARD_FILE}; {MANIFEST_FILE} records none), so whether it was built for this target {precision}"
            "cannot be checked",
            file=drf.where(CONFIG_FILE),
        )
    ours = _identities(tgt)
    wrong = [(v, where) for v, where in records if _short(v) not in ours]
    if not wrong:
        return Item(
            "pair.recorded-target",
            NOTE,
            f"the draft records this target ({'; '.join(f'{where}: {v}' for v, where in records)})",
            file=drf.where(CONFIG_FILE),
        )
    value, where = wrong[0]
    return Item(
        "pair.recorded-target",
        SLOW,
        f"the draft records target {value!r} ({where}), not this one ({tgt.found.root.name}); a draft serves its own "
        f"target {precision}only: with another, its proposals are rejected (an NVFP4-built DFlash draft measured "
        "0% acceptance on the FP8 target) and serving is slower than without it",
        f"serve it with {value}, or use the draft built for this target",
        file=drf.where(CONFIG_FILE if where.startswith(CONFIG_FILE) else CARD_FILE),
    )


def _short(name: str) -> str:
    return name.rstrip("/").rpartition("/")[2].lower()


def _identities(tgt: Side) -> set[str]:
    found = {_short(str(tgt.found.root.resolve()))}
    path = tgt.config.get("_name_or_path")
    if isinstance(path, str) and path:
        found.add(_short(path))
    return found


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
        return [
            Item(
                "compile-cache",
                NOTE,
                f"this vLLM has no SpeculativeConfig.compute_hash in {code.SPECULATIVE}; whether its compiled graphs "
                "are keyed on the draft cannot be checked",
            )
        ], None
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
    tgt: Side,
    moe_flag: str | None,
    prefix: str | None,
) -> str:
    spec: dict[str, Any] | None = None
    if draft is not None and method is not None:
        spec = {"method": method, "model": str(draft)}
        if k is not None:
            spec["num_speculative_tokens"] = k
    flags = []
    if _fp8_kv(tgt):
        flags.append("--kv-cache-dtype fp8")
    if moe_flag:
        flags.append(moe_flag)
    command = serve_command(str(target), spec, flags)
    return f"{prefix} {command}" if prefix else command
