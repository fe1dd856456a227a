"""`quantize --avg-bits`: the budget's arithmetic (bits as inspect counts them), the fused-module constraint,
the chooser against exhaustive search, the calibrated measures against the KL they predict, and the
`sensitivity` report whose plan.toml quantizes to the same bytes."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from clirun import run
from engine.tiny_models import save_tiny
from models import smollm2_fp32
from weightsmith.api import GptqOptions, QuantizeRequest, plan_quantize, quantize
from weightsmith.audit.inspect import inspect
from weightsmith.core.errors import WeightsmithError
from weightsmith.formats.declaration import read_declaration
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantization.budget.candidates import FAMILIES, candidates, group_of
from weightsmith.quantization.budget.choose import Group, Option, spend
from weightsmith.quantization.budget.plan import BudgetOptions

LINEARS = ("attention", "dense mlp")
SHAPES = dict(hidden_size=128, intermediate_size=256, head_dim=32, num_hidden_layers=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Mistral (Llama blocks, no biases, SINQ folds it) with SmolLM2's tokenizer, random weights."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "src", "mistral", tokenizer=smollm2_fp32(),
                     shapes={**SHAPES, "sliding_window": None})  # fmt: skip


def _inspect_bits(folder: Path) -> float:
    rows = [r for r in inspect(folder).rows if r.key in LINEARS]
    return sum((r.weight_bytes + r.overhead_bytes) * 8 for r in rows) / sum(r.params for r in rows)


def _schemes(folder: Path) -> dict[str, tuple[str, int | None]]:
    """Each quantized module's (format, group size) as the config resolves it."""
    ckpt = Checkpoint.open(folder)
    decl = read_declaration(ckpt.config, None)
    assert decl is not None
    out = {}
    for name in ckpt.tensors:
        module = name.rsplit(".", 1)[0]
        found = decl.scheme_for(module) if name.endswith((".weight_packed", ".weight")) else None
        if found is not None:
            out[module] = (found.num_bits, found.group_size)
    return out


def test_the_budget_is_spent_as_inspect_counts_bits(tiny: Path, tmp_path: Path) -> None:
    most = plan_quantize(QuantizeRequest(tiny, avg_bits=9.0, budget=BudgetOptions(measure="weight")))
    assert most.request is not None and most.request.budget is not None
    assert set(most.request.budget.to_json()["modules_by_candidate"]) == {"w8a16"}  # kept: 32 bits, float32
    groups = most.request.budget.groups
    floor = sum(min(o.bits for o in g.options) for g in groups) / sum(g.params for g in groups)
    for extra in (0.0, 0.2, 0.6, 3.0):
        asked = round(floor + extra, 4) + 1e-4
        result = quantize(QuantizeRequest(tiny, tmp_path / f"out{extra}", avg_bits=asked,
                                          budget=BudgetOptions(measure="weight"), hash_sources=False))  # fmt: skip
        plan = plan_quantize(QuantizeRequest(tiny, avg_bits=asked, budget=BudgetOptions(measure="weight")))
        assert plan.request is not None and plan.request.budget is not None
        chosen = plan.request.budget
        assert chosen.avg_bits <= asked
        assert _inspect_bits(result.output) == pytest.approx(chosen.avg_bits, rel=1e-12)
        assert chosen.bits == sum(
            c.bits(m, d.shape, d.dtype) for g in chosen.groups for m in g.modules
            for c in FAMILIES["int4"] if c.label == g.chosen.label
            for d in plan.decisions if d.module == m and d.param == "weight"
        )  # fmt: skip
    assert chosen.to_json()["modules_by_candidate"] != {"g128": 14}  # 3 bits more bought something finer


