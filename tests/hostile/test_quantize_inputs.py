"""What `quantize` and `verify` accept from a source checkpoint's tensors and config.

Each case builds its own source under the sandbox. A bad source gets one `error:` line naming the
file and the tensor or key, exit 2, and no output folder; a valid one that used to crash now
quantizes, checked against llm-compressor where a reference exists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from audit.doctor_builders import raw_shard, write_shard
from hostile.harness import Result, Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quant import fp8
from weightsmith.safetensors.dtypes import from_numpy
from weightsmith.safetensors.header import MAX_TENSORS
from weightsmith.safetensors.writer import ShardWriter, TensorSpec

#: A Llama with 128 inputs to q/k/v/o and gate/up: every block scale of those is [ceil(out/128), 1].
NARROW = dict(LLAMA_CONFIG, hidden_size=128)


def _source(sandbox: Sandbox, tensors: dict[str, np.ndarray], config: dict | None = None) -> Path:
    """`src/` with one shard written by our own writer (any dtype, any shape) and config.json."""
    src = sandbox.root / "src"
    src.mkdir()
    write_shard(src / "model.safetensors", tensors)
    (src / "config.json").write_text(json.dumps(config if config is not None else LLAMA_CONFIG))
    return src


def _quantize(capsys, monkeypatch, sandbox: Sandbox, src: Path, *extra: str) -> Result:
    sandbox.freeze()
    return run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--workers", "2", *extra)


def _refused(result: Result, sandbox: Sandbox, file: str, entry: str) -> str:
    """Exit 2, one line naming `file` and `entry`, no output, nothing else touched."""
    line = result.error_line
    assert result.code == 2, result
    assert file in line and entry in line, line
    assert not (sandbox.root / "out").exists()
    sandbox.assert_untouched("out")
    return line


def _verify_errors(capsys, monkeypatch, folder: Path) -> list[dict]:
    result = run_inprocess(capsys, monkeypatch, "verify", folder, "--json")
    assert "Traceback" not in result.err and result.code in (0, 1), result
    return [f for f in json.loads(result.out)["findings"] if f["severity"] == "error"]


def _fp8_block(w: np.ndarray, block: tuple[int, int] = (128, 128)) -> tuple[np.ndarray, np.ndarray]:
    """FP8 weight and float32 block scale by the documented formula (as test_fp8_inputs.py builds them)."""
    _, scale = fp8.quantize_blocks(w, block)
    mult = fp8.expand_scale(scale, (0, w.shape[0]), w.shape[1], block)
    return (w.astype(np.float32) / mult).astype(ml_dtypes.float8_e4m3fn), scale


def _hf_fp8(tensors: dict[str, np.ndarray], config: dict, **qc: object) -> tuple[dict[str, np.ndarray], dict]:
    """Every `*_proj.weight` as HF block FP8 with `weight_scale_inv`; the config declaring it."""
    out: dict[str, np.ndarray] = {}
    for name, w in tensors.items():
        if name.endswith("_proj.weight"):
            out[name], out[name + "_scale_inv"] = _fp8_block(w)
        else:
            out[name] = w
    declared = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    return out, dict(config, quantization_config={**declared, **qc})


def _ct_fp8_config(config: dict, **weights: object) -> dict:
    args = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False, **weights}
    qc = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": args, "input_activations": None}},
        "ignore": ["lm_head"],
    }
    return dict(config, quantization_config=qc)


# --- 1. valid FP8 block checkpoints whose scales look per-channel: quantized, as llm-compressor does ---


def test_hf_fp8_block_scale_of_narrow_weights_matches_llmcompressor(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """[ceil(out/128), 1] (<= 128 inputs) and [1, ceil(in/128)] (<= 128 outputs) block scales."""
    pytest.importorskip("torch")
    pytest.importorskip("llmcompressor")
    from compressed_tensors.entrypoints.convert.converters import FP8BlockDequantizer
    from llmcompressor import model_free_ptq

    from fp8_reference import IGNORE, same_tensors

    tensors, config = _hf_fp8(llama_tensors(NARROW), NARROW)
    shapes = {n: a.shape for n, a in tensors.items() if n.endswith("_scale_inv")}
    assert shapes["model.layers.0.mlp.gate_proj.weight_scale_inv"] == (4, 1)  # looks like a channel scale
    assert shapes["model.layers.0.self_attn.k_proj.weight_scale_inv"] == (1, 1)
    assert shapes["model.layers.0.mlp.down_proj.weight_scale_inv"] == (1, 4)
    src = write_checkpoint(sandbox.root / "src", tensors, config)
    ref = sandbox.root.parent / "ref"
    converter = FP8BlockDequantizer(targets=["re:.*(q|k|v|o|gate|up|down)_proj$"])
    model_free_ptq(str(src), str(ref), scheme="W4A16", ignore=IGNORE, device="cpu", converter=converter)

    result = _quantize(capsys, monkeypatch, sandbox, src, "--ignore", "lm_head", "--ignore", "model.embed_tokens",
                       "--scheme", "w4a16", "--scale-search", "none")  # fmt: skip
    assert result.code == 0, result.err
    same_tensors(ref, sandbox.root / "out")
    sandbox.assert_untouched("out")


@pytest.mark.parametrize("strategy", ["block", "channel"])
def test_ct_fp8_scales_of_narrow_weights_match_llmcompressor(
    sandbox: Sandbox, capsys, monkeypatch, strategy: str
) -> None:
    """compressed-tensors FP8_BLOCK on 128-input weights writes [ceil(out/128), 1]: a block scale, not a channel one."""
    pytest.importorskip("torch")
    pytest.importorskip("llmcompressor")
    from compressed_tensors.entrypoints.convert.converters import CompressedTensorsDequantizer
    from llmcompressor import model_free_ptq

    from fp8_reference import IGNORE, ct_fp8_scheme, load, same_tensors

    bf16 = write_checkpoint(sandbox.root.parent / "bf16", llama_tensors(NARROW), NARROW)
    src = sandbox.root / "src"
    model_free_ptq(str(bf16), str(src), scheme=ct_fp8_scheme(strategy), ignore=IGNORE, device="cpu")
    if strategy == "block":
        assert tuple(load(src)["model.layers.0.mlp.up_proj.weight_scale"].shape) == (4, 1)
    ref = sandbox.root.parent / "ref"
    converter = CompressedTensorsDequantizer(str(src), ignore=["re:.*norm$"])
    model_free_ptq(str(src), str(ref), scheme="W4A16", ignore=IGNORE, device="cpu", converter=converter)

    result = _quantize(capsys, monkeypatch, sandbox, src, "--ignore", "lm_head", "--ignore", "model.embed_tokens",
                       "--scheme", "w4a16", "--scale-search", "none")  # fmt: skip
    assert result.code == 0, result.err
    same_tensors(ref, sandbox.root / "out")
    sandbox.assert_untouched("out")


def test_hf_fp8_narrow_block_scale_decodes_by_formula(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """Without torch: the decoded weights equal the formula (one scale per 128x128 block)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((300, 100)) * 0.05).astype(np.float32)  # 100 inputs: scale [3, 1]
    q, scale = _fp8_block(w)
    assert scale.shape == (3, 1)
    expected = (q.astype(np.float32) * np.repeat(scale, 128, axis=0)[:300]).astype(ml_dtypes.bfloat16)
    tensors = {"model.layers.0.mlp.down_proj.weight": q, "model.layers.0.mlp.down_proj.weight_scale_inv": scale}
    src = _source(sandbox, tensors, _hf_fp8({}, LLAMA_CONFIG)[1])
    result = _quantize(capsys, monkeypatch, sandbox, src)
    assert result.code == 0, result.err  # 100 inputs do not fit group 128: decoded and kept
    from weightsmith.safetensors.reader import ShardReader

    with ShardReader(sandbox.root / "out" / "model.safetensors") as reader:
        decoded = reader.read("model.layers.0.mlp.down_proj.weight")
    assert decoded.view(np.uint16).tobytes() == expected.view(np.uint16).tobytes()
    sandbox.assert_untouched("out")


