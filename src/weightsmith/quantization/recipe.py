"""Recipes: ordered rules that give each Linear-like weight its scheme, several schemes per checkpoint.

A recipe file is TOML:

    ignore = ["lm_head"]                 # kept as they are (exact names or re: regexes)

    [[rule]]
    targets = ["category:routed experts"]
    scheme = "nvfp4a16"

    [[rule]]
    targets = ["category:attention", "category:shared expert"]
    scheme = "fp8-dynamic"

Each rule's `targets` are exact module names, `re:` regexes (matched as vLLM matches them, from the
start, against the module and its fused name such as `qkv_proj`), `category:NAME` (the categories
`inspect` reports: routed experts, shared expert, attention, attention gate, dense mlp, other) or
`Linear` (every Linear-like weight). A rule may set `group_size` and `scale_search` for its scheme
(without it, the scheme's default search; `scale_search = "none"` is plain round-to-nearest).
The first rule that matches a module gives its scheme, as compressed-tensors and vLLM resolve config
groups; a module no rule matches is kept. `--scheme NAME` is the one-rule recipe `targets = ["Linear"]`.
A rule may name a calibrated scheme (`nvfp4`, `fp8`: static activation scales); the run then needs
`--calibration STATS`, and only that rule's modules take scales from it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import read_text_file
from weightsmith.core.terminal import echo, short_repr
from weightsmith.engine.gptq_defaults import GPTQ_DAMPENING as GPTQ_DAMPENING  # the flow's defaults, set
from weightsmith.engine.gptq_defaults import LLM_COMPRESSOR_DAMPENING as LLM_COMPRESSOR_DAMPENING  # by the solver
from weightsmith.formats.targets import LINEAR, Targets
from weightsmith.io import names
from weightsmith.schemes import REGISTRY, Scheme, make_scheme
from weightsmith.searches import SEARCHES

CATEGORY = "category:"
#: Categories a rule may target: those that hold Linear-like weights.
TARGET_CATEGORIES = tuple(
    c
    for c in names.CATEGORIES
    if c not in ("embeddings", "lm_head", "norms", "router", names.KV_SCALES_CATEGORY, names.QUANT_PARAMS_CATEGORY)
)
_RULE_KEYS = {"targets", "scheme", "group_size", "scale_search"}
_TOP_KEYS = {"ignore", "rule"}
#: A recipe is a short text; anything larger is not one.
MAX_RECIPE_BYTES = 1 << 20
#: The largest group size a recipe or `--group-size` may ask for: input columns per scale, and no
#: checkpoint has a Linear wider than this.
MAX_GROUP_SIZE = 1 << 20


@dataclass(frozen=True)
class Rule:
    """One ordered rule: the targets it claims and the scheme it gives them."""

    targets: tuple[str, ...]
    scheme: Scheme

    @cached_property
    def _names(self) -> Targets:
        """The targets that name modules (exact or `re:`), compiled once."""
        return Targets((t for t in self.targets if t != LINEAR and not t.startswith(CATEGORY)), "recipe target")

    def matches(self, module: str) -> bool:
        """Whether a Linear-like weight's module falls under this rule."""
        if LINEAR in self.targets:
            return True
        if names.category(f"{module}.{names.WEIGHT}") in self._categories:
            return True
        fused = names.fused_partners(module)
        return self._names.matches(module, *([fused[0]] if fused else []))

    @cached_property
    def _categories(self) -> frozenset[str]:
        return frozenset(t[len(CATEGORY) :] for t in self.targets if t.startswith(CATEGORY))


@dataclass(frozen=True)
class Recipe:
    """Ordered rules (first match wins) plus modules to keep; `file` is where it was read from, if anywhere."""

    rules: tuple[Rule, ...]
    ignore: tuple[str, ...] = ()
    file: Path | None = None

    @classmethod
    def single(cls, scheme: Scheme) -> Recipe:
        """The one-rule recipe of `--scheme`: every Linear-like weight."""
        return cls((Rule((LINEAR,), scheme),))

    @property
    def mixed(self) -> bool:
        return len(self.rules) > 1

    def rule_for(self, module: str) -> Rule | None:
        return next((r for r in self.rules if r.matches(module)), None)


#: Why, said alike for `--scale-search` and a recipe's `scale_search`.
GPTQ_GRID_ONLY = "--method gptq fixes its grid from each weight before its first column"


