"""Audits that say clean only when it is clean: verify against the config, scales, config numbers, calibrate-kv.

`verify` used to call a Llama clean with layer 1, the embedding and `lm_head` gone, or a `q_proj`
of `[96, 128]` against the config's sizes; `--scan-values` passed an FP8 `weight_scale` of -1;
NaN and `1e400` in config.json read as valid JSON (and quantize copied them on); `calibrate-kv`
ran on a source that failed verify, and wrote an output that failed it too. Each case runs the
command on a checkpoint built in the sandbox and checks what it prints, its exit status, and
that nothing outside the destination changed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from audit.doctor_builders import write_shard
from hostile.harness import TINY_LLAMA, Result, Sandbox, copies, run_inprocess, tiny_pair
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.safetensors.header import read_header
from weightsmith.safetensors.reader import ShardReader


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


def _verify(capsys, monkeypatch, sandbox: Sandbox, folder: Path, *extra: str) -> tuple[Result, list[dict]]:
    """`verify --json` on `folder`: the result and its findings; the sandbox is left as it was."""
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "verify", folder, "--json", *extra)
    assert "Traceback" not in result.err and result.code in (0, 1), result
    sandbox.assert_untouched()
    return result, json.loads(result.out)["findings"]


def _errors(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["severity"] == "error"]


def _edit(folder: Path, name: str, change) -> Path:
    """Rewrite the shard of `folder` holding `name` with `change(array)` in its place; returns the shard.

    Read and written with our own reader and writer, which know every dtype (FP8 included).
    """
    for shard in folder.glob("*.safetensors"):
        header = read_header(shard)
        if name in header.tensors:
            with ShardReader(shard, header) as reader:
                tensors = {n: reader.read(n).reshape(info.shape) for n, info in header.tensors.items()}
            tensors[name] = change(tensors[name])
            shard.unlink()
            write_shard(shard, tensors, header.metadata)
            return shard
    raise AssertionError(f"{name} not found in {folder}")


# --- 1. verify against what config.json's architecture implies ---


def test_missing_layer_embedding_and_head_are_errors(capsys, monkeypatch, sandbox: Sandbox) -> None:
    tensors = {
        k: v for k, v in llama_tensors().items() if ".layers.1." not in k and k not in ("lm_head.weight",
                                                                                        "model.embed_tokens.weight")
    }  # fmt: skip
    folder = write_checkpoint(sandbox.root / "ckpt", tensors)
    result, findings = _verify(capsys, monkeypatch, sandbox, folder)
    assert result.code == 1
    by_check = {(f["check"], f["tensor"]) for f in _errors(findings)}
    assert by_check == {
        ("arch.missing-layer", None),
        ("arch.missing-tensor", "lm_head.weight"),
        ("arch.missing-tensor", "model.embed_tokens.weight"),
    }, findings
    layer = next(f for f in findings if f["check"] == "arch.missing-layer")
    assert layer["file"] == "config.json" and "layer 1 of the 2" in layer["message"]
    assert "verify: 3 error(s)" in run_inprocess(capsys, monkeypatch, "verify", folder).out


def test_a_projection_of_the_wrong_shape_is_an_error(capsys, monkeypatch, sandbox: Sandbox) -> None:
    tensors = llama_tensors()
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name][:96, :128]
    folder = write_checkpoint(sandbox.root / "ckpt", tensors)
    result, findings = _verify(capsys, monkeypatch, sandbox, folder)
    assert result.code == 1
    (shape,) = _errors(findings)
    assert (shape["check"], shape["file"], shape["tensor"]) == ("arch.shape", "model.safetensors", name)
    assert "is [96, 128] but config.json implies [256, 256]" in shape["message"]


def test_layers_beyond_the_config_are_an_error(capsys, monkeypatch, sandbox: Sandbox) -> None:
    folder = write_checkpoint(sandbox.root / "ckpt", llama_tensors(), dict(LLAMA_CONFIG, num_hidden_layers=1))
    result, findings = _verify(capsys, monkeypatch, sandbox, folder)
    (extra,) = _errors(findings)
    assert result.code == 1 and extra["check"] == "arch.extra-layer" and extra["tensor"].startswith("model.layers.1.")


def test_a_huge_layer_count_is_ranges_not_a_loop(capsys, monkeypatch, sandbox: Sandbox) -> None:
    folder = write_checkpoint(sandbox.root / "ckpt", llama_tensors(), dict(LLAMA_CONFIG, num_hidden_layers=10**12))
    result, findings = _verify(capsys, monkeypatch, sandbox, folder)
    (missing,) = _errors(findings)
    assert result.code == 1 and "layers 2-999999999999 of the 1,000,000,000,000" in missing["message"]


def test_a_size_that_is_not_a_number_is_an_error(capsys, monkeypatch, sandbox: Sandbox) -> None:
    folder = write_checkpoint(sandbox.root / "ckpt", llama_tensors(), dict(LLAMA_CONFIG, hidden_size="256"))
    result, findings = _verify(capsys, monkeypatch, sandbox, folder)
    (bad,) = _errors(findings)
    assert result.code == 1 and bad["check"] == "arch.config" and "hidden_size is '256'" in bad["message"]


def test_quantized_weights_are_compared_by_their_logical_shape(tiny, capsys, monkeypatch, sandbox: Sandbox) -> None:
    """W4A16 packs [64, 64] into [64, 8] int32 words: verify compares `weight_shape`, and catches it lying."""
    _, quant = copies(sandbox, tiny)
    result, findings = _verify(capsys, monkeypatch, sandbox, quant)
    assert result.code == 0 and _errors(findings) == [], findings
    name = "model.layers.0.self_attn.q_proj"
    _edit(quant, f"{name}.weight_shape", lambda a: np.array([64, 96], np.int64))
    result, findings = _verify(capsys, monkeypatch, sandbox, quant)
    assert result.code == 1
    shape = next(f for f in _errors(findings) if f["check"] == "arch.shape")
    assert shape["tensor"] == f"{name}.weight" and "is [64, 96] but config.json implies [64, 64]" in shape["message"]


def test_tied_embeddings_need_no_head(capsys, monkeypatch, sandbox: Sandbox) -> None:
    tensors = {k: v for k, v in llama_tensors().items() if k != "lm_head.weight"}
    folder = write_checkpoint(sandbox.root / "ckpt", tensors, dict(LLAMA_CONFIG, tie_word_embeddings=True))
    result, findings = _verify(capsys, monkeypatch, sandbox, folder)
    assert result.code == 0 and findings == [], findings


@pytest.mark.parametrize(
    ("architectures", "said"),
    [
        (["LlamaForCausalLMEagle3"], "architecture LlamaForCausalLMEagle3"),
        (["Qwen3MoeForCausalLM"], "architecture Qwen3MoeForCausalLM"),
        (None, "no architectures in config.json"),
    ],
)
def test_an_unknown_architecture_says_what_was_not_checked(
    architectures, said, capsys, monkeypatch, sandbox: Sandbox
) -> None:
    tensors = {k: v for k, v in llama_tensors().items() if ".layers.1." not in k}
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "architectures"}
    if architectures is not None:
        config["architectures"] = architectures
    folder = write_checkpoint(sandbox.root / "ckpt", tensors, config)
    result, findings = _verify(capsys, monkeypatch, sandbox, folder)
    (note,) = findings
    assert result.code == 0 and note["severity"] == "info" and note["check"] == "arch.not-checked"
    assert said in note["message"] and "not checked" in note["message"]


# --- 2. scales must be positive; config.json numbers must be finite ---


@pytest.mark.parametrize("value", [-1.0, 0.0])
def test_scan_values_refuses_a_scale_that_is_not_positive(value, capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY_LLAMA), TINY_LLAMA)
    quant = quantize(QuantizeRequest(src, sandbox.root / "fp8", scheme="fp8-dynamic", workers=1)).output
    name = "model.layers.0.mlp.down_proj.weight_scale"
    shard = _edit(quant, name, lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, value, a).astype(a.dtype))
    result, findings = _verify(capsys, monkeypatch, sandbox, quant)
    assert result.code == 0  # without --scan-values the values are not read, and the summary says so
    result, findings = _verify(capsys, monkeypatch, sandbox, quant, "--scan-values")
    (bad,) = _errors(findings)
    assert result.code == 1 and (bad["check"], bad["file"], bad["tensor"]) == (
        "values.scale-not-positive",
        shard.name,
        name,
    )
    assert "holds 1 zero or negative values" in bad["message"]


@pytest.mark.parametrize(("raw", "shown"), [("NaN", "'NaN'"), ("1e400", "'1e400'"), ("-Infinity", "'-Infinity'")])
def test_non_finite_numbers_in_config(raw, shown, capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY_LLAMA), TINY_LLAMA)
    config = src / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-05', f'"rms_norm_eps": {raw}'))
    assert raw in config.read_text()
    result, findings = _verify(capsys, monkeypatch, sandbox, src)
    (bad,) = _errors(findings)
    assert result.code == 1 and (bad["check"], bad["file"]) == ("json.non-finite", "config.json")
    assert f"holds {shown} at rms_norm_eps, not a finite number" in bad["message"]

    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--workers", "1")
    line = result.error_line
    assert result.code == 2 and str(config) in line and "rms_norm_eps" in line and "not a finite number" in line
    assert not (sandbox.root / "out").exists()
    sandbox.assert_untouched()


def test_a_nested_non_finite_number_is_named_by_its_path(capsys, monkeypatch, sandbox: Sandbox) -> None:
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY_LLAMA), TINY_LLAMA)
    config = src / "config.json"
    config.write_text(config.read_text()[:-2] + ', "rope_scaling": {"factors": [1.0, Infinity]}\n}')
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--workers", "1")
    assert result.code == 2 and "at rope_scaling.factors[1]" in result.error_line
    sandbox.assert_untouched()


# --- 3. calibrate-kv: refuses a source that fails verify; its output passes verify ---


def _fake_measurement(monkeypatch, maxima: tuple[float, float]) -> None:
    """Calibration tokens and KV maxima without a tokenizer or a model run: the command around them is tested."""
    from weightsmith.calibration import measure as calibrate
    from weightsmith.fidelity import logits

    def measure(folder, sequences, **_):
        names = read_header(Path(folder) / "model.safetensors").tensors
        attention = sorted({n.rsplit(".", 2)[0] for n in names if ".k_proj.weight" in n})
        return {a: maxima for a in attention}, None

    monkeypatch.setattr(logits, "missing_library", lambda: None)
    tokens = calibrate.CalibrationTokens([list(range(64))] * 64, "test", "0" * 64, "lines-v1")
    monkeypatch.setattr(calibrate, "calibration_tokens", lambda *a, **kw: tokens)
    monkeypatch.setattr(calibrate, "measure", measure)


def _calibrate_kv(capsys, monkeypatch, sandbox: Sandbox, *args: object) -> Result:
    sandbox.freeze()
    return run_inprocess(capsys, monkeypatch, "calibrate-kv", *args, "--tokens", "4096", "--seq-len", "64")


def test_calibrate_kv_refuses_a_target_that_fails_verify(tiny, capsys, monkeypatch, sandbox: Sandbox) -> None:
    _, quant = copies(sandbox, tiny)
    config = json.loads((quant / "config.json").read_text())
    (quant / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=2)))
    _fake_measurement(monkeypatch, (4.0, 2.0))
    result = _calibrate_kv(capsys, monkeypatch, sandbox, quant)
    line = result.error_line
    assert result.code == 2 and str(quant) in line and "fails verify" in line and "layer 1 of the 2" in line, line
    sandbox.assert_untouched()


def test_calibrate_kv_refuses_a_from_source_that_fails_verify(tiny, capsys, monkeypatch, sandbox: Sandbox) -> None:
    orig, quant = copies(sandbox, tiny)
    _edit(orig, "model.layers.0.mlp.up_proj.weight", lambda a: a[:, :32])
    _fake_measurement(monkeypatch, (4.0, 2.0))
    result = _calibrate_kv(capsys, monkeypatch, sandbox, quant, "--from", orig)
    line = result.error_line
    assert result.code == 2 and str(orig) in line and "up_proj.weight" in line and "[128, 32]" in line, line
    sandbox.assert_untouched()


@pytest.mark.parametrize("maxima", [(math.nan, 1.0), (1.0, math.inf), (1e39, 1.0)])
def test_calibrate_kv_refuses_a_maximum_that_gives_no_scale(
    maxima, tiny, capsys, monkeypatch, sandbox: Sandbox
) -> None:
    """A NaN or infinite activation maximum used to be written as a NaN or Inf scale, and exit 0."""
    _, quant = copies(sandbox, tiny)
    _fake_measurement(monkeypatch, maxima)
    result = _calibrate_kv(capsys, monkeypatch, sandbox, quant)
    line = result.error_line
    assert result.code == 2 and "model.layers.0.self_attn" in line and "no usable FP8 scale" in line, line
    sandbox.assert_untouched()


def test_calibrate_kv_output_passes_verify(tiny, capsys, monkeypatch, sandbox: Sandbox) -> None:
    _, quant = copies(sandbox, tiny)
    _fake_measurement(monkeypatch, (4.0, 2.0))
    result = _calibrate_kv(capsys, monkeypatch, sandbox, quant, "--out", sandbox.root / "kv")
    assert result.code == 0, result.err
    sandbox.assert_untouched("kv")
    result, findings = _verify(capsys, monkeypatch, sandbox, sandbox.root / "kv")
    assert result.code == 0 and findings == [], findings
