"""`weightsmith preflight` against the real vLLM 0.25.1 and 0.33.0 wheels, read in place.

Known answers, checked against the wheels' source: 0.25.1's `laguna_dflash.py` calls
`quant_config.get_cache_scale(name)` unguarded (no quant-config class defines it); 0.33.0 uses
`get_cache_scale_mapper()`, which the base class defines. Both versions' `laguna_dflash.py` read
`qkv_proj.weight` directly; 0.33.0's `qwen3_dflash.py` reads it only behind an
`UnquantizedLinearMethod` check. 0.25.1 does not key compiled graphs on the draft, 0.33.0 does.
Pairs come from the synthetic builders; vLLM itself is never imported.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from audit.doctor_builders import FP8_KV, cli, tiny_moe, write, write_shard
from small_demo import SMALL_DEMO
from vllm_wheels import vllm_wheel
from weightsmith.preflight import checks, code
from weightsmith.preflight.checks import preflight
from weightsmith.preflight.report import LOAD, NOTE, SLOW, UNCHECKED, WRONG, Item, Preflight
from weightsmith.preflight.source import VllmSource
from weightsmith.quantization.demo import write_demo_checkpoint

OLD, NEW = "0.25.1", "0.33.0"
LAGUNA_DRAFT = ["DFlashLagunaForCausalLM"]
#: The guard the published card adds to 0.25.1's laguna_dflash.py.
UNGUARDED = "if self.quant_config is not None and ("
GUARDED = 'if self.quant_config is not None and hasattr(self.quant_config, "get_cache_scale") and ('
#: What preflight reads of an installation, extracted for the patched copy.
READ = re.compile(
    r"vllm/(__init__\.py|envs\.py|config/(speculative|model)\.py|model_executor/models/(registry|laguna_dflash)\.py"
    r"|model_executor/layers/quantization/.*\.py|model_executor/kernels/linear/.*\.py|v1/spec_decode/dflash\.py"
    r"|model_executor/layers/fused_moe/oracle/nvfp4\.py)$|vllm-[^/]*\.dist-info/METADATA$"
)


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    return {v: vllm_wheel(v) for v in (OLD, NEW)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A Laguna-shaped NVFP4 target (24 layers, hidden 256) and the demo draft: BF16, quantized w4a16
    without the dflash-draft preset, and with it; the drafts named as Laguna DFlash drafts are."""
    root = tmp_path_factory.mktemp("pair")
    target = write(tiny_moe(layers=24, experts=2, hidden=256, kv_scales=True), root / "target")
    bf16 = write_demo_checkpoint(root / "draft-bf16", config=SMALL_DEMO)
    plain, preset = root / "draft-w4a16", root / "draft-preset"
    assert cli(["quantize", str(bf16), str(plain), "--scheme", "w4a16", "--no-hash"]) == 0
    assert cli(["quantize", str(bf16), str(preset), "--scheme", "w4a16", "--preset", "dflash-draft", "--no-hash"]) == 0
    laguna = {}
    for name, folder in (("bf16", bf16), ("plain", plain), ("preset", preset)):
        laguna[name] = relabel(folder, root / f"laguna-{name}", LAGUNA_DRAFT)
    return {
        "target": target,
        "bf16": bf16,
        "plain": plain,
        "preset": preset,
        **{f"laguna-{k}": v for k, v in laguna.items()},
    }


def relabel(src: Path, dst: Path, architectures: list[str], **config: object) -> Path:
    """A copy of checkpoint SRC with its config's architectures (and any other fields) replaced."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).symlink_to(f.resolve())
    (dst / "config.json").unlink()
    doc = json.loads((src / "config.json").read_text())
    doc.update(architectures=architectures, **config)
    (dst / "config.json").write_text(json.dumps(doc))
    return dst


@pytest.fixture(scope="module")
def patched_old(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site-packages folder holding 0.25.1's files with the guard added to laguna_dflash.py."""
    root = tmp_path_factory.mktemp("site-packages")
    with zipfile.ZipFile(wheels[OLD]) as wheel:
        wheel.extractall(root, [n for n in wheel.namelist() if READ.search(n)])
    model = root / "vllm/model_executor/models/laguna_dflash.py"
    text = model.read_text()
    assert text.count(UNGUARDED) == 1
    model.write_text(text.replace(UNGUARDED, GUARDED))
    return root


