"""How a checkpoint folder says what serves it: its card and front matter, the target a draft names,
and the `vllm serve` line that serves it.

Read by `preflight` (does this draft belong to this target?) and written into the card by `card`; kept
here, below both, so that each reads the same facts the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.terminal import shell_line

#: The model card of a checkpoint folder (the Hub shows it).
CARD_FILE = "README.md"
#: What the serve line says where the folder names no target: the reader fills it in.
TARGET_VARIABLE = "$TARGET"


def hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise WeightsmithError(
            "the card's front matter is read with huggingface_hub, a dependency of weightsmith that is not installed "
            "(pip install huggingface_hub)",
            code="card.no-huggingface-hub",
        ) from None
    return huggingface_hub


def read_metadata(markdown: str, file: str | Path = CARD_FILE) -> dict[str, Any]:
    """The card's metadata as `huggingface_hub.ModelCard` reads it, {} without front matter (offline;
    a block that does not parse is one line naming `file`)."""
    library = hub()
    if not markdown.startswith("---"):
        return {}
    try:
        card = library.ModelCard(markdown, ignore_metadata_errors=False)
    except Exception as exc:  # the parser raises YAML's and its own errors; any of them means unreadable
        detail = " ".join(str(exc).split())[:200]
        raise WeightsmithError(f"front matter is not readable: {detail}", file=file, code="card.front") from None
    data: dict[str, Any] = card.data.to_dict()
    return data


#: Where a draft's config.json may name its target, as the training tools write it.
TARGET_FIELDS = ("target_model", "target_model_name_or_path", "dflash_config.target_model")


@dataclass(frozen=True)
class NamedTarget:
    """The target a draft's config.json names, and the field that names it."""

    name: str
    field: str


def named_target(config: dict[str, Any]) -> NamedTarget | None:
    """The first target config.json names, or None."""
    for path in TARGET_FIELDS:
        value: object = config
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            return NamedTarget(value, path)
    return None


def serve_command(model: str | None, spec: dict[str, Any] | None = None, flags: Sequence[str] = ()) -> str:
    """`vllm serve MODEL [--speculative-config 'JSON'] [FLAGS]`: the one spelling of the command, shared by
    the card and `weightsmith preflight`. Every word is quoted (`shell_line`): a path or a config's name is a
    stranger's text, and pasting the line must run exactly what it says. `model` None is `$TARGET`."""
    words = ["--speculative-config", json.dumps(spec)] if spec is not None else []
    served = TARGET_VARIABLE if model is None else shell_line([model])
    return " ".join(["vllm serve", served, shell_line([*words, *flags])]).rstrip()
