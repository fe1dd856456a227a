"""The card's Hub front matter: written as plain YAML, then read back with `huggingface_hub`.

The Hub reads a card's metadata with `huggingface_hub`'s model-card parser, so that parser (run
offline: it only parses text) is what decides whether the front matter says what we meant. A value
YAML reads differently (`license: on` is the boolean true), or a repository id the Hub would refuse,
stops the card before it is written; `card --check` compares the card's metadata, as the Hub reads
it, with what the sources give now.
"""

from __future__ import annotations

from typing import Any

from weightsmith.card import made
from weightsmith.card.sources import CardSources
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import short_repr
from weightsmith.io.serving import hub, read_metadata


def is_repo_id(value: str) -> bool:
    """True for an ORG/NAME the Hub accepts."""
    try:
        check_repo_id(value, "repo")
    except WeightsmithError:
        return False
    return True


def check_repo_id(value: str, option: str) -> str:
    """`value` if the Hub accepts it as a repository id (ORG/NAME), else one line naming the option."""
    hub()
    from huggingface_hub import utils

    try:
        utils.validate_repo_id(value)
    except utils.HFValidationError as exc:
        raise WeightsmithError(f"{option} {value!r} is not a Hub repository id: {exc}", code="usage") from None
    if value.count("/") != 1:
        raise WeightsmithError(f"{option} {value!r} is not ORG/NAME", code="usage")
    return value


def metadata(src: CardSources, base: str | None, license_id: str | None) -> dict[str, Any]:
    """What the front matter states, in the order it is written."""
    recipe = src.manifest.recipe
    archs = src.config.get("architectures") or []
    kind = made.draft_kind(src.config)
    meta: dict[str, Any] = {}
    if base:
        meta |= {"base_model": base, "base_model_relation": "quantized"}
    if license_id:
        meta["license"] = license_id
    meta["library_name"] = "transformers"
    if kind is None and any(a.endswith("ForCausalLM") for a in archs):
        meta["pipeline_tag"] = "text-generation"
    tags = ["weightsmith", "compressed-tensors", recipe.scheme, f"{recipe.num_bits}-bit"]
    if kind is not None:
        tags.append("speculative-decoding")
    meta["tags"] = tags
    return meta


def front_matter(meta: dict[str, Any]) -> list[str]:
    """`key: value` lines and lists, between `---` lines (a subset of YAML any parser reads)."""
    lines = ["---"]
    for key, value in meta.items():
        if isinstance(value, list):
            lines += [f"{key}:", *(f"- {v}" for v in value)]
        else:
            lines.append(f"{key}: {value}")
    return [*lines, "---"]


def checked_front_matter(meta: dict[str, Any]) -> list[str]:
    """The front matter lines for `meta`, after reading them back gives `meta` exactly.

    A value holding a character a reader would not see as itself (a control character, an escape
    sequence, a right-to-left override) is refused first: YAML reads most of them back unchanged, and
    the front matter is metadata, so it is not written in escapes either.
    """
    for key, value in meta.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not item.isprintable():
                raise WeightsmithError(
                    f"front matter field {key}: {short_repr(item, 80)} holds a character a reader would not see",
                    code="usage",
                )
    lines = front_matter(meta)
    read = read_metadata("\n".join([*lines, ""]))
    for key, value in meta.items():
        if read.get(key) != value:
            raise WeightsmithError(
                f"front matter field {key}: {value!r} is read back by huggingface_hub as {read.get(key)!r}",
                code="usage",
            )
    return lines
