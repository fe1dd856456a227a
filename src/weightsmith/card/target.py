"""Target assignment: which target model a speculative draft belongs to, from what the draft records.

A draft proposes tokens that only its own target verifies at a useful rate: an EAGLE3 draft reads
that target's hidden states, a DFlash draft reads the hidden states of specific target layers and
is calibrated against the target at one precision. So the card says what names the target (the
draft's config.json, the bench arms that served it) and says plainly when nothing does.
"""

from __future__ import annotations

from weightsmith.bench.paths import DRAFT, served_model
from weightsmith.bench.results import ArmInfo
from weightsmith.card.cite import Citations
from weightsmith.card.sources import BENCH_FILE, CardSources
from weightsmith.core.terminal import markdown_code
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.io.manifest import MANIFEST_FILE
from weightsmith.io.serving import TARGET_FIELDS, NamedTarget, named_target


def drafted_arms(src: CardSources) -> list[ArmInfo]:
    """The bench arms that served a draft model (llama.cpp `-md`, vLLM's speculative config)."""
    if src.bench is None:
        return []
    return [a for a in src.bench.arms if DRAFT in a.files or any(f"${DRAFT}" in t for t in a.command or [])]


def target_assignment(src: CardSources, c: Citations) -> list[str]:
    """What names this draft's target, each fact cited, then the conclusion in one sentence."""
    config = src.config
    kind_line = (
        "A DFlash draft is specific to the target and the precision it was calibrated against"
        if "dflash_config" in config
        else "A draft is specific to the target it was trained against"
    )
    lines = [f"{kind_line}: with any other target it proposes tokens that are rejected, and serving gets slower.", ""]
    target = named_target(config)
    if target is not None:
        lines.append(f"- **config.json names the target**: {c.text(target.name, CONFIG_FILE, target.field)}.")
    else:
        lines.append(f"- config.json names no target (none of {', '.join(f'`{f}`' for f in TARGET_FIELDS)}).")
    ids = (config.get("dflash_config") or {}).get("target_layer_ids") or []
    if ids:
        shown = ", ".join(c.num(str(v), CONFIG_FILE, f"dflash_config.target_layer_ids[{i}]") for i, v in enumerate(ids))
        lines.append(
            f"- **Target layers it reads** (`dflash_config.target_layer_ids`): {shown}; the target must have more "
            "layers than the highest of these, and they must be the layers the draft was trained on."
        )
    preset = src.manifest.recipe.preset
    lines.append(
        f"- {MANIFEST_FILE} records no target"
        + (f" (it records the preset {c.text(preset, MANIFEST_FILE, 'recipe.preset')})." if preset else ".")
    )
    arms = drafted_arms(src)
    for arm in arms:
        draft = arm.files.get(DRAFT, "a draft the command names")
        this = " (this folder's name)" if draft == src.folder.resolve().name else ""
        lines.append(
            f"- **Measured** ({BENCH_FILE}): arm {markdown_code(arm.name)} served target "
            f"{c.text(served_model(arm) or 'not recorded', BENCH_FILE, f'arms[{arm.name}].model')} with draft "
            f"{markdown_code(draft)}{this}."
        )
    if src.bench is not None and not arms:
        lines.append(f"- No arm in {BENCH_FILE} served a draft model.")
    lines += ["", _conclusion(target, arms)]
    return lines


def _conclusion(target: NamedTarget | None, arms: list[ArmInfo]) -> str:
    if target is not None:
        return (
            f"Use this draft with {markdown_code(target.name)}, at the precision it was trained or calibrated against."
        )
    if arms:
        return (
            "The only evidence of the target is the benchmark above: config.json does not declare one, so check "
            "with whoever trained the draft before serving it with another model."
        )
    return (
        "**The target cannot be told from this folder**: config.json names none, the manifest records none, and no "
        "benchmark served this draft. Serve it only with the target its trainer names."
    )
