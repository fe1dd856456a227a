"""The card's first sections: what the checkpoint is, and how it was made (from the manifest and config)."""

from __future__ import annotations

from typing import Any

from weightsmith.card.cite import Citations
from weightsmith.card.sources import INSPECT_FILE, CardSources
from weightsmith.core.terminal import markdown_code
from weightsmith.formats.declaration import read_declaration
from weightsmith.io import names
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.io.manifest import (
    MANIFEST_FILE,
    CalibrationRecord,
    Manifest,
    MethodRecord,
    RecipeRecord,
    RuleRecord,
)
from weightsmith.io.provenance import EVERY_TOKEN, ROUTED
from weightsmith.io.serving import named_target
from weightsmith.quantization.prepasses import PRE_PASSES
from weightsmith.quantization.presets import PRESETS
from weightsmith.schemes import REGISTRY
from weightsmith.searches import SEARCHES

M, C, INS = MANIFEST_FILE, CONFIG_FILE, INSPECT_FILE

#: Why tensors of a category are never a quantization target (the plan's rules, by category).
_NOT_TARGETED = {
    "embeddings": "a lookup table, not a Linear layer",
    "norms": "1-D norm weights, not Linear layers",
}


#: Draft kinds named in `architectures` (e.g. `LlamaForCausalLMEagle3`), as the card writes them.
_DRAFT_KINDS = ("EAGLE3", "EAGLE", "Medusa", "MTP")


def draft_kind(config: dict[str, Any]) -> str | None:
    """The kind of speculative draft the config declares, or None for a standalone model."""
    if "dflash_config" in config:
        return "DFlash"
    arch = " ".join(config.get("architectures") or [])
    for kind in _DRAFT_KINDS:
        if kind.lower() in arch.lower():
            return kind
    return None


def article(kind: str) -> str:
    """`A` or `An`, by how the kind is spoken (EAGLE, MTP: a vowel sound)."""
    return "An" if kind[0] in "AEIOU" or kind == "MTP" else "A"


def what_it_is(src: CardSources, c: Citations, base: str | None) -> list[str]:
    """One paragraph: a quantized checkpoint of BASE, or a draft tied to its target."""
    config = src.config
    scheme = c.text(src.manifest.recipe.scheme, M, "recipe.scheme")
    archs = config.get("architectures") or []
    arch = c.text(archs[0], C, "architectures[0]") if archs else "an architecture config.json does not name"
    of = f"`{base}`" if base else f"the {arch} model it was quantized from"
    kind = draft_kind(config)
    if kind is None:
        return [f"A {scheme} quantized checkpoint of {of} ({arch}), in compressed-tensors format, which vLLM loads."]
    lines = [
        f"{article(kind)} {kind} speculative draft ({arch}), quantized with {scheme}. A draft is specific to the "
        "target model it was trained against: it proposes tokens that only that target verifies, so serve it with "
        "that target."
    ]
    layer_ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if layer_ids:
        ids = ", ".join(c.num(str(v), C, f"dflash_config.target_layer_ids[{i}]") for i, v in enumerate(layer_ids))
        lines[0] += f" It reads the target's hidden states at layers {ids}."
    target = named_target(config)
    if target is not None:
        lines[0] += f" Its target: {c.text(target.name, C, target.field)}."
    else:
        lines[0] += " config.json does not name the target."
    return lines


def _scheme_lines(recipe: RecipeRecord, c: Citations) -> list[str]:
    """The scheme in its own words: one line, or one per recipe rule that quantized anything."""
    rules = [(i, r) for i, r in enumerate(recipe.rules or []) if r.quantized]
    if len(rules) <= 1:
        return [_scheme_line(recipe, rules[0] if rules else None, c)]
    lines = []
    for i, rule in rules:
        where = f"recipe.rules[{i}]"
        targets = ", ".join(c.text(t, M, f"{where}.targets[{j}]") for j, t in enumerate(rule.targets))
        lines.append(
            f"- **Scheme** for {targets}: {c.text(rule.scheme, M, where + '.scheme')} (config group "
            f"{c.text(rule.config_group or '', M, where + '.config_group')}, "
            f"{c.num(str(rule.quantized), M, where + '.quantized')} weights): "
            f"{c.text(rule.weights, M, where + '.weights')}."
        )
    return lines