# --- 2. malformed inputs that used to raise a traceback: one line each ---


@pytest.mark.parametrize("block", ["128", [0, 0], [-128, 128], [128.0, 128], [128], [128, 128, 1], [True, 128], {}])
def test_weight_block_size_not_two_positive_integers(sandbox: Sandbox, capsys, monkeypatch, block: object) -> None:
    tensors, config = _hf_fp8(llama_tensors(), LLAMA_CONFIG, weight_block_size=block)
    src = _source(sandbox, tensors, config)
    _refused(_quantize(capsys, monkeypatch, sandbox, src), sandbox, "config.json", "weight_block_size")
    errors = _verify_errors(capsys, monkeypatch, src)
    assert any(e["file"] == "config.json" and "weight_block_size" in e["message"] for e in errors), errors


@pytest.mark.parametrize("shape", [(1, 2), (2, 1), (3, 2), (256, 1), (2,), (2, 2, 1)])
def test_fp8_scale_that_fits_no_layout_of_its_weight(sandbox: Sandbox, capsys, monkeypatch, shape) -> None:
    """gate_proj is [512, 256]: its 128x128 block scale is [4, 2]; too few rows or columns is refused."""
    tensors, config = _hf_fp8(llama_tensors(), LLAMA_CONFIG)
    name = "model.layers.1.mlp.gate_proj.weight_scale_inv"
    tensors[name] = np.ones(shape, np.float32)
    src = _source(sandbox, tensors, config)
    line = _refused(_quantize(capsys, monkeypatch, sandbox, src), sandbox, "model.safetensors", name)
    assert "[4, 2]" in line