def run(target: Path, vllm: Path | None, draft: Path | None = None, cache: Path | None = None, **kw: object):
    env = {"VLLM_CACHE_ROOT": str(cache)} if cache else {"VLLM_CACHE_ROOT": "/nonexistent/vllm-cache"}
    return preflight(target, vllm=vllm, draft=draft, env=env, **kw)  # type: ignore[arg-type]


def by_check(result: Preflight, check: str, impact: str | None = None) -> list[Item]:
    return [i for i in result.items if i.check == check and (impact is None or i.impact == impact)]


def loads_failures(result: Preflight) -> list[str]:
    return sorted(i.check for i in result.items if i.impact == LOAD)


# ---- the known answers on the real source ----------------------------------------------------------


def test_versions_read_from_the_wheels(wheels: dict[str, Path]) -> None:
    assert [VllmSource.open(wheels[v]).version for v in (OLD, NEW)] == [OLD, NEW]


def test_done_when_old_vllm_reports_both_load_failures_with_evidence(pair, wheels) -> None:
    result = run(pair["target"], wheels[OLD], pair["laguna-plain"], method="dflash", k=6)
    assert loads_failures(result) == ["draft.quant-config-call", "draft.weight-read"]
    (call,) = by_check(result, "draft.quant-config-call", LOAD)
    assert call.evidence[0].show() == "laguna_dflash.py:223: scale_name := self.quant_config.get_cache_scale(name)"
    assert "hasattr(self.quant_config" in call.fix
    (read,) = by_check(result, "draft.weight-read", LOAD)
    assert read.evidence[0].file == "vllm/model_executor/models/laguna_dflash.py"
    assert read.evidence[0].line == 159 and "a.qkv_proj.weight[a.q_size :]" in read.evidence[0].text
    assert "--preset dflash-draft" in read.fix
    assert result.failed


def test_done_when_new_vllm_reports_only_the_weight_read(pair, wheels) -> None:
    result = run(pair["target"], wheels[NEW], pair["laguna-plain"], method="dflash")
    assert loads_failures(result) == ["draft.weight-read"]
    assert by_check(result, "draft.weight-read", LOAD)[0].evidence[0].line == 161
    assert not by_check(result, "draft.quant-config-call")  # get_cache_scale_mapper: defined on the base class


def test_done_when_the_preset_draft_loads_on_new_vllm(pair, wheels) -> None:
    result = run(pair["target"], wheels[NEW], pair["laguna-preset"], method="dflash", k=6)
    assert loads_failures(result) == []
    assert not result.failed
    assert result.serve == (
        f"vllm serve {pair['target']} --speculative-config "
        f'\'{{"method": "dflash", "model": "{pair["laguna-preset"]}", "num_speculative_tokens": 6}}\' '
        "--kv-cache-dtype fp8"
    )
    # the preset keeps q/k/v BF16, but the MLPs stay quantized: 0.25.1 still calls get_cache_scale
    old = run(pair["target"], wheels[OLD], pair["laguna-preset"], method="dflash")
    assert loads_failures(old) == ["draft.quant-config-call"]


def test_a_bf16_draft_calls_no_quant_config_method(pair, wheels) -> None:
    result = run(pair["target"], wheels[OLD], pair["laguna-bf16"])
    assert result.method == "dflash"  # read from dflash_config
    assert loads_failures(result) == []