def _scheme_line(recipe: RecipeRecord, rule: tuple[int, RuleRecord] | None, c: Citations) -> str:
    bits = c.num(str(recipe.num_bits), M, "recipe.num_bits")
    group = recipe.group_size
    grouped = f", group size {c.num(str(group), M, 'recipe.group_size')}" if group else ""
    head = (
        f"- **Scheme**: {c.text(recipe.scheme, M, 'recipe.scheme')} (config group "
        f"{c.text(recipe.config_group, M, 'recipe.config_group')}, {bits}-bit{grouped})"
    )
    if rule is not None:  # manifests from version 2 on: the scheme's own words
        i, r = rule
        return f"{head}: {c.text(r.weights, M, f'recipe.rules[{i}].weights')}."
    sym = "symmetric" if recipe.symmetric else "asymmetric (with a zero point)"
    kind = "FP4 (E2M1)" if recipe.scheme.startswith("nvfp4") else "integer"
    return f"{head}: {kind} weights, {sym}; activations stay 16-bit."


def _ignore_reason(entry: str, preset: str | None, tied: bool) -> str:
    known = PRESETS.get(preset) if preset else None
    if known is not None and entry in known.ignore:
        return f"preset {preset}: {known.why}"
    if known is not None and known.ignore_by_suffix and names.is_suffix_entry(entry):
        return f"a Linear listed by its name within the layer (preset {preset}), because {known.runtime_names}"
    if names.is_lm_head(entry):
        why = "vLLM's ParallelLMHead is not a Linear target"
        return why + ("; here it is tied to the embeddings, so no separate tensor is stored" if tied else "")
    if names.is_router(entry):
        return "MoE router (vLLM builds it as ReplicatedLinear)"
    return "listed in the recipe's ignore list"


def how_made(src: CardSources, c: Citations) -> list[str]:
    """Scheme, group size, scale search, what stayed unquantized and why, tool version, source hashes."""
    m = src.manifest
    recipe = m.recipe
    search = recipe.scale_search
    search_line = (
        f"{c.text(search, M, 'recipe.scale_search')}: {SEARCHES[search].CARD if search in SEARCHES else 'as named'}"
        if search
        else "none: plain round-to-nearest from each group's absolute maximum"
    )
    t = m.tensors
    lines = [
        *_scheme_lines(recipe, c),
        f"- **Scale search**: {search_line}.",
        f"- **Tensors**: {c.num(str(t.quantize), M, 'tensors.quantize')} quantized, "
        f"{c.num(str(t.keep), M, 'tensors.keep')} kept as they were, "
        f"{c.num(str(t.decode), M, 'tensors.decode')} FP8 weights decoded to BF16, "
        f"{c.num(str(t.drop), M, 'tensors.drop')} FP8 scales consumed.",
    ]
    if recipe.preset:
        known = PRESETS.get(recipe.preset)
        why = f": {known.why}" if known is not None else ""
        lines.append(f"- **Preset**: {c.text(recipe.preset, M, 'recipe.preset')}{why}.")
    tied = bool(src.config.get("tie_word_embeddings"))
    for i, entry in enumerate(recipe.ignore):
        reason = _ignore_reason(entry, recipe.preset, tied)
        lines.append(f"- **Kept unquantized** {c.text(entry, M, f'recipe.ignore[{i}]')}: {reason}.")
    for row in src.inspect["rows"]:
        untargeted = _NOT_TARGETED.get(row["key"])
        if untargeted and row["params"] and row["bits_per_param"] is not None:
            bits = c.num(f"{row['bits_per_param']:.3f}", INS, f"rows[{row['key']}].bits_per_param")
            lines.append(f"- **Kept at source precision** {row['key']} ({bits} bits per parameter): {untargeted}.")
    lines += _pre_pass_lines(m, c)
    lines += _calibration_lines(m, src.config, c)
    lines += _coverage(src, c)
    lines.append(
        f"- **Tool**: {m.tool.name} {c.text(m.tool.version, M, 'tool.version')}, "
        f"run {c.text(m.created_utc, M, 'created_utc')}."
    )
    for shard, info in m.source.files.items():
        size = c.num(f"{info.bytes:,}", M, f"source.files[{shard}].bytes")
        digest = info.sha256
        hashed = f"sha256 {c.text(digest, M, f'source.files[{shard}].sha256')}" if digest else "not hashed (--no-hash)"
        lines.append(f"- **Source file** {markdown_code(shard)}: {size} bytes, {hashed}.")
    return lines