def test_fused_modules_take_one_choice(tiny: Path, tmp_path: Path) -> None:
    """q/k/v and gate/up are one layer in vLLM: whatever the costs say, they are chosen together."""
    plan = plan_quantize(QuantizeRequest(tiny, avg_bits=5.0, budget=BudgetOptions(measure="weight")))
    assert plan.request is not None and plan.request.budget is not None
    groups = {g.name: g.modules for g in plan.request.budget.groups}
    assert groups["model.layers.0.self_attn.qkv_proj"] == tuple(
        f"model.layers.0.self_attn.{p}_proj" for p in ("k", "q", "v")
    ) or set(groups["model.layers.0.self_attn.qkv_proj"]) == {f"model.layers.0.self_attn.{p}_proj" for p in "qkv"}
    assert set(groups["model.layers.1.mlp.gate_up_proj"]) == {
        "model.layers.1.mlp.gate_proj",
        "model.layers.1.mlp.up_proj",
    }
    for extra in (4.3, 4.7, 6.0, 9.0):
        out = tmp_path / f"o{extra}"
        quantize(QuantizeRequest(tiny, out, avg_bits=extra, budget=BudgetOptions(measure="weight"), hash_sources=False))
        resolved = _schemes(out)
        for layer in (0, 1):
            qkv = {resolved.get(f"model.layers.{layer}.self_attn.{p}_proj") for p in "qkv"}
            gate_up = {resolved.get(f"model.layers.{layer}.mlp.{p}_proj") for p in ("gate", "up")}
            assert len(qkv) == 1 and len(gate_up) == 1, (extra, layer, qkv, gate_up)


def test_group_of_names_the_layer_vllm_builds() -> None:
    assert group_of("model.layers.3.self_attn.k_proj") == "model.layers.3.self_attn.qkv_proj"
    assert group_of("model.layers.3.mlp.up_proj") == "model.layers.3.mlp.gate_up_proj"
    assert group_of("model.layers.3.mlp.down_proj") == "model.layers.3.mlp.down_proj"
    assert group_of("model.layers.3.mlp.experts.7.down_proj") == "model.layers.3.mlp.experts"


def _brute(groups: list[Group], limit: float) -> float:
    best = float("inf")
    for picks in itertools.product(*(g.options for g in groups)):
        if sum(o.bits for o in picks) <= limit:
            best = min(best, sum(o.cost for o in picks))
    return best


def test_the_chooser_against_exhaustive_search() -> None:
    """Within budget always; never worse than any uniform choice that fits; optimal on most instances and
    within the one upgrade that did not fit on the rest."""
    rng = random.Random(7)
    optimal = 0
    for trial in range(200):
        groups = []
        for i in range(rng.randint(1, 5)):
            params = rng.choice((64, 128, 256))
            bits = sorted(rng.sample(range(4 * params, 17 * params), 4))
            costs = sorted((rng.random() for _ in bits), reverse=True)
            options = tuple(Option(f"c{k}", b, c) for k, (b, c) in enumerate(zip(bits, costs, strict=True)))
            groups.append(Group(f"g{i}", (f"m{i}",), params, options, options[0]))
        params = sum(g.params for g in groups)
        low = sum(g.options[0].bits for g in groups)
        high = sum(g.options[-1].bits for g in groups)
        avg = rng.uniform(low, high) / params
        choice = spend(groups, avg, "weight")
        assert choice.bits <= avg * params
        best = _brute(groups, avg * params)
        assert choice.cost >= best - 1e-12
        optimal += choice.cost <= best + 1e-12
        for k in range(4):
            uniform = [g.options[k] for g in groups]
            if sum(o.bits for o in uniform) <= avg * params:
                assert choice.cost <= sum(o.cost for o in uniform) + 1e-12, trial
    assert optimal >= 170


def test_a_budget_below_the_cheapest_mix_is_refused(tiny: Path) -> None:
    with pytest.raises(WeightsmithError, match=r"below the cheapest mix, 4\.28"):
        plan_quantize(QuantizeRequest(tiny, avg_bits=4.0, budget=BudgetOptions(measure="weight")))
    with pytest.raises(WeightsmithError, match="--scheme and --avg-bits both set the scheme"):
        plan_quantize(QuantizeRequest(tiny, scheme="w4a16", avg_bits=5.0))
    with pytest.raises(WeightsmithError, match="--candidates 'g16'"):
        candidates("int4", ("g16",))


