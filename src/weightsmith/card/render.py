"""The whole card: Hub front matter, then the sections that have something measured behind them."""

from __future__ import annotations

from weightsmith.card import made, measured, serving
from weightsmith.card.cite import Citations
from weightsmith.card.sources import CardSources


def front_matter(src: CardSources, base: str | None, license_id: str | None) -> list[str]:
    """Hub metadata as simple `key: value` lines and one `tags` list (a subset of YAML any parser reads)."""
    recipe = src.manifest.recipe
    archs = src.config.get("architectures") or []
    lines = ["---"]
    if base:
        lines += [f"base_model: {base}", "base_model_relation: quantized"]
    if license_id:
        lines.append(f"license: {license_id}")
    lines.append("library_name: transformers")
    if made.draft_kind(src.config) is None and any(a.endswith("ForCausalLM") for a in archs):
        lines.append("pipeline_tag: text-generation")
    tags = ["weightsmith", "compressed-tensors", recipe.scheme, f"{recipe.num_bits}-bit"]
    if made.draft_kind(src.config) is not None:
        tags.append("speculative-decoding")
    lines += ["tags:", *(f"- {t}" for t in tags), "---"]
    return lines


def render_card(src: CardSources, base: str | None, license_id: str | None) -> tuple[str, Citations]:
    """The card's Markdown and the registry of every number in it."""
    c = Citations()
    title = src.folder.resolve().name
    lines = [*front_matter(src, base, license_id), "", f"# {title}", "", *made.what_it_is(src, c, base), ""]
    lines += [
        "Every number below is followed, in the Markdown, by a comment naming the file and field it came from; "
        "`weightsmith card --check` re-derives each one and names any that no longer match.",
        "",
    ]
    lines += ["## How it was made", "", *made.how_made(src, c), ""]
    lines += ["## Where the bytes are", "", *measured.where_bytes(src, c), ""]
    lines += ["## Verified", "", *measured.verified(src, c), ""]
    if src.eval is not None:
        lines += ["## Fidelity", "", *measured.fidelity(src, c), ""]
    if src.bench is not None:
        lines += ["## Serving", "", *serving.serving(src, c), ""]
    lines += ["## Provenance and credit", "", *_provenance(src, c, base, license_id), ""]
    return "\n".join(lines), c


def _provenance(src: CardSources, c: Citations, base: str | None, license_id: str | None) -> list[str]:
    m = src.manifest
    lines = []
    if base:
        lines.append(
            f"- Base model: [`{base}`](https://huggingface.co/{base}); all credit for the model is its authors'."
        )
    if license_id:
        lines.append(f"- License: `{license_id}`, as the base model's.")
    lines.append(
        f"- Derived from the {c.text(m.recipe.source_format, made.M, 'recipe.source_format')} checkpoint at "
        f"{c.text(m.source.path, made.M, 'source.path')} by "
        f"weightsmith {c.text(m.tool.version, made.M, 'tool.version')} (`weightsmith quantize`)."
    )
    return lines
