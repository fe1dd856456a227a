"""The whole card: Hub front matter, then the sections that have something measured behind them."""

from __future__ import annotations

from weightsmith.bench.paths import file_name, is_local_absolute
from weightsmith.card import claims, front, made, measured, publish, serving, target
from weightsmith.card.cite import Citations
from weightsmith.card.sources import CardSources
from weightsmith.core.terminal import markdown_code, markdown_text, text_file


def render_card(
    src: CardSources, base: str | None, license_id: str | None, repo: str | None = None
) -> tuple[str, Citations]:
    """The card's Markdown and the registry of every number in it.

    Serving it needs `repo` (where the card will be published); Target assignment is written for a
    speculative draft; What we can and cannot claim is always written, saying so where nothing was measured.
    Every name from an input is quoted where it stands (`markdown_code`, `Citations.text`), and the
    whole card is escaped as the terminal output is (`text_file`): it is read with `cat` too.
    """
    c = Citations()
    title = src.folder.resolve().name
    meta = front.metadata(src, base, license_id)
    lines = [*front.checked_front_matter(meta), "", f"# {markdown_text(title)}", ""]
    lines += [*made.what_it_is(src, c, base), ""]
    lines += [
        "Every number below is followed, in the Markdown, by a comment naming the file and field it came from; "
        "`weightsmith card --check` re-derives each one and names any that no longer match.",
        "",
    ]
    if repo:
        lines += ["## Serving it", "", *publish.serving_it(src, c, repo), ""]
    if made.draft_kind(src.config) is not None:
        lines += ["## Target assignment", "", *target.target_assignment(src, c), ""]
    lines += ["## What we can and cannot claim", "", *claims.claims(src, c), ""]
    lines += ["## How it was made", "", *made.how_made(src, c), ""]
    lines += ["## Where the bytes are", "", *measured.where_bytes(src, c), ""]
    lines += ["## Verified", "", *measured.verified(src, c), ""]
    if src.eval is not None:
        lines += ["## Fidelity", "", *measured.fidelity(src, c), ""]
    if src.bench is not None:
        lines += ["## Serving benchmark", "", *serving.serving(src, c), ""]
    lines += ["## Provenance and credit", "", *_provenance(src, c, base, license_id), ""]
    return text_file(lines), c


def _provenance(src: CardSources, c: Citations, base: str | None, license_id: str | None) -> list[str]:
    m = src.manifest
    lines = []
    if base:
        lines.append(
            f"- Base model: [`{base}`](https://huggingface.co/{base}); all credit for the model is its authors'."
        )
    if license_id:
        lines.append(f"- License: {markdown_code(license_id)}, as the base model's.")
    # the source as quantize was given it: a Hub repository at a commit, or a folder; an absolute path names
    # this machine, so only its name is shown
    hub = m.source.hub
    if hub is not None:
        where = (
            f"Hub repository {c.text(hub.repo_id, made.M, 'source.hub.repo_id')} at commit "
            f"{c.text(hub.commit, made.M, 'source.hub.commit')}"
        )
    else:
        path = file_name(m.source.path) if is_local_absolute(m.source.path) else m.source.path
        where = c.text(path, made.M, "source.path")
    lines.append(
        f"- Derived from the {c.text(m.recipe.source_format, made.M, 'recipe.source_format')} checkpoint at "
        f"{where} by weightsmith {c.text(m.tool.version, made.M, 'tool.version')} (`weightsmith quantize`)."
    )
    return lines