@pytest.mark.parametrize("shape", [(512,), (2, 512, 256)])
def test_fp8_weight_that_is_not_two_dimensional(sandbox: Sandbox, capsys, monkeypatch, shape) -> None:
    tensors, config = _hf_fp8(llama_tensors(), LLAMA_CONFIG)
    name = "model.layers.0.mlp.gate_proj.weight"
    tensors[name] = np.ones(shape, ml_dtypes.float8_e4m3fn)
    src = _source(sandbox, tensors, config)
    _refused(_quantize(capsys, monkeypatch, sandbox, src), sandbox, "model.safetensors", name)


def test_fp8_weight_in_a_source_that_declares_no_fp8(sandbox: Sandbox, capsys, monkeypatch) -> None:
    tensors = llama_tensors()
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name].astype(ml_dtypes.float8_e4m3fn)
    src = _source(sandbox, tensors)
    _refused(_quantize(capsys, monkeypatch, sandbox, src), sandbox, "model.safetensors", name)


@pytest.mark.parametrize("fp8_source", [False, True])
def test_source_tensor_named_like_an_output(sandbox: Sandbox, capsys, monkeypatch, fp8_source: bool) -> None:
    """`X.weight` and `X.weight_scale` in a source that declares neither: refused, not overwritten or doubled.

    Keeping X as it is would leave a module that verify reports as quantized but ignored; the line
    says how to get exactly that on purpose (`--ignore X`).
    """
    tensors, config = _hf_fp8(llama_tensors(), LLAMA_CONFIG) if fp8_source else (llama_tensors(), LLAMA_CONFIG)
    name = "model.layers.0.self_attn.o_proj.weight_scale"
    tensors[name] = np.ones((256, 2), ml_dtypes.bfloat16)
    src = _source(sandbox, tensors, config)
    line = _refused(_quantize(capsys, monkeypatch, sandbox, src), sandbox, "model.safetensors", name)
    assert "--ignore model.layers.0.self_attn.o_proj" in line
    # and the way out it names works: o_proj (and its scale) kept as they are
    result = _quantize(capsys, monkeypatch, sandbox, src, "--ignore", "model.layers.0.self_attn.o_proj")
    assert result.code == 0, result.err
    out = Checkpoint.open(sandbox.root / "out")
    assert out.tensors[name].info.shape == (256, 2)
    sandbox.assert_untouched("out")


_BAD_GROUPS = {
    "string": lambda qc: qc.update(config_groups="FP8"),
    "list": lambda qc: qc.update(config_groups=[{"targets": ["Linear"]}]),
    "group-string": lambda qc: qc["config_groups"].update(group_0="x"),
    "weights-list": lambda qc: qc["config_groups"]["group_0"].update(weights=[8, "float"]),
    "targets-nested": lambda qc: qc["config_groups"]["group_0"].update(targets=[["Linear"]]),
    "format-list": lambda qc: qc["config_groups"]["group_0"].update(format=["float-quantized"]),
    "num-bits-string": lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits="8"),
    "num-bits-bool": lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=True),
    "type-object": lambda qc: qc["config_groups"]["group_0"]["weights"].update(type={"float": 1}),
    "block-string": lambda qc: qc["config_groups"]["group_0"]["weights"].update(
        strategy="block", block_structure="128x128"
    ),
    "group-size-string": lambda qc: qc["config_groups"]["group_0"]["weights"].update(group_size="128"),
    "kv-string": lambda qc: qc.update(kv_cache_scheme="fp8"),
}


