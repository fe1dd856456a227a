"""`card --check`: find every cited number in an existing card and compare it with its source now."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from weightsmith.card.cite import find_cited
from weightsmith.card.render import render_card
from weightsmith.card.sources import CARD_FILE, reload
from weightsmith.errors import WeightsmithError


@dataclass
class CheckResult:
    checked: int
    mismatches: list[str] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def read_card(card: Path, strict: bool = True) -> str:
    """The card's Markdown; not UTF-8 is a one-line error (or, when not `strict`, replaced characters)."""
    data = card.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not strict:
            return data.decode("utf-8", errors="replace")
        raise WeightsmithError(f"is not UTF-8 text (byte {exc.start:,})", file=card, code="card.not-utf8") from None


def check_card(folder: Path) -> CheckResult:
    """Re-derive every source of `folder`'s card and compare each cited value with what it gives now."""
    card = folder / CARD_FILE
    if not card.is_file():
        raise WeightsmithError("has no README.md to check; write one with `weightsmith card`", file=folder)
    cited = find_cited(read_card(card))
    if not cited:
        raise WeightsmithError("cites no numbers; was it written by `weightsmith card`?", file=card)
    src = reload(folder)
    _, now = render_card(src, base=None, license_id=None)
    result = CheckResult(len(cited), provenance=src.provenance)
    for item in cited:
        expected = now.by_source.get(item.source)
        if expected is None:
            result.mismatches.append(
                f"{CARD_FILE}:{item.line}: {item.value} cites {item.source}, which no longer gives a value"
            )
        elif expected.value != item.value:
            result.mismatches.append(
                f"{CARD_FILE}:{item.line}: {item.value} does not match {item.source}, which gives {expected.value}"
            )
    return result
