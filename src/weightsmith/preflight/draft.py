"""The draft against vLLM's code: what the model file vLLM loads it with calls, reads and builds.

A quantized draft dies on load where that code calls a quant-config method the config class does
not define, reads `<linear>.weight` of a Linear the draft stores packed (it has no `weight` then),
builds an embedding or LM head without the quant config while the draft stores it quantized, or
keeps a fused layer's shards unquantized by entries vLLM never tests them by (a draft's own quant
config has no `packed_modules_mapping`, so only the fused name is matched against `ignore`).
"""

from __future__ import annotations

from weightsmith.audit.modules import Module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.preflight import code
from weightsmith.preflight.report import LOAD, NOTE, Item, Side, unread
from weightsmith.preflight.source import VllmSource
from weightsmith.quantization.presets import PRESETS, reads_words

#: The preset that keeps a DFlash draft's attention projections BF16 (`quantize.presets.PRESETS`).
DFLASH_PRESET = "dflash-draft"


def check_draft_code(src: VllmSource, drf: Side, method: str) -> list[Item]:
    archs = drf.architectures
    entries = code.registry_entries(src)
    if not entries:
        what, why = "which model file vLLM loads the draft with", code.missing(src, code.REGISTRY, "a model table")
        return [unread("draft.model-file", what, why, drf.where(CONFIG_FILE))]
    resolved = code.draft_model_file(entries, src, archs, method)
    if resolved is None:
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
    files = (model_file, *code.PROPOSERS.get(method, ()))
    for rel in files:
        if not code.parses(src, rel):
            items.append(unread("draft.model-file", f"what {rel} calls and reads", code.missing(src, rel)))
    items += _quant_calls(src, drf, model_file)
    for rel in files:
        items += _weight_reads(src, drf, rel, method)
    items += _plain_builds(src, drf, model_file, method)
    items += _fused_ignores(src, drf, model_file)
    return items


def _fused_ignores(src: VllmSource, drf: Side, model_file: str) -> list[Item]:
    """Shards of a fused layer kept unquantized by `ignore` entries that do not match the fused name, where
    vLLM builds the draft's layers with a quant config that has no `packed_modules_mapping`: it then tests
    only the fused name (`qkv_proj`), builds the layer quantized, and the BF16 shards have nowhere to load."""
    decl = drf.decl
    if decl is None or decl.method != ct.QUANT_METHOD:
        return []
    built = code.draft_quant_config(src, model_file)
    if built is None:
        return []
    groups: dict[str, list[Module]] = {}
    for module in drf.modules.values():
        partners = names.fused_partners(module.name) if module.linear_like else None
        if partners is not None and partners[1] and names.leaf(partners[0]) in names.FUSED_LAYERS:
            groups.setdefault(partners[0], []).append(module)
    items = []
    for fused, shards in groups.items():
        if any(m.quantized or not decl.ignored(m.name) for m in shards) or decl.claims(fused):
            continue
        if decl.scheme_for(fused, False) is None:  # no config group would take the fused layer either
            continue
        parts = "/".join(names.leaf(m.name) for m in shards)
        items.append(
            Item(
                "draft.fused-ignore",
                LOAD,
                f"the draft keeps {parts} unquantized by `ignore` entries that name the shards, and vLLM builds "
                f"the draft's layers with a quant config of its own, made without the model's packed_modules_mapping, "
                f"so it tests the fused layer's own name, which no entry matches: it builds {names.leaf(fused)} "
                "quantized, and the draft's BF16 weights have no parameter to load into (AttributeError)",
                f"add an `ignore` entry that matches the fused name too, e.g. `re:.*\\.(q|k|v|qkv)_proj$`, as "
                f"`--preset {DFLASH_PRESET}` does",
                (built.call, built.made),
                file=drf.module_file(shards[0]),
                tensor=shards[0].name,
            )
        )
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
                file=drf.module_file(first),
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
    what = f"the quant-config methods {model_file} calls on the draft's {quant_method!r} config"
    if cls is None:
        why = code.missing(src, code.QUANT_TABLE, f"{quant_method!r} in method_to_config")
        return [unread("draft.quant-config", what, why, drf.where(CONFIG_FILE))]
    items: list[Item] = []
    for call in code.quant_config_calls(src, model_file):
        defined = code.class_defines(src, cls, call.method)
        if defined is None:  # no such class, whatever the method (so the first call finds it): one finding
            why = f"class {cls} not found under {code.QUANTIZATION}"
            return [unread("draft.quant-config", what, why, drf.where(CONFIG_FILE))]
        if defined:
            continue
        if call.guard is not None:
            items.append(
                Item(
                    "draft.quant-config-call",
                    NOTE,
                    f"{model_file} calls quant_config.{call.method}(), which {cls} does not define, behind a guard "
                    "(patched)",
                    evidence=(call.guard, call.evidence),
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
        # the module read, stored fused (a Laguna DFlash draft ships `qkv_proj`) or as the parts vLLM fuses
        parts = (read.module, *names.FUSED_LAYERS.get(read.module, ()))
        quantized = [m for m in drf.modules.values() if names.leaf(m.name) in parts and m.quantized]
        if not quantized:
            continue
        first = quantized[0]
        if read.guard is not None:
            items.append(
                Item(
                    "draft.weight-read",
                    NOTE,
                    f"{rel} reads {read.module}.weight only where the layer is unquantized (guarded), so the "
                    f"draft's quantized {read.module} is handled{_releases(method, read.module)}",
                    evidence=(read.guard, read.evidence),
                )
            )
            continue
        fix = (
            f"quantize the draft with `--preset {DFLASH_PRESET}` (keeps q/k/v_proj BF16)"
            if method == "dflash"
            else f"keep {', '.join(parts[1:] or parts)} unquantized (list them in the recipe's ignore)"
        )
        items.append(
            Item(
                "draft.weight-read",
                LOAD,
                f"{len(quantized)} quantized {'/'.join(dict.fromkeys(names.leaf(m.name) for m in quantized))} "
                f"module(s) in the draft, and {rel} reads "
                f"{read.module}.weight directly; a quantized {read.module} has no `weight`"
                + (
                    ", so loading dies with AttributeError: 'QKVParallelLinear' object has no attribute 'weight'"
                    if read.module == "qkv_proj"
                    else ""
                )
                + _releases(method, read.module),
                fix,
                (read.evidence,),
                file=drf.module_file(first),
                tensor=first.name,
            )
        )
    return items


def _releases(method: str, module: str) -> str:
    """What the DFlash preset records of other releases' `qkv_proj.weight` reads, for this finding's words."""
    reads = PRESETS[DFLASH_PRESET].reads
    if method != "dflash" or module != "qkv_proj" or not reads:
        return ""
    return (
        f" (releases on record: unguarded in {reads_words(reads, guarded=False)}; guarded in "
        f"{reads_words(reads, guarded=True)})"
    )
