"""The pair: does the draft fit this target (layers it reads, hidden size, vocabulary, recorded target)?

A draft reads the hidden states of specific target layers and proposes tokens from the target's
vocabulary; one built for another target (or, for DFlash, another precision of it) loads and then
proposes tokens that are rejected. Where nothing records the target, that is said, not passed.
"""

from __future__ import annotations

import os
from pathlib import Path

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import open_regular
from weightsmith.io.checkpoint import CONFIG_FILE
from weightsmith.io.manifest import MANIFEST_FILE
from weightsmith.io.serving import CARD_FILE, TARGET_FIELDS, named_target
from weightsmith.preflight.report import LOAD, NOTE, SLOW, Item, Side

#: The front matter that records a draft's base_model sits at the top of its card: this much is read.
CARD_HEAD_BYTES = 1 << 20


def check_pair(tgt: Side, drf: Side, method: str) -> list[Item]:
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


def _aux_layers(drf: Side, method: str) -> tuple[list[object] | None, str]:
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


def _card_head(card: Path) -> str | None:
    """The first `CARD_HEAD_BYTES` of the draft's card, where its front matter is; None when it has no card.

    The card is a stranger's file of any size or kind: a FIFO is never opened, and a 3 GiB card costs
    no more than its head.
    """
    try:
        with os.fdopen(open_regular(card), "rb") as f:
            return f.read(CARD_HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:  # none, or not a regular file: the draft's card records nothing
        return None


def _recorded_target(tgt: Side, drf: Side, method: str) -> Item:
    """Where the draft records its target (config fields, its card's base_model), is it this target?"""
    records: list[tuple[str, str]] = []
    named = named_target(drf.config)
    if named is not None:
        records.append((named.name, f"{CONFIG_FILE} {named.field}"))
    card = drf.found.root / CARD_FILE
    head = _card_head(card)
    if head is not None:
        from weightsmith.io.serving import read_metadata

        try:
            base = read_metadata(head, card).get("base_model")
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