@pytest.mark.parametrize("case", sorted(_BAD_GROUPS))
def test_quantization_config_values_of_the_wrong_type(sandbox: Sandbox, capsys, monkeypatch, case: str) -> None:
    """Both commands: quantize refuses with the line verify reports (config.json and the key)."""
    tensors = {}
    for name, w in llama_tensors().items():
        if name.endswith("_proj.weight"):
            amax = np.abs(w.astype(np.float32)).max(axis=1, keepdims=True) / 448
            tensors[name] = (w.astype(np.float32) / amax).astype(ml_dtypes.float8_e4m3fn)
            tensors[name + "_scale"] = amax.astype(ml_dtypes.bfloat16)
        else:
            tensors[name] = w
    config = _ct_fp8_config(LLAMA_CONFIG)
    _BAD_GROUPS[case](config["quantization_config"])
    src = _source(sandbox, tensors, config)
    key = "kv_cache_scheme" if case.startswith("kv") else "config_groups"
    line = _refused(_quantize(capsys, monkeypatch, sandbox, src), sandbox, "config.json", key)
    errors = [e for e in _verify_errors(capsys, monkeypatch, src) if e["file"] == "config.json"]
    assert any(e["message"] in line for e in errors), (line, errors)


# --- 3. wrong or silent answers ---


@pytest.mark.parametrize("kv", ["fp8", [1], True, 8])
def test_malformed_kv_cache_scheme_is_an_error_not_none(sandbox: Sandbox, capsys, monkeypatch, kv: object) -> None:
    from audit.doctor_builders import tiny_moe, write

    model = tiny_moe()
    model.qc["kv_cache_scheme"] = kv
    root = write(model, sandbox.root / "ckpt")
    errors = _verify_errors(capsys, monkeypatch, root)
    assert any(e["file"] == "config.json" and "kv_cache_scheme" in e["message"] for e in errors), errors