def load_recipe(path: Path, *, gptq: bool = False) -> Recipe:
    """Read and check a recipe file: one line naming the file and the key for anything wrong.

    `gptq`: a rule naming a search GPTQ cannot start from (`gptq_refusal`) is refused: its modules would
    have no grid GPTQ can start from."""
    raw = _read(path)
    try:
        doc = tomllib.loads(raw)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise WeightsmithError(f"is not valid TOML ({exc})", file=path, code="recipe.invalid") from None
    except ValueError:  # the only other thing tomllib raises: an integer longer than Python will convert
        raise WeightsmithError(
            "is not valid TOML (an integer of more than 4300 digits)", file=path, code="recipe.invalid"
        ) from None
    _known(doc, _TOP_KEYS, "top level", path)
    ignore = _strings(doc.get("ignore", []), "ignore", path)
    Targets(ignore, "ignore", path)  # a bad regex is refused here, naming the file
    rules_doc = doc.get("rule")
    if not isinstance(rules_doc, list) or not rules_doc:
        raise WeightsmithError("needs at least one [[rule]] table", file=path, code="recipe.invalid")
    rules = tuple(_rule(r, i, path, gptq) for i, r in enumerate(rules_doc))
    return Recipe(rules, tuple(ignore), path)


def _read(path: Path) -> str:
    return read_text_file(path, MAX_RECIPE_BYTES, "recipe file", code="recipe.invalid")


def _known(doc: dict[str, Any], allowed: set[str], where: str, path: Path) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise WeightsmithError(
            f"{where}: unknown key {echo(unknown[0])} (known: {', '.join(sorted(allowed))})",
            file=path,
            code="recipe.key",
        )


def _strings(value: object, where: str, path: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise WeightsmithError(f"{where} must be a list of non-empty strings", file=path, code="recipe.invalid")
    return list(value)


def _rule(doc: object, index: int, path: Path, gptq: bool) -> Rule:
    where = f"rule {index + 1}"
    if not isinstance(doc, dict):
        raise WeightsmithError(f"{where} is not a table", file=path, code="recipe.invalid")
    _known(doc, _RULE_KEYS, where, path)
    targets = _strings(doc.get("targets"), f"{where}: targets", path)
    if not targets:
        raise WeightsmithError(f"{where}: targets is empty", file=path, code="recipe.invalid")
    Targets(targets, f"{where}: target", path)  # a bad regex is refused here, naming the rule
    for target in targets:
        if target.startswith(CATEGORY) and target[len(CATEGORY) :] not in TARGET_CATEGORIES:
            raise WeightsmithError(
                f"{where}: unknown category {echo(target)} (known: {', '.join(TARGET_CATEGORIES)})",
                file=path,
                code="recipe.invalid",
            )
    scheme_name = doc.get("scheme")
    if not isinstance(scheme_name, str):
        raise WeightsmithError(
            f"{where}: scheme must be one of {', '.join(REGISTRY)}", file=path, code="recipe.invalid"
        )
    group_size = doc.get("group_size")
    if group_size is not None and (type(group_size) is not int or not 0 < group_size <= MAX_GROUP_SIZE):
        raise WeightsmithError(
            f"{where}: group_size must be an integer from 1 to {MAX_GROUP_SIZE:,}, got {short_repr(group_size)}",
            file=path,
            code="recipe.invalid",
        )
    search = doc.get("scale_search")
    if search is not None and not isinstance(search, str):
        raise WeightsmithError(f"{where}: scale_search must be a string", file=path, code="recipe.invalid")
    if gptq and gptq_refusal(search) is not None:
        raise WeightsmithError(
            f"{where}: {GPTQ_GRID_ONLY}; it does not take scale_search = {search!r} (use another or leave it out)",
            file=path,
            code="recipe.invalid",
        )
    try:
        scheme = make_scheme(scheme_name, group_size, search)
    except WeightsmithError as exc:
        # the schemes word their option errors for the command line; a recipe spells the options as keys
        message = exc.message.replace("--group-size", "group_size").replace("--scale-search", "scale_search")
        raise WeightsmithError(f"{where}: {message}", file=path, code="recipe.invalid") from None
    return Rule(tuple(targets), scheme)


def gptq_refusal(search: str | None) -> str | None:
    """Why `--method gptq` cannot start from the scale search named `search` (None: it can, or no such search)."""
    found = SEARCHES.get(search or "")
    return None if found is None else found.GPTQ_REFUSAL
