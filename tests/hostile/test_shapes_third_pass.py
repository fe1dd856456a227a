"""Shapes and recipes, third pass: scalars, norms and biases of the wrong shape, a config that
contradicts itself, recipes that match nothing, and inputs echoed whole.

A 0-d tensor anywhere crashed `quantize` in its job list; a norm of `[1]` or `[64, 1]`, a bias of
`[3]` or a gate_proj beside an up_proj it disagrees with crashed the SINQ pre-pass (the default)
with a traceback, while `verify` called the bias cases clean; `model_type: llama` beside
`architectures: ["GemmaForCausalLM"]` was folded as a Llama, though vLLM builds the Gemma class,
whose norms are `1 + weight`; a recipe matching nothing wrote a "quantized" checkpoint of 0
quantized weights and exited 0; a 100,000-character target was echoed whole. Each case builds its
input in the sandbox, runs the command, and checks what it prints, its exit status, and that
nothing outside the destination changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from hostile.harness import TINY_LLAMA, Result, Sandbox, run_inprocess
from synth import llama_tensors, write_checkpoint
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.safetensors.reader import ShardReader

#: TINY_LLAMA's inputs are 64 wide: group 32 quantizes every projection (the default 128 would keep them all).
GROUP = ("--group-size", "32")
TINY_QWEN2 = dict(TINY_LLAMA, architectures=["Qwen2ForCausalLM"], model_type="qwen2")
LONG = 100_000
#: The longest line a refusal or warning quoting a 100,000-character input may print.
SHORT = 600


def _source(sandbox: Sandbox, config: dict = TINY_LLAMA, **changed: np.ndarray) -> Path:
    """A one-layer BF16 model of `config` (with q/k/v biases where the architecture builds them),
    `changed` tensors put in (names with `__` for dots), under `sandbox/src`."""
    tensors = llama_tensors(config)
    if config["model_type"] == "qwen2":
        for p, rows in (("q", 64), ("k", 32), ("v", 32)):
            tensors[f"model.layers.0.self_attn.{p}_proj.bias"] = np.zeros(rows, ml_dtypes.bfloat16)
    tensors |= {name.replace("__", "."): value for name, value in changed.items()}
    return write_checkpoint(sandbox.root / "src", tensors, config)


def _quantize(capsys, monkeypatch, sandbox: Sandbox, src: Path, *extra: object) -> Result:
    sandbox.freeze()
    return run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--workers", "2", *GROUP, *extra)


def _refused(result: Result, sandbox: Sandbox, *entries: str) -> str:
    """Exit 2, one line naming every one of `entries`, no output, nothing else touched."""
    line = result.error_line
    assert result.code == 2, result
    assert all(e in line for e in entries), line
    assert not (sandbox.root / "out").exists()
    sandbox.assert_untouched("out")
    return line


def _verify(capsys, monkeypatch, folder: Path) -> tuple[int, list[dict]]:
    """`verify --json`: its exit status and its error findings."""
    result = run_inprocess(capsys, monkeypatch, "verify", folder, "--json")
    assert "Traceback" not in result.err and result.code in (0, 1), result
    return result.code, [f for f in json.loads(result.out)["findings"] if f["severity"] == "error"]


def _recipe(sandbox: Sandbox, text: str) -> Path:
    path = sandbox.root / "recipe.toml"
    path.write_text(text)
    return path


# --- 7. a 0-d tensor ---


@pytest.mark.parametrize("pre_pass", ["auto", "none"])
def test_a_scalar_that_is_no_target_is_carried_through(sandbox: Sandbox, capsys, monkeypatch, pre_pass: str) -> None:
    src = _source(sandbox, model__logit_scale=np.array(0.5, np.float32))
    result = _quantize(capsys, monkeypatch, sandbox, src, "--pre-pass", pre_pass)
    assert result.code == 0 and "Traceback" not in result.err, result.err
    out = Checkpoint.open(sandbox.root / "out")
    ref = out.tensors["model.logit_scale"]
    assert ref.info.shape == () and ref.info.dtype.code == "F32"
    with ShardReader(out.path(ref.shard), out.headers[ref.shard]) as reader:
        assert reader.read("model.logit_scale").tolist() == 0.5
    assert json.loads((sandbox.root / "out" / "weightsmith.json").read_text())["tensors"]["quantize"] == 7
    sandbox.assert_untouched("out")
    assert _verify(capsys, monkeypatch, sandbox.root / "out") == (0, [])


@pytest.mark.parametrize(
    "name,recipe",
    [
        ("model.layers.0.self_attn.q_proj.weight", None),  # every Linear weight is a target of --scheme
        ("model.extra.weight", '[[rule]]\ntargets = ["model.extra"]\nscheme = "w4a16"\ngroup_size = 32\n'),
    ],
    ids=["projection", "recipe-target"],
)
def test_a_scalar_named_as_a_weight_to_quantize_is_refused(
    sandbox: Sandbox, capsys, monkeypatch, name: str, recipe: str | None
) -> None:
    src = _source(sandbox, **{name.replace(".", "__"): np.array(1.0, ml_dtypes.bfloat16)})
    if recipe is None:
        result = _quantize(capsys, monkeypatch, sandbox, src)
    else:
        path = _recipe(sandbox, recipe)
        sandbox.freeze()
        result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--recipe", path)
    line = _refused(result, sandbox, "model.safetensors", f"tensor '{name}'", "0-d", "rule 1")
    assert "--ignore " + name.removesuffix(".weight") in line


# --- 8. norms, biases and projections of the wrong shape ---

SHAPES = [
    ("model.layers.0.input_layernorm.weight", (1,), TINY_LLAMA,
     "shape [1], expected [64] (hidden_size 64 in config.json)"),
    ("model.layers.0.input_layernorm.weight", (64, 1), TINY_LLAMA, "shape [64, 1], expected [64]"),
    ("model.layers.0.post_attention_layernorm.weight", (32,), TINY_LLAMA, "shape [32], expected [64]"),
    ("model.layers.0.input_layernorm.weight", (), TINY_LLAMA, "shape [], expected [64]"),
    ("model.layers.0.self_attn.v_proj.bias", (3,), TINY_QWEN2,
     "shape [3], expected [32] (num_key_value_heads 1 x head_dim 32 in config.json)"),
    ("model.layers.0.self_attn.v_proj.bias", (32, 1), TINY_QWEN2, "shape [32, 1], expected [32]"),
]  # fmt: skip


@pytest.mark.parametrize("pre_pass", ["auto", "none"])
@pytest.mark.parametrize("name,shape,config,wrong", SHAPES, ids=[f"{n.split('.')[-2]}{list(s)}" for n, s, *_ in SHAPES])
def test_a_shape_config_json_contradicts_is_refused_and_reported(
    sandbox: Sandbox, capsys, monkeypatch, name: str, shape: tuple[int, ...], config: dict, wrong: str, pre_pass: str
) -> None:
    src = _source(sandbox, config, **{name.replace(".", "__"): np.ones(shape, ml_dtypes.bfloat16)})
    result = _quantize(capsys, monkeypatch, sandbox, src, "--pre-pass", pre_pass)
    _refused(result, sandbox, "model.safetensors", f"tensor '{name}'", wrong)
    code, errors = _verify(capsys, monkeypatch, src)
    assert code == 1 and [(e["check"], e["tensor"]) for e in errors] == [("arch.shape", name)], errors


@pytest.mark.parametrize("pre_pass", ["auto", "sinq"])
def test_a_weight_the_pre_pass_would_fold_against_a_shape_config_json_contradicts_is_refused(
    sandbox: Sandbox, capsys, monkeypatch, pre_pass: str
) -> None:
    """A gate_proj beside an up_proj it disagrees with: the pre-pass stacks them. `--pre-pass none` quantizes
    each weight as it is (verify reports the shape, as it does of the source)."""
    name = "model.layers.0.mlp.gate_proj.weight"
    src = _source(sandbox, **{name.replace(".", "__"): np.ones((128, 32), ml_dtypes.bfloat16)})
    result = _quantize(capsys, monkeypatch, sandbox, src, "--pre-pass", pre_pass)
    wrong = "shape [128, 32], expected [128, 64] (intermediate_size 128, hidden_size 64 in config.json)"
    _refused(result, sandbox, "model.safetensors", f"tensor '{name}'", wrong)
    code, errors = _verify(capsys, monkeypatch, src)
    assert code == 1 and [(e["check"], e["tensor"]) for e in errors] == [("arch.shape", name)], errors
    assert _quantize(capsys, monkeypatch, sandbox, src, "--pre-pass", "none").code == 0


def test_a_bias_the_architecture_does_not_build_is_refused_and_reported(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """A Llama without `attention_bias` has no v_proj bias: vLLM skips the tensor, so it serves another model."""
    name = "model.layers.0.self_attn.v_proj.bias"
    src = _source(sandbox, **{name.replace(".", "__"): np.ones(32, ml_dtypes.bfloat16)})
    result = _quantize(capsys, monkeypatch, sandbox, src)
    _refused(result, sandbox, "model.safetensors", f"tensor '{name}'", "attention_bias")
    code, errors = _verify(capsys, monkeypatch, src)
    assert code == 1 and [(e["check"], e["tensor"]) for e in errors] == [("arch.unexpected-bias", name)], errors


def test_biases_config_json_declares_are_checked_and_folded(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """`attention_bias: true`: q/k/v/o biases of the right shapes are expected, verified clean, and folded."""
    config = dict(TINY_LLAMA, attention_bias=True)
    biases = {f"model__layers__0__self_attn__{p}_proj__bias": np.full(n, 0.5, ml_dtypes.bfloat16)
              for p, n in (("q", 64), ("k", 32), ("v", 32), ("o", 64))}  # fmt: skip
    src = _source(sandbox, config, **biases)
    assert _verify(capsys, monkeypatch, src) == (0, [])
    result = _quantize(capsys, monkeypatch, sandbox, src)
    assert result.code == 0, result.err
    manifest = json.loads((sandbox.root / "out" / "weightsmith.json").read_text())
    assert "model.layers.0.self_attn.v_proj.bias" in manifest["pre_pass"]["changed"]
    assert _verify(capsys, monkeypatch, sandbox.root / "out") == (0, [])
    no_bias = _source_again(sandbox, config)
    code, errors = _verify(capsys, monkeypatch, no_bias)
    assert code == 1 and {e["check"] for e in errors} == {"arch.missing-tensor"} and len(errors) == 4, errors


def _source_again(sandbox: Sandbox, config: dict) -> Path:
    """A second source (no biases) beside the first."""
    return write_checkpoint(sandbox.root / "src2", llama_tensors(config), config)


# --- 9. the pre-pass decides by architectures, and refuses a config that contradicts itself ---


@pytest.mark.parametrize("model_type,arch", [("llama", "GemmaForCausalLM"), ("gemma", "LlamaForCausalLM")])
def test_a_config_that_contradicts_itself_is_refused_and_reported(
    sandbox: Sandbox, capsys, monkeypatch, model_type: str, arch: str
) -> None:
    src = _source(sandbox, dict(TINY_LLAMA, model_type=model_type, architectures=[arch]))
    result = _quantize(capsys, monkeypatch, sandbox, src)
    _refused(result, sandbox, "config.json", f"model_type '{model_type}'", f"architectures[0] '{arch}'")
    result = run_inprocess(capsys, monkeypatch, "verify", src, "--json")
    findings = [(f["check"], f["severity"], f["message"]) for f in json.loads(result.out)["findings"]]
    contradicts = f"model_type '{model_type}' and architectures[0] '{arch}' name different models"
    if arch == "LlamaForCausalLM":  # the class verify checks the tensors against: an error
        assert result.code == 1 and findings == [("arch.contradiction", "error", findings[0][2])], findings
    else:  # nothing is checked against an unknown class: the note that says so names it
        assert result.code == 0 and [(c, s) for c, s, _ in findings] == [("arch.not-checked", "info")], findings
    assert contradicts in findings[0][2]
    result = _quantize(capsys, monkeypatch, sandbox, src, "--pre-pass", "none")
    assert result.code == 0, result.err  # nothing folded: the norms stay as the source has them


def test_a_draft_class_beside_its_base_model_type_is_no_contradiction(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """EAGLE3 drafts say `LlamaForCausalLMEagle3` and model_type llama: a draft class, not another model."""
    src = _source(sandbox, dict(TINY_LLAMA, architectures=["LlamaForCausalLMEagle3"]))
    result = _quantize(capsys, monkeypatch, sandbox, src, "--json")
    assert result.code == 0, result.err
    assert "LlamaForCausalLMEagle3" in json.loads(result.out)["pre_pass_skipped"]


# --- 10. recipes that match nothing, and long echoes ---


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_recipe_that_matches_nothing_is_refused(sandbox: Sandbox, capsys, monkeypatch, dry_run: bool) -> None:
    src = _source(sandbox)
    path = _recipe(sandbox, '[[rule]]\ntargets = ["model.nothing"]\nscheme = "w4a16"\n\n'
                            '[[rule]]\ntargets = ["re:.*nowhere$"]\nscheme = "w8a16"\n')  # fmt: skip
    sandbox.freeze()
    extra = ("--dry-run",) if dry_run else ()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--recipe", path, *extra)
    _refused(result, sandbox, str(path), "rule 1", "'model.nothing'", "rule 2", "'re:.*nowhere$'", "nothing")


LONG_RECIPES = {
    "target": f'[[rule]]\ntargets = ["{"x" * LONG}"]\nscheme = "w4a16"\n',
    "regex": f'[[rule]]\ntargets = ["re:({"a" * LONG}"]\nscheme = "w4a16"\n',
    "category": f'[[rule]]\ntargets = ["category:{"a" * LONG}"]\nscheme = "w4a16"\n',
    "key": f'[[rule]]\ntargets = ["Linear"]\nscheme = "w4a16"\n{"k" * LONG} = 1\n',
    "scheme": f'[[rule]]\ntargets = ["Linear"]\nscheme = "{"s" * LONG}"\n',
    "ignore": f'ignore = ["re:({"i" * LONG}"]\n[[rule]]\ntargets = ["Linear"]\nscheme = "w4a16"\n',
}


@pytest.mark.parametrize("case", list(LONG_RECIPES))
def test_a_long_input_is_echoed_cut(sandbox: Sandbox, capsys, monkeypatch, case: str) -> None:
    src = _source(sandbox)
    path = _recipe(sandbox, LONG_RECIPES[case])
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--recipe", path)
    line = _refused(result, sandbox, str(path))
    assert len(line) < SHORT and "more characters" in line, line[:SHORT]


def test_a_long_target_that_matches_nothing_is_one_short_warning(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = _source(sandbox)
    path = _recipe(sandbox, f'[[rule]]\ntargets = ["Linear", "{"x" * LONG}"]\nscheme = "w4a16"\ngroup_size = 32\n')
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--recipe", path, "--dry-run")
    assert result.code == 0, result.err[:SHORT]
    lines = [ln for ln in result.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning:") and len(lines[0]) < SHORT, lines[:3]
    assert "matches no Linear-like weight" in lines[0] and "more characters" in lines[0]
    sandbox.assert_untouched()


LONG_OPTIONS = {
    "--scheme": "s" * LONG,
    "--scale-search": "s" * LONG,
    "--ignore": "re:(" + "i" * LONG,
    "--preset": "p" * LONG,
    "--kv-cache": "k" * LONG,
    "--method": "m" * LONG,
}


@pytest.mark.parametrize("option", list(LONG_OPTIONS))
def test_a_long_option_value_is_echoed_cut(sandbox: Sandbox, capsys, monkeypatch, option: str) -> None:
    src = _source(sandbox)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", option, LONG_OPTIONS[option])
    line = _refused(result, sandbox)
    assert len(line) < SHORT and "more characters" in line, line[:SHORT]


@pytest.mark.parametrize(
    "command",
    [
        ["verify", "{long}"],
        ["inspect", "{long}"],
        ["quantize", "{long}", "{out}"],
        ["calibrate", "{long}", "--out", "{out}"],
    ],
    ids=lambda c: c[0],
)
def test_a_path_the_system_refuses_as_too_long_is_one_cut_line(
    sandbox: Sandbox, capsys, monkeypatch, command: list[str]
) -> None:
    # The system refuses the name (ENAMETOOLONG) before any file is read: one line, the path cut in its
    # middle, what the system said kept at the end.
    long = str(sandbox.root / ("a" * LONG))
    args = [a.format(long=long, out=sandbox.root / "out") for a in command]
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, *args)
    line = _refused(result, sandbox)
    assert len(line) < 1100 and "characters left out" in line and line.endswith(": File name too long"), line[:SHORT]