def test_patched_install_reads_as_patched(pair, patched_old) -> None:
    result = run(pair["target"], patched_old, pair["laguna-plain"], method="dflash")
    assert result.vllm_version == OLD
    assert loads_failures(result) == ["draft.weight-read"]
    assert not [i for i in result.items if i.impact == UNCHECKED]  # the copy holds every file preflight reads
    (note,) = by_check(result, "draft.quant-config-call", NOTE)
    assert "hasattr(self.quant_config" in note.evidence[0].text and "patched" in note.message


Q = "vllm/model_executor/layers/quantization"


def w4a4_moe(folder: Path, layers: int = 3, hidden: int = 64) -> Path:
    """An NVFP4 MoE target whose experts declare static 4-bit activations (W4A4)."""
    model = tiny_moe(layers=layers, experts=2, hidden=hidden)
    acts = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"}
    model.config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = acts
    return write(model, folder)


@pytest.fixture(scope="module")
def w4a4_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A W4A4 NVFP4 MoE target deep and wide enough for every MoE check, built once for the module."""
    return w4a4_moe(tmp_path_factory.mktemp("w4a4") / "w4a4", layers=24, hidden=256)


@pytest.mark.parametrize("version", [OLD, NEW])
def test_a_released_vllm_holds_every_fact_preflight_reads(
    pair, wheels, w4a4_target: Path, tmp_path: Path, version: str
) -> None:
    """`could not check` is for a vLLM preflight cannot read: the released wheels answer every check, for
    an NVFP4 MoE target (weight-only and W4A4), a W4A16 one, and DFlash and EAGLE3 drafts."""
    w4a4 = w4a4_target
    eagle3 = relabel(pair["plain"], tmp_path / "e3", ["LlamaForCausalLMEagle3"], eagle_aux_hidden_state_layer_ids=[1])
    runs = [(pair["target"], pair["laguna-plain"], "dflash"), (w4a4, eagle3, "eagle3"),
            (pair["plain"], pair["plain"], "dflash")]  # fmt: skip
    for target, draft, method in runs:  # a draft's run checks its target too
        result = run(target, wheels[version], draft, method=method)
        assert [i.line() for i in result.items if i.impact == UNCHECKED] == [], (target.name, draft.name)


@pytest.fixture(scope="module")
def read_copy(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site-packages folder holding the files of 0.33.0 that preflight reads, and nothing else."""
    root = tmp_path_factory.mktemp("read-copy")
    with zipfile.ZipFile(wheels[NEW]) as wheel:
        wheel.extractall(root, [n for n in wheel.namelist() if READ.search(n)])
    return root


def test_the_copy_of_what_preflight_reads_answers_every_check(pair, read_copy: Path, w4a4_target: Path) -> None:
    """The files `READ` names are all preflight reads: a folder of them alone leaves nothing unchecked."""
    assert not [i for i in run(w4a4_target, read_copy, pair["laguna-plain"]).items if i.impact == UNCHECKED]


@pytest.mark.parametrize(
    ("rel", "check", "says"),
    [
        ("vllm-0.33.0.dist-info/METADATA", "vllm.version", "no vllm-*.dist-info/METADATA"),
        ("vllm/config/speculative.py", "compile-cache", "vllm/config/speculative.py not found"),
        ("vllm/config/model.py", "compile-cache", "vllm/config/model.py not found"),
        ("vllm/model_executor/models/registry.py", "draft.model-file", "models/registry.py not found"),
        # the module may be a package too: neither form is there
        ("vllm/model_executor/models/laguna_dflash.py", "draft.model-file", "laguna_dflash/__init__.py not found"),
        ("vllm/v1/spec_decode/dflash.py", "draft.model-file", "vllm/v1/spec_decode/dflash.py not found"),
        (f"{Q}/__init__.py", "draft.quant-config", f"{Q}/__init__.py not found"),
        ("vllm/model_executor/layers/fused_moe/oracle/nvfp4.py", "moe.w4a4-backend", "oracle/nvfp4.py not found"),
        ("vllm/model_executor/kernels/linear/__init__.py", "serve.linear-kernel", "linear/__init__.py not found"),
        (f"{Q}/compressed_tensors/compressed_tensors.py", "serve.linear-kernel", "compressed_tensors.py not found"),
    ],
)
def test_each_file_preflight_reads_is_a_finding_when_missing(
    pair, read_copy: Path, w4a4_target: Path, tmp_path: Path, rel: str, check: str, says: str
) -> None:
    """The copy answers every check (`test_the_copy_of_what_preflight_reads_answers_every_check`); without
    any one file, the check that reads it says it could not check, naming the file, and the run fails."""
    site = tmp_path / "site-packages"
    shutil.copytree(read_copy, site)
    (site / rel).unlink()
    result = run(w4a4_target, site, pair["laguna-plain"])
    unread = [i for i in result.items if i.impact == UNCHECKED and i.check == check]
    assert unread and result.failed
    assert all(i.message.startswith("could not check ") and says in i.message for i in unread), unread


