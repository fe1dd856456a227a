"""A config is resolved once per name pattern only where no entry can tell layer or expert numbers apart.

`QuantDeclaration.resolve` remembers (scheme, ignored) per pattern (`layers.*.mlp.experts.*.up_proj`)
when `targets.number_blind` says every target and ignore entry answers alike for names that differ
in their numbers; otherwise each module is resolved by its own name. Both ways must give what
`scheme_for` and `ignored` give for each name.
"""

from __future__ import annotations

import pytest

from weightsmith.audit.modules import Module, layer_of, pattern_of
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.declaration import QuantDeclaration, read_declaration
from weightsmith.formats.targets import number_blind
from weightsmith.io.names import is_lm_head

LEAVES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate",
          "mlp.shared_expert.gate_proj", "mlp.shared_expert.down_proj")  # fmt: skip
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
NAMES = [
    *(f"model.layers.{i}.{leaf}" for i in (0, 1, 2, 10, 11, 12, 21) for leaf in LEAVES),
    *(f"model.layers.{i}.mlp.experts.{e}.{p}" for i in (1, 11) for e in (0, 1, 10, 100) for p in PROJECTIONS),
    "lm_head",
]  # fmt: skip


def _modules() -> list[Module]:
    return [Module(n, pattern_of(n), layer_of(n + "."), lm_head=is_lm_head(n)) for n in NAMES]


def _decl(targets: list[str], ignore: list[str]) -> QuantDeclaration:
    qc = ct.quantization_config("group_0", ct.PACK_QUANTIZED, ct.weight_args(4, True, 128), ignore)
    qc["config_groups"]["group_0"]["targets"] = targets
    decl = read_declaration({"model_type": "llama", "quantization_config": qc}, None)
    assert decl is not None
    return decl


@pytest.mark.parametrize(
    ("entry", "blind"),
    [
        ("Linear", True),
        ("lm_head", True),
        ("re:.*self_attn\\..*", True),
        ("re:.*mlp\\.gate$", True),
        ("re:.*(q|k|v)_proj$", True),
        ("re:(?:gate|up)_proj*", True),
        ("model.layers.3.mlp.down_proj", False),  # an exact name with a layer number
        ("re:.*layers\\.1\\..*", False),  # a digit
        ("re:.*\\d.*", False),  # a class escape
        ("re:.*experts\\.[0-9]+\\..*", False),  # a character class
        ("re:.*layers\\..\\.mlp.*", False),  # one character: single-digit layers only
        ("re:.*layers\\..+.+\\.mlp.*", False),  # `+` counts: two characters at least
        ("re:.*layers\\.(.*){2}\\.mlp", False),  # a counted repeat
        ("re:(?i).*MLP.*", False),  # an inline flag
        ("re:.*.*?x", False),  # a lazy `?`
    ],
)
def test_number_blind_entries(entry: str, blind: bool) -> None:
    assert number_blind([entry]) is blind
    assert number_blind(["Linear", "re:.*self_attn\\..*", entry]) is blind


@pytest.mark.parametrize(
    ("targets", "ignore", "by_pattern"),
    [
        (["Linear"], ["lm_head", "re:.*self_attn\\..*", "re:.*mlp\\.gate$"], True),
        (["re:.*experts.*", "re:.*shared_expert.*"], ["lm_head"], True),
        (["Linear"], ["lm_head", "re:.*layers\\.1\\..*"], False),  # layer 1 ignored, 10-12 not
        (["Linear"], ["re:.*experts\\.1\\..*"], False),  # expert 1 ignored, 10 and 100 not
        (["re:.*layers\\.1[01]\\..*"], ["lm_head"], False),  # layers 10 and 11 targeted only
        (["Linear"], ["model.layers.2.self_attn.q_proj"], False),  # an exact name with a number
        (["Linear"], ["re:.*layers\\..\\.mlp.*"], False),  # single-digit layers ignored
    ],
)
def test_resolve_gives_each_modules_own_answer(targets: list[str], ignore: list[str], by_pattern: bool) -> None:
    decl = _decl(targets, ignore)
    assert (decl._by_pattern is not None) is by_pattern
    answers = set()
    for module in _modules():
        expected = (decl.scheme_for(module.name, module.lm_head), decl.ignored(module.name))
        assert decl.resolve(module) == expected, module.name
        answers.add((module.pattern, expected))
    if not by_pattern:  # each case differs within some pattern: resolving by pattern would have been wrong
        patterns = [pattern for pattern, _ in answers]
        assert len(patterns) > len(set(patterns))
