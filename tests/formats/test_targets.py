"""Module matching: vLLM's precedence (`find_matched_target`, `should_ignore_layer`) against compressed-tensors'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from audit.doctor_builders import tiny_moe, write
from weightsmith.audit.verify import verify
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.declaration import read_declaration
from weightsmith.formats.targets import Groups, Targets
from weightsmith.quantization.config_groups import mixed_config
from weightsmith.quantization.recipe import Recipe, Rule
from weightsmith.schemes import make_scheme

ATT = "model.layers.0.self_attn"
MLP = "model.layers.0.mlp"
QKV = tuple(f"{ATT}.{p}_proj" for p in "qkv")


def test_the_first_entry_in_order_wins_whatever_its_kind() -> None:
    t = Targets([r"re:.*\.mlp\..*", f"{MLP}.down_proj", "Linear"], "test")
    assert t.first(f"{MLP}.down_proj") == r"re:.*\.mlp\..*"  # the regex comes first; vLLM does not rank exact names
    assert t.first(f"{ATT}.o_proj") is None  # "Linear" is a class target, never a name
    assert t.resolve(f"{ATT}.o_proj") == "Linear"
    assert t.first("x", f"{MLP}.up_proj") == r"re:.*\.mlp\..*"  # any of several names
    assert Targets([f"{MLP}.down_proj", "re:.*"], "test").first(f"{MLP}.down_proj") == f"{MLP}.down_proj"


def test_regexes_match_from_the_start_only() -> None:
    t = Targets(["re:mlp"], "test")
    assert not t.matches(f"{MLP}.up_proj") and t.matches("mlp.up_proj")


def test_a_class_target_never_claims_lm_head_but_a_name_does() -> None:
    assert Targets(["Linear"], "test").resolve("lm_head") is None
    assert Targets(["Linear", "lm_head"], "test").resolve("lm_head") == "lm_head"
    assert Targets(["re:.*"], "test").resolve("lm_head") == "re:.*"


def test_a_fused_layer_resolves_by_its_name_then_class_then_its_shards() -> None:
    # by the fused layer's own name, which only vLLM sees
    assert Targets([r"re:.*qkv_proj$"], "test").resolve(f"{ATT}.k_proj") == r"re:.*qkv_proj$"
    # class before shards: "Linear" claims qkv_proj although the shards are named
    assert Targets(["Linear", *QKV], "test").resolve(QKV[1]) == "Linear"
    # through its shards: every shard must match, and the first shard's target is the answer
    shards = [r"re:.*\.v_proj$", r"re:.*\.q_proj$", r"re:.*\.k_proj$"]
    assert Targets(shards, "test").resolve(QKV[2]) == r"re:.*\.q_proj$"
    assert Targets(shards[:2], "test").resolve(QKV[0]) is None


def test_routed_experts_resolve_by_their_own_names() -> None:
    expert = "model.layers.0.mlp.experts.3"
    t = Targets([f"{expert}.gate_proj", f"{expert}.up_proj"], "test")
    assert t.resolve(f"{expert}.up_proj") == f"{expert}.up_proj"


def test_ignore_follows_vllm_for_fused_layers() -> None:
    assert Targets([f"{ATT}.qkv_proj"], "test").ignores(QKV[0])  # the fused name, listed exactly
    assert not Targets([r"re:.*qkv_proj$"], "test").ignores(QKV[0])  # a regex on it is never tried by vLLM
    assert Targets([r"re:.*\.(q|k|v)_proj$"], "test").ignores(QKV[1])
    assert not Targets([f"{ATT}.qkv_proj"], "test").ignores(f"{ATT}.o_proj")


def test_a_target_two_groups_name_keeps_its_place_and_the_later_group() -> None:
    groups = Groups({"A": ["re:.*", f"{MLP}.down_proj"], "B": [f"{MLP}.down_proj"]})
    assert groups.group(f"{MLP}.down_proj") == "A"  # re:.* still comes first
    groups = Groups({"A": [f"{MLP}.down_proj", "re:.*"], "B": [f"{MLP}.down_proj"]})
    assert groups.group(f"{MLP}.down_proj") == "B"


@pytest.mark.parametrize(
    ("config", "module", "vllm", "compressed_tensors"),
    [
        # exact names before regexes in compressed-tensors; config order in vLLM
        ({"A": [r"re:.*\.mlp\.down_proj$"], "B": [f"{MLP}.down_proj"]}, f"{MLP}.down_proj", "A", "B"),
        # regexes by their text in compressed-tensors ('.' sorts before 'm')
        ({"A": [r"re:model\..*down_proj$"], "B": [r"re:.*down_proj$"]}, f"{MLP}.down_proj", "A", "B"),
        # a class target claims the fused layer in vLLM before its named shards
        ({"A": ["Linear"], "B": list(QKV)}, QKV[0], "A", "B"),
    ],
)
def test_where_compressed_tensors_picks_another_group(config, module, vllm, compressed_tensors) -> None:
    groups = Groups(config)
    assert groups.group(module) == vllm
    assert groups.compressed_tensors_group(module) == compressed_tensors
    assert groups.conflicts([module]) == [(module, vllm, compressed_tensors)]
    assert groups.conflicts([module], Targets([module], "ignore")) == []


def test_a_bad_regex_is_one_line_naming_its_group_or_left_out() -> None:
    with pytest.raises(WeightsmithError, match=r"config group 'B' target 're:\(\[' is not a valid regular expression"):
        Groups({"A": ["Linear"], "B": ["re:(["]}, "config.json")
    assert Groups({"A": ["Linear"], "B": ["re:(["]}, strict=False).broken == ["re:(["]
    with pytest.raises(WeightsmithError, match=r"--select 're:\('"):
        Targets(["re:("], "--select")


def test_modelopt_wildcards_match_the_whole_name_and_the_fused_name() -> None:
    decl = read_declaration(None, {"quantization": {"quant_algo": "FP8", "exclude_modules": ["*self_attn.qkv*"]}})
    assert decl is not None and decl.ignored(QKV[0]) and not decl.ignored(f"{ATT}.o_proj")
    assert not decl.ignored(f"x.{ATT}.o_proj.y")


def _vllm_match(entry: str, module: str) -> bool:
    """vLLM's `_is_equal_or_regex_match`, with Python's `re`: the reference the matcher is held to."""
    return re.match(entry[3:], module) is not None if entry.startswith("re:") else entry == module


def _modules(layers: int = 2) -> list[str]:
    out = []
    for i in range(layers):
        p = f"model.layers.{i}"
        out += [f"{p}.self_attn.{x}_proj" for x in "qkvo"]
        out += [f"{p}.mlp.{x}_proj" for x in ("gate", "up", "down")]
        out += [f"{p}.mlp.experts.{e}.{x}_proj" for e in range(2) for x in ("gate", "up", "down")]
    return out


def test_our_mixed_configs_resolve_alike_under_both_precedences() -> None:
    """A rule naming one module and a later rule whose compact regex would also name it: each keeps its own."""
    modules = _modules()
    rules = (
        Rule((f"{MLP}.down_proj", "category:routed experts"), make_scheme("w4a16")),
        Rule(("category:dense mlp", "category:attention"), make_scheme("fp8-dynamic")),
    )
    recipe = Recipe(rules)
    quantized = {m: r for m in modules if (r := recipe.rule_for(m)) is not None}
    qc = mixed_config(recipe, quantized, ["lm_head"])
    groups = Groups({g: body["targets"] for g, body in qc["config_groups"].items()})
    assert groups.conflicts(modules) == []
    group_of_rule = dict(zip(rules, qc["config_groups"], strict=True))
    # llm-compressor's model_free_ptq: the first group, in order, with any target that names the module
    by_group = {g: Targets(body["targets"], "test") for g, body in qc["config_groups"].items()}
    for module in modules:
        assert groups.group(module) == group_of_rule[quantized[module]], module
        assert groups.compressed_tensors_group(module) == group_of_rule[quantized[module]], module
        assert next(g for g, t in by_group.items() if t.matches(module)) == group_of_rule[quantized[module]], module


def test_verify_warns_where_the_two_precedences_disagree(tmp_path: Path) -> None:
    model = tiny_moe()
    qc = model.config["quantization_config"]
    group = qc["config_groups"].pop("group_0")
    expert = "model.layers.1.mlp.experts.0.down_proj"
    qc["config_groups"]["experts"] = dict(group, targets=[r"re:.*\.experts\..*"])
    qc["config_groups"]["rest"] = dict(group, targets=["Linear", expert])
    report = verify(write(model, tmp_path / "ckpt"))
    found = [f for f in report.findings if f.check == "quant.group-precedence"]
    assert len(found) == 1, [f.line() for f in report.findings]
    (finding,) = found
    assert finding.severity == "warning" and finding.tensor is not None and finding.tensor.startswith(expert)
    assert "'experts' by vLLM" in finding.message and "to 'rest' by compressed-tensors" in finding.message
    assert report.clean, [f.line() for f in report.findings]


def test_verify_is_quiet_when_one_group_names_each_module(tmp_path: Path) -> None:
    report = verify(write(tiny_moe(), tmp_path / "ckpt"))
    assert not [f for f in report.findings if f.check == "quant.group-precedence"]


@pytest.mark.parametrize(
    "extra",
    [
        [],  # every pattern tried in one alternation
        [r"re:(?i)MODEL\.LAYERS\.1\..*"],  # a global flag: one by one
        [r"re:(model)\.\1"],  # a backreference: one by one
    ],
)
def test_many_patterns_resolve_as_trying_them_one_by_one(extra: list[str]) -> None:
    entries = [
        r"re:.*\.(q|k)_proj$",
        r"re:model\.(?P<x>layers)\.\d+\.mlp\.experts\.1\..*",
        f"{MLP}.down_proj",
        r"re:(.*\.)?o_proj",
        r"re:.*\.experts\.(\d+)\.(up|gate)_proj$",
        *extra,
        r"re:model\.layers\.[01]\.",
    ]
    t = Targets(entries, "test")
    for module in [*_modules(3), "lm_head", "model.layers.1.x", "MODEL.layers.1.y"]:
        expected = next((e for e in entries if _vllm_match(e, module)), None)
        assert t.first(module) == expected, module
        by_text = sorted(e for e in entries if e.startswith("re:") and _vllm_match(e, module))
        exact = module if module in entries else None
        assert t.compressed_tensors_order(module, linear=False) == (exact or (by_text[0] if by_text else None)), module