def test_a_registry_without_a_model_table_is_not_checked_not_refused(
    pair, read_copy: Path, w4a4_target: Path, tmp_path: Path
) -> None:
    """A registry.py that parses but holds no table of architectures is a layout preflight does not know:
    the draft's architecture could not be checked, which is not the same as vLLM not knowing it."""
    site = tmp_path / "site-packages"
    shutil.copytree(read_copy, site)
    (site / "vllm/model_executor/models/registry.py").write_text("_MODELS = None\n")
    result = run(w4a4_target, site, pair["laguna-plain"])
    assert not [i for i in result.items if i.check == "draft.architecture"]
    (unread,) = [i for i in result.items if i.impact == UNCHECKED and i.check == "draft.model-file"]
    assert unread.message.endswith("a model table not found in vllm/model_executor/models/registry.py")
    assert result.failed


def test_the_demo_architecture_resolves_to_qwen3_dflash_which_new_vllm_guards(pair, wheels) -> None:
    """DFlashDraftModel is registered to qwen3_dflash.py: 0.25.1 reads qkv_proj.weight there unguarded,
    0.33.0 only when every projection is unquantized."""
    old = run(pair["target"], wheels[OLD], pair["plain"])
    assert loads_failures(old) == ["draft.weight-read"]
    assert by_check(old, "draft.weight-read")[0].evidence[0].show().startswith("qwen3_dflash.py:421:")
    new = run(pair["target"], wheels[NEW], pair["plain"])
    assert loads_failures(new) == []
    (guarded,) = by_check(new, "draft.weight-read", NOTE)
    assert [e.show() for e in guarded.evidence] == [
        "qwen3_dflash.py:515: isinstance(proj.quant_method, UnquantizedLinearMethod)",
        "qwen3_dflash.py:519: kv_weights = [a.qkv_proj.weight[a.q_size :] for a in layers_attn]",
    ]


# ---- compile cache ------------------------------------------------------------------------------------


def test_a_cache_root_holding_graphs(pair, wheels, tmp_path: Path) -> None:
    graph = tmp_path / "torch_compile_cache" / "0123abcd" / "rank_0_0"
    graph.mkdir(parents=True)
    (graph / "model.pt").write_bytes(b"graph")
    old = run(pair["target"], wheels[OLD], pair["laguna-preset"], cache=tmp_path)
    (item,) = by_check(old, "compile-cache", LOAD)
    assert "KeyError: 'weight_packed'" in item.message and str(tmp_path) in item.message
    assert item.evidence[0].show() == "speculative.py:286: def compute_hash(self) -> str:"
    assert old.serve.startswith(checks.FRESH_CACHE + " vllm serve ")
    new = run(pair["target"], wheels[NEW], pair["laguna-preset"], cache=tmp_path)
    (keyed,) = by_check(new, "compile-cache", NOTE)
    assert keyed.evidence[0].text == "factors.append(self.draft_model_config.compute_hash())"
    assert new.serve.startswith("vllm serve ")


