"""`weightsmith eval` on the command line: the table, the JSON object, and one line for bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from eval_checkpoints import quantize
from safetensors.numpy import load_file, save_file

from clirun import run
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.fidelity.report import SCHEMA, SCHEMA_VERSION, fmt_rel
from weightsmith.fidelity.weights import weight_error
from weightsmith.formats import compressors


def test_table(synthetic: Path, synthetic_w4: Path, capsys, monkeypatch) -> None:
    code, out, _ = run(capsys, monkeypatch, "eval", str(synthetic), str(synthetic_w4), "--no-logits")
    assert code == 0
    report = weight_error(synthetic, synthetic_w4)
    assert "weight error by category" in out and "weight error by layer of 14" in out
    overall = next(line for line in out.splitlines() if "overall" in line)
    assert fmt_rel(report.overall.rel_mse) in overall and "14" in overall
    assert "attention" in out and "dense mlp" in out and "model.layers.1.mlp.down_proj" in out
    assert "14 quantized layers measured, 2 2-D weights kept unquantized" in out
    assert out.rstrip().endswith("logits: skipped: --no-logits")


def test_layers_option_shows_the_worst_first(synthetic: Path, synthetic_w4: Path, capsys, monkeypatch) -> None:
    args = ["eval", str(synthetic), str(synthetic_w4), "--no-logits", "--layers", "3"]
    code, out, _ = run(capsys, monkeypatch, *args)
    assert code == 0 and "worst 3 layers of 14" in out
    worst = max(weight_error(synthetic, synthetic_w4).layers, key=lambda layer: layer.rel_mse)
    table = out[out.index("worst 3 layers") :]
    rows = [line for line in table.splitlines() if "model.layers." in line]
    assert len(rows) == 3 and worst.module in rows[0]


def test_json(synthetic: Path, synthetic_w4: Path, capsys, monkeypatch) -> None:
    code, out, _ = run(capsys, monkeypatch, "eval", str(synthetic), str(synthetic_w4), "--no-logits", "--json")
    assert code == 0
    doc = json.loads(out)
    assert list(doc)[:2] == ["schema", "schema_version"]
    assert doc["schema"] == SCHEMA and doc["schema_version"] == SCHEMA_VERSION
    assert doc["orig"] == str(synthetic) and doc["quant"] == str(synthetic_w4)
    report = weight_error(synthetic, synthetic_w4)
    w = doc["weights"]
    assert len(w["layers"]) == 14 and w["overall"]["rel_mse"] == report.overall.rel_mse
    assert w["layers"][0] == {
        "module": "model.layers.0.mlp.down_proj",
        "category": "dense mlp",
        "group": "W4A16",
        "format": "pack-quantized",
        "shape": [256, 512],
        "numel": 131072,
        "sq_error": report.layers[0].sq_error,
        "sq_norm": report.layers[0].sq_norm,
        "rel_mse": report.layers[0].rel_mse,
        "sqnr_db": report.layers[0].sqnr_db,
    }
    assert [c["name"] for c in w["categories"]] == ["attention", "dense mlp"]
    assert w["kept"] == ["lm_head", "model.embed_tokens"] and w["unsupported"] == []
    assert doc["logits"]["status"] == "skipped" and doc["logits"]["kl"] is None


def test_unsupported_format_is_a_line_not_a_crash(
    synthetic: Path, synthetic_w4: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_yet(fmt: str, weights: dict, params: dict) -> None:
        raise NotImplementedError(f"dequantizing {fmt}")

    monkeypatch.setattr(compressors, "decompress", not_yet)
    code, out, _ = run(capsys, monkeypatch, "eval", str(synthetic), str(synthetic_w4), "--no-logits")
    assert code == 0
    assert "format not supported yet, 14 layers not measured (pack-quantized: dequantizing pack-quantized)" in out
    code, out, _ = run(capsys, monkeypatch, "eval", str(synthetic), str(synthetic_w4), "--no-logits", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["weights"]["overall"]["rel_mse"] is None and len(doc["weights"]["unsupported"]) == 14


def test_logits_unavailable_is_a_line_with_exit_0(synthetic: Path, synthetic_w4: Path, capsys, monkeypatch) -> None:
    """No tokenizer here (and, on a machine without torch, no torch): reported, not raised."""
    code, out, err = run(capsys, monkeypatch, "eval", str(synthetic), str(synthetic_w4))
    last = out.strip().splitlines()[-1]
    assert code == 0 and last.startswith("logits: unavailable: ") and "error:" not in err
    assert "no tokenizer" in last or "is not installed" in last


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    qc = config.get("quantization_config") or {}
    for key, value in changes.items():
        qc[key] = value
    path.write_text(json.dumps(dict(config, quantization_config=qc)))


def _drop_tensor(folder: Path, name: str) -> None:
    """Rewrite a single-file checkpoint without one tensor."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    del tensors[name]
    save_file(tensors, str(path))


@pytest.fixture(scope="module")
def single_file_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bad")
    orig = write_checkpoint(root / "orig", llama_tensors())
    return orig, quantize(orig, root / "quant")


def _bad_cases(orig: Path, quant: Path, tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments after `eval`, text the one error line must contain)."""
    missing_module = _copy(orig, tmp / "orig-missing")
    _drop_tensor(missing_module, "model.layers.1.mlp.up_proj.weight")
    other_shape = dict(LLAMA_CONFIG, intermediate_size=384)
    resized = write_checkpoint(tmp / "orig-resized", llama_tensors(other_shape), other_shape)
    no_scale = _copy(quant, tmp / "quant-no-scale")
    _drop_tensor(no_scale, "model.layers.0.self_attn.k_proj.weight_scale")
    awq = _copy(quant, tmp / "quant-awq")
    _edit_config(awq, quant_method="awq")
    return {
        "missing folder": ([str(tmp / "nowhere"), str(quant)], f"{tmp / 'nowhere'}: does not exist"),
        "quant not quantized": ([str(orig), str(orig)], f"{orig / 'config.json'}: has no quantization_config"),
        "orig already quantized": ([str(quant), str(quant)], f"{quant / 'config.json'}: is already quantized"),
        "not compressed-tensors": ([str(orig), str(awq)], "quant_method is 'awq'"),
        "modules do not correspond": (
            [str(missing_module), str(quant)],
            f"{missing_module}: tensor 'model.layers.1.mlp.up_proj.weight': is not in ORIG, but QUANT quantizes",
        ),
        "shape mismatch": (
            [str(resized), str(quant)],
            "tensor 'model.layers.0.mlp.down_proj.weight_shape': declares shape [256, 512] "
            "but ORIG's model.layers.0.mlp.down_proj.weight is [256, 384]",
        ),
        "missing scale": (
            [str(orig), str(no_scale)],
            "tensor 'model.layers.0.self_attn.k_proj.weight_scale': is missing: pack-quantized needs it",
        ),
        "missing text": (
            [str(orig), str(quant), "--text", str(tmp / "none.txt")],
            "none.txt: cannot read --text file: No such file or directory",
        ),
    }


def test_bad_input_is_one_line(single_file_pair, tmp_path: Path, capsys, monkeypatch) -> None:
    orig, quant = single_file_pair
    for case, (args, expected) in _bad_cases(orig, quant, tmp_path).items():
        code, out, err = run(capsys, monkeypatch, "eval", *args, "--no-logits")
        lines = err.strip().splitlines()
        assert code == 2, (case, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, err)
        assert expected in lines[0], (case, lines[0])
        assert out == "", case