_ACTIVATIONS = {
    "original": "the original model's activations",
    "quantized": "the quantized model's own activations (its layers dequantized, as it is served)",
}
#: A quantize run's statistics taken on a quantization of its source (`calibrate` of a weight-only twin).
_SERVED_TWIN = "the activations of a quantization of the source model (its layers dequantized, as served)"


def _calibration_lines(m: Manifest, config: dict[str, Any], c: Citations) -> list[str]:
    """Scales measured on calibration data by weightsmith, not transplanted, each with its own record.

    The quantize run's record (`calibration`) gave the static activation scales of a calibrated
    scheme among the rules, and the KV-cache scales where the config declares a KV-cache scheme and
    either that run wrote them (its sizes count KV scales after, none before) or no calibrated
    scheme used the statistics. KV-cache scales added later by `calibrate-kv` have their own
    record (`kv_calibration`), which says where they came from whatever the first record says.
    """
    cal, kv_cal = m.calibration, m.kv_calibration
    if cal is None and kv_cal is None:
        return []
    if m.method is not None:
        return [_method_line(m, c)]
    made = []
    calibrated = [
        r.scheme
        for r in m.recipe.rules or []
        if r.quantized and getattr(REGISTRY.get(r.scheme), "NEEDS_CALIBRATION", False)
    ]
    if calibrated:
        made.append(f"the static activation scales of {', '.join(sorted(set(calibrated)))}")
    decl = read_declaration(config, None)
    declared = decl is not None and decl.kv_args is not None
    kv = m.sizes.by_category.get(names.KV_SCALES_CATEGORY)
    written_here = kv is not None and kv.bytes_after > 0 and kv.bytes_before == 0
    if declared and kv_cal is None and (written_here or not calibrated):
        made.append(_KV_WORDS)
    lines = []
    if cal is not None and (made or kv_cal is None):
        twin = cal.activations == "quantized" and m.quantize_calibration is not None
        lines.append(_measured(" and ".join(made) or "statistics", cal, "calibration", c, twin))
    if declared and kv_cal is not None:
        lines.append(_measured(_KV_WORDS, kv_cal, "kv_calibration", c))
    return lines


_KV_WORDS = (
    "the KV-cache scales (k_scale, v_scale: the largest |K| after the rotary embedding and |V| entering the cache, "
    "/ 448)"
)


def _measured(what: str, cal: CalibrationRecord, field: str, c: Citations, twin: bool = False) -> str:
    """One card line: `what` was measured on the tokens and text of the record at `field` (`twin`: on
    a quantization of the source, not on this checkpoint)."""
    tokens = c.num(f"{cal.tokens:,}", M, f"{field}.tokens")
    sequences = c.num(str(cal.sequences), M, f"{field}.sequences")
    seq_len = c.num(str(cal.seq_len), M, f"{field}.seq_len")
    return (
        f"- **Calibration**: {what} measured by weightsmith (not transplanted from "
        f"another checkpoint) as the largest values on {tokens} tokens ({sequences} sequences of up to {seq_len}) "
        f"of {c.text(cal.text, M, f'{field}.text')} (sha256 {c.text(cal.text_sha256, M, f'{field}.text_sha256')}"
        f"), on {_SERVED_TWIN if twin else _ACTIVATIONS.get(cal.activations, 'activations as recorded')}"
        f"{_EXPERT_WORDS.get(cal.experts or '', '').format(c.text(cal.experts or '', M, f'{field}.experts'))}."
    )