def test_an_empty_cache_root_is_a_note_with_the_fix(pair, wheels, tmp_path: Path) -> None:
    (item,) = by_check(run(pair["target"], wheels[OLD], pair["laguna-preset"], cache=tmp_path), "compile-cache")
    assert item.impact == NOTE and checks.FRESH_CACHE in item.fix


def test_cache_root_resolution() -> None:
    assert checks.cache_root({"VLLM_CACHE_ROOT": "/a"}) == Path("/a")
    assert checks.cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/vllm")
    assert checks.cache_root({}) == Path("~/.cache/vllm").expanduser()


# ---- checkpoint side ----------------------------------------------------------------------------------


def test_nvfp4_w4a4_moe_target(tmp_path: Path, wheels) -> None:
    model = tiny_moe(layers=3, experts=2)
    acts = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"}
    model.config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = acts
    target = write(model, tmp_path / "w4a4")
    for version, lines in ((OLD, (391, 400)), (NEW, (452, 461))):
        result = run(target, wheels[version])
        (item,) = by_check(result, "moe.w4a4-backend", WRONG)
        assert [e.line for e in item.evidence] == list(lines)  # HUMMING, MARLIN: a13_scale = None
        assert all(e.text == "a13_scale = None" for e in item.evidence)
        assert "HUMMING, MARLIN" in item.message and "flashinfer_cutlass" in item.fix
        assert "--moe-backend flashinfer_cutlass" in result.serve
        assert result.failed


def test_weight_only_moe_target_has_no_backend_finding(pair, wheels) -> None:
    result = run(pair["target"], wheels[NEW])
    assert not by_check(result, "moe.w4a4-backend")
    assert not result.failed and result.serve == f"vllm serve {pair['target']} --kv-cache-dtype fp8"


def test_kv_declared_without_scales(tmp_path: Path, wheels) -> None:
    model = tiny_moe(layers=3, experts=2, kv_scales=False)
    model.config["quantization_config"]["kv_cache_scheme"] = dict(FP8_KV)
    result = run(write(model, tmp_path / "nokv"), wheels[NEW])
    (item,) = by_check(result, "kv.scales", WRONG)
    assert item.message.startswith("6 KV scale(s) are missing") and "scale 1.0" in item.message
    assert "--kv-cache-dtype" not in result.serve
    assert result.failed


# ---- the pair -----------------------------------------------------------------------------------------


def test_layer_ids_beyond_the_targets_depth(pair, wheels, tmp_path: Path) -> None:
    shallow = write(tiny_moe(layers=12, experts=2, hidden=256), tmp_path / "shallow")
    result = run(shallow, wheels[NEW], pair["laguna-preset"])
    (item,) = by_check(result, "pair.layer-ids", LOAD)
    assert "[1, 12, 23]" in item.message and "[12, 23]" in item.message and "12 layers" in item.message


def test_hidden_size_and_vocab_must_agree(pair, wheels, tmp_path: Path) -> None:
    draft = relabel(pair["laguna-preset"], tmp_path / "d", LAGUNA_DRAFT, hidden_size=512, vocab_size=100352)
    target = write(tiny_moe(layers=24, experts=2, hidden=256), tmp_path / "t")
    doc = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**doc, "vocab_size": 128}))
    result = run(target, wheels[NEW], draft)
    assert {i.check for i in result.items if i.impact == LOAD} >= {"pair.hidden-size", "pair.vocab-size"}