def test_the_fisher_measure_predicts_the_kl_it_names(tiny: Path, tmp_path: Path) -> None:
    """Summed over modules, the Fisher measure of each uniform candidate is the KL it adds, to second order:
    held against the KL measured on the calibration tokens themselves, within a factor of two, and ordered
    as the measured KLs are."""
    import torch

    from weightsmith.fidelity.logits import kl_divergence, load_model, next_token_logits, served_logits
    from weightsmith.quantization.budget.plan import check_options, table_for

    opts = BudgetOptions()
    cands = check_options(5.0, opts)
    request = QuantizeRequest(tiny, None, gptq=GptqOptions(tokens=512, seq_len=128), workers=2)
    table = table_for(request, opts, cands)
    assert table.tokens == 512 and set(table.measures) == {"fisher", "activation", "weight"}
    from weightsmith.calibration.measure import calibration_tokens

    ids = torch.tensor([calibration_tokens(tiny, None, None, 512, 512).sequences[0]])
    ref = next_token_logits(load_model(tiny), ids)
    predicted, measured = {}, {}
    for c in cands:
        if c.scheme is None:
            continue
        predicted[c.label] = sum(m.cost["fisher"][c.label] for m in table.modules)
        out = tmp_path / c.label
        quantize(QuantizeRequest(tiny, out, scheme=c.scheme, group_size=c.group_size, hash_sources=False))
        measured[c.label] = kl_divergence(ref, served_logits(out, ids))
    for label in predicted:
        assert 0.5 < predicted[label] / measured[label] < 2.0, (predicted, measured)
    assert sorted(predicted, key=predicted.get) == sorted(measured, key=measured.get)