#: What `Provenance.experts` says, in the card's words (its value cited).
_EXPERT_WORDS = {
    ROUTED: "; each routed expert's over the tokens the model routed to it ({})",
    EVERY_TOKEN: "; each routed expert's over every token, the outputs still routed as the model routes ({})",
}


def _pre_pass_lines(m: Manifest, c: Citations) -> list[str]:
    """The transform applied before quantizing (`--pre-pass sinq`): why kept tensors differ from the source."""
    p = m.pre_pass
    if p is None:
        return []
    pre_pass = PRE_PASSES.get(p.name)
    words = (
        "as named"
        if pre_pass is None
        else pre_pass.CARD.format(iterations=c.num(str(p.iterations), M, "pre_pass.iterations"))
    )
    return [f"- **Pre-pass**: {c.text(p.name, M, 'pre_pass.name')}: {words}"]


def _method_line(m: Manifest, c: Citations) -> str:
    """Weights whose integer values a data-aware method (GPTQ) chose on calibration text."""
    method, cal = m.method, m.calibration
    assert method is not None and cal is not None
    return (
        f"- **Calibration**: the integer weight values chosen by {c.text(method.name, M, 'method.name')} "
        f"(dampening {c.num(str(method.dampening), M, 'method.dampening')} of the mean Hessian diagonal, blocks of "
        f"{c.num(str(method.block_size), M, 'method.block_size')} columns"
        + (f", activation order {c.text(method.actorder, M, 'method.actorder')}" if method.actorder else "")
        + ") with the input Hessians of "
        f"{c.num(f'{cal.tokens:,}', M, 'calibration.tokens')} tokens "
        f"({c.num(str(cal.sequences), M, 'calibration.sequences')} sequences of up to "
        f"{c.num(str(cal.seq_len), M, 'calibration.seq_len')}) of "
        f"{c.text(cal.text, M, 'calibration.text')} (sha256 {c.text(cal.text_sha256, M, 'calibration.text_sha256')}), "
        "each layer fed the outputs of the layers before it as quantized; the scales are round-to-nearest's."
        + _method_exceptions(method, c)
    )


def _method_exceptions(method: MethodRecord, c: Citations) -> str:
    """What the method did not do as it says for every module: modules left to round-to-nearest, MoE
    experts whose Hessian had fewer tokens than their width; and whether every expert saw every token."""
    out = ""
    if method.all_experts:
        out += (
            " Every MoE expert's Hessian was made from every token (`--all-experts`), the outputs routed as the "
            "model routes."
        )
    if method.rtn_fallback:
        n = c.num(f"{len(method.rtn_fallback):,}", M, "method.rtn_fallback")
        out += f" {n} modules were left to round-to-nearest (each with its reason in `method.rtn_fallback`)."
    if method.few_tokens:
        n = c.num(f"{len(method.few_tokens):,}", M, "method.few_tokens")
        out += (
            f" {n} MoE expert modules saw fewer calibration tokens than their input width: their Hessians "
            "were made invertible by the dampening, not the data."
        )
    return out


def _coverage(src: CardSources, c: Citations) -> list[str]:
    """The quantization config against the tensors, as `inspect` found it."""
    cov = src.inspect.get("quantization")
    if not cov:
        return []
    out = []
    for gi, group in enumerate(cov["statuses"]):
        n = c.num(f"{group['modules']:,}", INS, f"quantization.statuses[{gi}].modules")
        patterns = ", ".join(markdown_code(p["pattern"]) for p in group["patterns"][:8])
        more = f" and {len(group['patterns']) - 8} more patterns" if len(group["patterns"]) > 8 else ""
        out.append(f"- **{group['status'].capitalize()}** (inspect): {n} Linear modules: {patterns}{more}.")
    return out