def test_recorded_target(pair, wheels, tmp_path: Path) -> None:
    none = by_check(run(pair["target"], wheels[NEW], pair["laguna-preset"]), "pair.recorded-target")[0]
    assert none.impact == NOTE and "cannot be checked" in none.message
    other = relabel(pair["laguna-preset"], tmp_path / "o", LAGUNA_DRAFT, target_model="poolside/Laguna-XS.2-NVFP4")
    wrong = by_check(run(pair["target"], wheels[NEW], other), "pair.recorded-target")[0]
    assert wrong.impact == SLOW and "Laguna-XS.2-NVFP4" in wrong.message
    this = relabel(pair["laguna-preset"], tmp_path / "t", LAGUNA_DRAFT, target_model="org/target")
    assert by_check(run(pair["target"], wheels[NEW], this), "pair.recorded-target")[0].impact == NOTE
    card = relabel(pair["laguna-preset"], tmp_path / "c", LAGUNA_DRAFT)
    (card / "README.md").write_text("---\nbase_model: poolside/Laguna-XS.2-FP8\n---\n\nA draft.\n")
    carded = by_check(run(pair["target"], wheels[NEW], card), "pair.recorded-target")[0]
    assert carded.impact == SLOW and "README.md base_model" in carded.message


def test_eagle3_aux_layers_and_model_file(wheels, tmp_path: Path) -> None:
    target = write(tiny_moe(layers=8, experts=2, hidden=256), tmp_path / "t")
    draft = write_demo_checkpoint(tmp_path / "eagle", config=SMALL_DEMO)
    relabelled = relabel(draft, tmp_path / "e3", ["LlamaForCausalLMEagle3"], eagle_aux_hidden_state_layer_ids=[2, 4, 9])
    result = run(target, wheels[NEW], relabelled, method="eagle3")
    assert "llama_eagle3.py" in by_check(result, "draft.model-file")[0].message
    (item,) = by_check(result, "pair.layer-ids", LOAD)
    assert "[9]" in item.message


# ---- the command line ---------------------------------------------------------------------------------