def test_the_report_and_its_plan(tiny: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """`sensitivity --avg-bits` writes the table, the heat map and a plan.toml that quantizes to the bytes
    `quantize --avg-bits --sensitivity` writes from the same table."""
    report = tmp_path / "report"
    code, out, err = run(capsys, monkeypatch, "sensitivity", str(tiny), "--out", str(report), "--avg-bits", "4.6",
                         "--measure", "weight", "--json")  # fmt: skip
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert plan["avg_bits"] <= 4.6 and sorted(p.name for p in report.iterdir()) == [
        "plan.toml",
        "sensitivity.json",
        "sensitivity.md",
        "sensitivity.png",
    ]
    assert "| `model.layers.0.mlp.down_proj` |" in (report / "sensitivity.md").read_text()
    code, _, err = run(capsys, monkeypatch, "quantize", str(tiny), str(tmp_path / "a"), "--recipe",
                       str(report / "plan.toml"), "--no-hash")  # fmt: skip
    assert code == 0, err
    table = str(report / "sensitivity.json")
    code, _, err = run(capsys, monkeypatch, "quantize", str(tiny), str(tmp_path / "b"), "--avg-bits", "4.6",
                       "--measure", "weight", "--sensitivity", table, "--no-hash")  # fmt: skip
    assert code == 0, err
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    code, _, err = run(capsys, monkeypatch, "sensitivity", str(tiny), "--out", str(report), "--measure", "weight")
    assert code == 2 and "exists; pass --force" in err


def test_the_plan_says_which_weights_the_pre_pass_rescales(tiny: Path) -> None:
    """In a mix, a weight kept as stored or quantized by W8A16 is read as stored, and the plan says so."""
    plan = plan_quantize(QuantizeRequest(tiny, avg_bits=9.0, budget=BudgetOptions(measure="weight")))
    assert plan.pre_pass is None  # every weight W8A16: no fold can run
    plan = plan_quantize(QuantizeRequest(tiny, avg_bits=4.7, budget=BudgetOptions(measure="weight")))
    assert plan.pre_pass == "sinq" and plan.request is not None and plan.request.budget is not None
    chosen = {m: g.chosen.label for g in plan.request.budget.groups for m in g.modules}
    for d in plan.decisions:
        if d.module in chosen:
            assert ("transformed by --pre-pass sinq" in d.reason) == chosen[d.module].startswith("g"), (d, chosen)


def test_an_moe_layers_experts_are_one_choice(tmp_path: Path) -> None:
    """Every routed expert of a layer is one FusedMoE layer in vLLM: the budget gives them one scheme. The
    calibrated measures read torch Linears, which transformers' fused experts are not: refused, naming the
    data-free measure."""
    from engine.tiny_models import moe_shapes

    src = save_tiny(
        tmp_path / "moe", "qwen3_moe", shapes={**moe_shapes("qwen3_moe"), "hidden_size": 128, "head_dim": 32}
    )
    plan = plan_quantize(QuantizeRequest(src, avg_bits=5.2, budget=BudgetOptions(measure="weight")))
    assert plan.request is not None and plan.request.budget is not None
    experts = [g for g in plan.request.budget.groups if g.name.endswith(".mlp.experts")]
    assert [len(g.modules) for g in experts] == [24, 24]  # 8 experts x gate, up, down in layers 1 and 2
    out = tmp_path / "out"
    quantize(QuantizeRequest(src, out, avg_bits=6.0, budget=BudgetOptions(measure="weight"), hash_sources=False))
    resolved = _schemes(out)
    for layer in (1, 2):
        found = {v for m, v in resolved.items() if m.startswith(f"model.layers.{layer}.mlp.experts.")}
        assert len(found) == 1, (layer, found)
    with pytest.raises(WeightsmithError, match="use --measure weight"):
        plan_quantize(QuantizeRequest(src, avg_bits=6.0, gptq=GptqOptions(tokens=64), budget=BudgetOptions()))


def test_a_table_from_elsewhere_is_refused(tiny: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """A sensitivity table is a file anyone may hand over: one measured on other weights, or holding a cost
    that is no cost, is one line naming the file."""
    report = tmp_path / "report"
    code, _, err = run(capsys, monkeypatch, "sensitivity", str(tiny), "--out", str(report), "--measure", "weight")
    assert code == 0, err
    doc = json.loads((report / "sensitivity.json").read_text())
    for label, change in (("renamed", "module"), ("nan", "cost")):
        bad = json.loads(json.dumps(doc))
        if change == "module":
            bad["modules"][0]["module"] = "model.layers.9.mlp.down_proj"  # the fingerprint field left as it was
        else:
            bad["modules"][0]["cost"]["weight"]["g64"] = float("nan")
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(bad))
        code, _, err = run(capsys, monkeypatch, "quantize", str(tiny), str(tmp_path / label), "--avg-bits", "5",
                           "--measure", "weight", "--sensitivity", str(path))  # fmt: skip
        assert code == 2 and str(path) in err and len(err.strip().splitlines()) == 1, err
        assert ("measured on other weights" if change == "module" else "is not a sensitivity table") in err
        assert not (tmp_path / label).exists()


def test_the_nvfp4_family(tiny: Path, tmp_path: Path) -> None:
    """`--family nvfp4`: NVFP4 weights where they cost least, FP8 where the budget buys them, one config
    group each; inspect's bits equal the budget's."""
    out = tmp_path / "out"
    budget = BudgetOptions(family="nvfp4", measure="weight")
    quantize(QuantizeRequest(tiny, out, avg_bits=6.0, budget=budget, hash_sources=False))
    plan = plan_quantize(QuantizeRequest(tiny, avg_bits=6.0, budget=budget))
    assert plan.request is not None and plan.request.budget is not None
    assert set(plan.request.budget.to_json()["modules_by_candidate"]) == {"nvfp4", "fp8"}
    formats = {
        g["format"]
        for g in json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"].values()
    }
    assert formats == {"nvfp4-pack-quantized", "float-quantized"}
    assert _inspect_bits(out) == pytest.approx(plan.request.budget.avg_bits, rel=1e-12)