def test_empty_kv_cache_scheme_is_declared_and_malformed(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """`{}` declares a scheme with nothing set, which vLLM refuses (neither 8-bit nor float)."""
    from audit.doctor_builders import tiny_moe, write

    model = tiny_moe()
    model.qc["kv_cache_scheme"] = {}
    root = write(model, sandbox.root / "ckpt")
    result = run_inprocess(capsys, monkeypatch, "verify", root, "--json")
    report = json.loads(result.out)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert any(e["file"] == "config.json" and "kv_cache_scheme" in e["message"] for e in errors), errors
    scope = next(c["scope"] for c in report["checks"] if c["id"] == "kv-cache")
    assert "declared declared" not in scope and "None" not in scope, scope
    assert "declared in config.json quantization_config.kv_cache_scheme" in scope, scope


@pytest.mark.parametrize("style", ["ct", "hf"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, ml_dtypes.float8_e4m3fn])
def test_fp8_scale_of_a_dtype_verify_refuses(sandbox: Sandbox, capsys, monkeypatch, style: str, dtype) -> None:
    """An integer scale once decoded a layer to zeros; quantize now refuses what verify refuses."""
    from audit.doctor_builders import tiny_fp8, write

    model = tiny_fp8(style)
    param = "weight_scale" if style == "ct" else "weight_scale_inv"
    name = f"model.layers.1.mlp.up_proj.{param}"
    model.tensors[name] = np.ones(model.tensors[name].shape, dtype)
    src = write(model, sandbox.root / "src")
    shard = "model-layer01.safetensors"
    _refused(_quantize(capsys, monkeypatch, sandbox, src), sandbox, shard, name)
    errors = _verify_errors(capsys, monkeypatch, src)
    assert any(e["tensor"] == name and e["check"] == "quant.param-dtype" for e in errors), errors


def test_fp8_scales_verify_accepts_are_accepted(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """The other side of the one fact: F32 (hf) and the weight's float dtype (ct) quantize and verify clean."""
    from audit.doctor_builders import tiny_fp8, write

    for style in ("ct", "hf"):
        src = write(tiny_fp8(style), sandbox.root / style)
        assert not [e for e in _verify_errors(capsys, monkeypatch, src) if e["check"] == "quant.param-dtype"]
        result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / f"{style}-out", "--workers", "1")
        assert result.code == 0, result.err


def test_tensor_named_just_weight_is_kept(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """No module prefix: no `.weight_packed` (a name with an empty module) in the output; kept, with the reason."""
    tensors = llama_tensors()
    tensors["weight"] = np.ones((256, 256), ml_dtypes.bfloat16)
    src = _source(sandbox, tensors)
    dry = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--dry-run", "--json")
    decision = next(t for t in json.loads(dry.out)["tensors"] if t["name"] == "weight")
    assert decision["action"] == "keep" and "module name" in decision["reason"]
    result = _quantize(capsys, monkeypatch, sandbox, src)
    assert result.code == 0, result.err
    names = set(Checkpoint.open(sandbox.root / "out").tensors)
    assert "weight" in names and not any(n.startswith(".") for n in names)
    sandbox.assert_untouched("out")


# --- 4. declared shapes are bounded before anything is planned or allocated ---

_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
sys.argv = ["weightsmith", *sys.argv[1:]]
from weightsmith.cli import main
main()
"""


def _limited(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`weightsmith ARGS` under a 3 GiB address-space limit and a time limit (a hang or blow-up fails)."""
    return subprocess.run(
        [sys.executable, "-c", _LIMITED, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("fp8_source", [False, True])
def test_zero_size_tensor_with_a_huge_dimension_is_kept_whole(sandbox: Sandbox, fp8_source: bool) -> None:
    """[2**62, 0] holds no bytes: kept as declared, never row-blocked (2**62 rows once grew past 5 GB)."""
    tensors, config = _hf_fp8(llama_tensors(), LLAMA_CONFIG) if fp8_source else (llama_tensors(), LLAMA_CONFIG)
    huge = "model.layers.0.mlp.down_proj.weight"
    del tensors[huge]
    tensors.pop(huge + "_scale_inv", None)
    src = sandbox.root / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(config))
    specs = [TensorSpec(n, from_numpy(a.dtype).code, a.shape) for n, a in tensors.items()]
    specs.append(TensorSpec(huge, "F8_E4M3" if fp8_source else "BF16", (2**62, 0)))
    with ShardWriter(src, "model.safetensors", specs) as writer:
        for n, a in tensors.items():
            writer.write(n, a)
    sandbox.freeze()

    dry = _limited("quantize", src, sandbox.root / "out", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    decision = next(t for t in json.loads(dry.stdout)["tensors"] if t["name"] == huge)
    assert decision["action"] == ("decode" if fp8_source else "keep"), decision
    assert decision["outputs"] == [{"name": huge, "dtype": "BF16", "shape": [2**62, 0]}]

    run = _limited("quantize", src, sandbox.root / "out", "--workers", "2")
    assert run.returncode == 0, run.stderr
    out = Checkpoint.open(sandbox.root / "out")
    assert (out.tensors[huge].info.shape, out.tensors[huge].info.dtype.code) == ((2**62, 0), "BF16")
    assert f"{huge[: -len('.weight')]}.weight_packed" not in out.tensors
    sandbox.assert_untouched("out")


# --- 5. a header of very many tiny tensors is refused before any per-tensor structure is built ---


def _tiny_tensors(path: Path, count: int, first: int = 0) -> list[str]:
    """A shard of `count` one-byte U8 tensors (~60 header bytes each); their names."""
    names = [f"l.{i}.weight" for i in range(first, first + count)]
    entries = ",".join(f'"{n}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i, n in enumerate(names))
    raw_shard(path, "{" + entries + "}", b"\x01" * count)
    return names


def test_too_many_tensors_in_one_shard(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = sandbox.root / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    _tiny_tensors(src / "model.safetensors", MAX_TENSORS + 1)
    sandbox.freeze()
    for args in (["quantize", src, sandbox.root / "out"], ["quantize", src, sandbox.root / "out", "--dry-run"]):
        result = _limited(*args, timeout=30)
        _refused(Result(result.returncode, result.stdout, result.stderr), sandbox, "model.safetensors", "tensors")
    found = _limited("verify", src, "--json", timeout=30)
    assert found.returncode == 1, found.stderr
    checks = [f["check"] for f in json.loads(found.stdout)["findings"]]
    assert checks == ["header.too-many-tensors"], checks


def test_too_many_tensors_over_all_shards(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """The limit is per checkpoint: two shards under it that together exceed it are refused too."""
    src = sandbox.root / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    half = MAX_TENSORS // 2 + 1
    weight_map = {}
    for k, shard in enumerate(("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")):
        weight_map |= dict.fromkeys(_tiny_tensors(src / shard, half, first=k * half), shard)
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 2 * half}, "weight_map": weight_map})
    )
    sandbox.freeze()
    result = _limited("quantize", src, sandbox.root / "out", timeout=60)
    _refused(Result(result.returncode, result.stdout, result.stderr), sandbox, "model-00002-of-00002", "tensors")
    found = _limited("verify", src, "--json", timeout=60)
    findings = json.loads(found.stdout)["findings"]
    assert any(f["check"] == "header.too-many-tensors" for f in findings), findings