def test_cli_json_and_exit_status(pair, wheels, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/nonexistent/vllm-cache")
    args = ["preflight", str(pair["target"]), "--draft", str(pair["laguna-plain"]), "--vllm", str(wheels[OLD])]
    assert cli([*args, "--json", "--k", "6"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["vllm"]["version"] == OLD and doc["passed"] is False and doc["method"] == "dflash"
    assert doc["counts"]["will not load"] == 2
    assert doc["findings"][0]["impact"] == "will not load" and doc["findings"][0]["severity"] == "error"
    assert {"file", "line", "text"} == set(doc["findings"][0]["evidence"][0])
    assert doc["serve"].startswith("VLLM_CACHE_ROOT=$(mktemp -d) vllm serve ")
    ok = ["preflight", str(pair["target"]), "--draft", str(pair["laguna-preset"]), "--vllm", str(wheels[NEW])]
    assert cli(ok) == 0
    out = capsys.readouterr().out
    assert "Suggested command" in out and "vllm serve" in out and "vLLM 0.33.0" in out


def test_vllm_is_never_imported(pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installation found by default is read in place: a `vllm` importable here is never imported."""
    site = tmp_path / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    result = run(pair["target"], None)
    assert result.vllm == str(site)
    assert "vllm" not in sys.modules


def test_the_card_cites_which_vllm_versions_were_checked(pair, wheels, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "empty-cache"))
    draft = relabel(pair["preset"], tmp_path / "laguna-dflash-w4a16", LAGUNA_DRAFT)
    reports = []
    for version in (OLD, NEW):
        args = ["preflight", str(pair["target"]), "--draft", str(draft), "--vllm", str(wheels[version]), "--json"]
        assert cli(args) == (1 if version == OLD else 0)
        reports.append(tmp_path / f"preflight-{version}.json")
        reports[-1].write_text(capsys.readouterr().out)
    args = ["card", str(draft), "--repo", "org/laguna-dflash-w4a16"]
    assert cli([*args, *(x for r in reports for x in ("--preflight", str(r)))]) == 0
    card = (draft / "README.md").read_text()
    line = next(ln for ln in card.splitlines() if "weightsmith preflight" in ln)
    assert (
        "vLLM `0.25.1`<!-- preflight.json: runs[0].vllm -->: 1<!-- preflight.json: runs[0].counts[will not load]"
        in line
    )
    assert "vLLM `0.33.0`<!-- preflight.json: runs[1].vllm -->: nothing that would fail or degrade" in line
    kept = json.loads((draft / "preflight.json").read_text())
    assert [r["vllm"] for r in kept["runs"]] == [OLD, NEW] and str(tmp_path) not in json.dumps(kept)
    capsys.readouterr()
    assert cli(["card", str(draft), "--check"]) == 0, capsys.readouterr().out
    kept["runs"][0]["counts"]["will not load"] = 0
    (draft / "preflight.json").write_text(json.dumps(kept))
    assert cli(["card", str(draft), "--check"]) == 1


def test_eagle3_draft_with_a_quantized_embedding(wheels, tmp_path: Path) -> None:
    """llama_eagle3.py builds embed_tokens without a quant config (lm_head with one, in both versions)."""
    target = write(tiny_moe(layers=8, experts=2, hidden=256), tmp_path / "t")
    draft = tmp_path / "e3"
    draft.mkdir()
    rng = np.random.default_rng(0)
    tensors = {
        "embed_tokens.weight_packed": rng.integers(0, 2**31, (128, 32), dtype=np.int32),
        "embed_tokens.weight_scale": np.ones((128, 2), ml_dtypes.bfloat16),
        "embed_tokens.weight_shape": np.array([128, 256], np.int64),
        "lm_head.weight": np.zeros((128, 256), ml_dtypes.bfloat16),
        "midlayer.self_attn.q_proj.weight": np.zeros((256, 512), ml_dtypes.bfloat16),
    }
    write_shard(draft / "model.safetensors", tensors)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 256, "num_hidden_layers": 1}
    (draft / "config.json").write_text(json.dumps(config))
    for version in (OLD, NEW):
        result = run(target, wheels[version], draft)
        assert result.method == "eagle3"
        (item,) = by_check(result, "draft.plain-build", LOAD)
        assert item.tensor == "embed_tokens" and "--preset eagle3-draft" in item.fix
        assert item.evidence[0].text == "self.embed_tokens = VocabParallelEmbedding("


@pytest.mark.parametrize(
    ("body", "guarded"),
    [
        ("    s = self.quant_config.get_cache_scale(name)\n", False),
        ("    if hasattr(self.quant_config, 'get_cache_scale'):\n        s = self.quant_config.get_cache_scale(name)\n",
         True),
        ("    try:\n        s = self.quant_config.get_cache_scale(name)\n    except AttributeError:\n        pass\n",
         True),
        ("    try:\n        s = self.quant_config.get_cache_scale(name)\n    except KeyError:\n        s = None\n",
         False),
        ("    s = getattr(self.quant_config, 'get_cache_scale', None) and self.quant_config.get_cache_scale(name)\n",
         True),
        ("    if self.quant_config is not None:\n        s = self.quant_config.get_cache_scale(name)\n", False),
    ],
)  # fmt: skip
def test_guard_forms(wheels, tmp_path: Path, body: str, guarded: bool) -> None:
    """Each way of writing the call around a missing method, read from a copy of 0.25.1's quant package."""
    root = tmp_path / "sp"
    with zipfile.ZipFile(wheels[OLD]) as wheel:
        wheel.extractall(
            root, [n for n in wheel.namelist() if n.startswith("vllm/model_executor/layers/quantization/")]
        )
    (root / "vllm" / "__init__.py").write_text("")
    model = root / "vllm/model_executor/models/m.py"
    model.parent.mkdir(parents=True)
    model.write_text(f"def load_weights(self, name):\n{body}")
    src = VllmSource.open(root)
    (call,) = code.quant_config_calls(src, "vllm/model_executor/models/m.py")
    assert call.method == "get_cache_scale" and call.guarded is guarded
    assert code.class_defines(src, "CompressedTensorsConfig", "get_cache_scale") is False
    assert code.class_defines(src, "CompressedTensorsConfig", "get_cache_scale_mapper") is True
