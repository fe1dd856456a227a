"""`eval` tells when the text the models read overlaps what QUANT was calibrated on: GPTQ's default
calibration (the built-in code, json/decoder.py first) against eval on json/decoder.py, a stats file's
calibration copied into the manifest, an unrelated text, eval's default text, and an old manifest."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest

from clirun import run
from weightsmith.api import Hooks, QuantizeRequest, evaluate, quantize
from weightsmith.fidelity.calibrated_on import DISJOINT, OVERLAP, UNKNOWN
from weightsmith.io import texts

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

DECODER = Path(sysconfig.get_paths()["stdlib"]) / texts.CODE_FIRST


@pytest.fixture(scope="module")
def gptq_default(tiny_lm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_lm`'s original quantized with GPTQ on the default calibration text and tokens."""
    request = QuantizeRequest(
        tiny_lm[0], tmp_path_factory.mktemp("overlap") / "gptq", scheme="w4a16", method="gptq", group_size=32
    )
    return quantize(request, Hooks(warn=lambda _: None)).output


def _eval(capsys, monkeypatch, orig: Path, quant: Path, *extra: object) -> tuple[list[dict], str]:
    code, out, err = run(capsys, monkeypatch, "eval", orig, quant, "--json", *extra)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["logits"]["status"] == "ok"
    return doc["calibration_overlap"], err


def test_eval_on_the_first_calibration_file_is_flagged(
    tiny_lm: tuple[Path, Path], gptq_default: Path, capsys, monkeypatch
) -> None:
    (found,), err = _eval(capsys, monkeypatch, tiny_lm[0], gptq_default, "--text", DECODER, "--tokens", 512)
    assert found["record"] == "calibration" and found["status"] == OVERLAP, found
    assert found["eval_text"] == str(DECODER) and found["calibration_text"].startswith("builtin:code")
    assert found["calibration_tokens"] == 2048
    assert found["shared_chars"] > 0.5 * found["eval_chars"] > 0
    assert found["shared_fraction"] == pytest.approx(found["shared_chars"] / found["eval_chars"])
    (line,) = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert str(DECODER) in line and "builtin:code" in line and f"at least {found['shared_chars']:,} of" in line

    # the library's result says the same
    report = evaluate(tiny_lm[0], gptq_default, text=DECODER, tokens=512)
    assert report.calibration_overlap is not None
    assert [(o.status, o.shared_chars) for o in report.calibration_overlap] == [(OVERLAP, found["shared_chars"])]


def test_a_text_holding_the_calibration_file_after_other_text_is_flagged(
    tiny_lm: tuple[Path, Path], gptq_default: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    text = tmp_path / "notes.py"
    preamble = "".join(f"# note {i}: the parser keeps line {i * 7} of the input\n" for i in range(30))
    text.write_text(preamble + DECODER.read_text())
    (found,), err = _eval(capsys, monkeypatch, tiny_lm[0], gptq_default, "--text", text, "--tokens", 2048)
    # the calibration's 2,048 tokens cover the first third or so of json/decoder.py; the notes are not in it
    assert found["status"] == OVERLAP and found["shared_chars"] > 0.25 * found["eval_chars"], found
    assert found["shared_chars"] <= found["eval_chars"] - len(preamble.replace("\n", ""))
    assert "warning:" in err


def test_unrelated_and_default_texts_are_not_flagged(
    tiny_lm: tuple[Path, Path], gptq_default: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    text = tmp_path / "other.py"
    text.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(300)))
    for extra in (("--text", text), ()):
        (found,), err = _eval(capsys, monkeypatch, tiny_lm[0], gptq_default, "--tokens", 512, *extra)
        assert found["status"] == DISJOINT and found["shared_chars"] == 0 and found["eval_chars"] > 500, found
        assert "warning" not in err
    assert found["eval_text"] == texts.default_text().source


def test_a_manifest_without_chunk_hashes_cannot_tell(
    tiny_lm: tuple[Path, Path], gptq_default: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    old = shutil.copytree(gptq_default, tmp_path / "old")
    manifest = json.loads((old / "weightsmith.json").read_text())
    del manifest["calibration"]["text_chunks"]
    (old / "weightsmith.json").write_text(json.dumps(manifest))
    (found,), err = _eval(capsys, monkeypatch, tiny_lm[0], old, "--text", DECODER, "--tokens", 256)
    assert found["status"] == UNKNOWN and "no chunk hashes" in found["reason"], found
    assert "warning" not in err


def test_a_data_free_checkpoint_has_nothing_to_compare(tiny_lm: tuple[Path, Path], capsys, monkeypatch) -> None:
    found, _ = _eval(capsys, monkeypatch, *tiny_lm, "--text", DECODER, "--tokens", 64)
    assert found == []


def test_calibration_from_a_statistics_file_is_checked(
    tiny_lm: tuple[Path, Path], tmp_path: Path, capsys, monkeypatch
) -> None:
    """`calibrate` records the chunks in the statistics file; `quantize --calibration` keeps them."""
    orig, stats = tiny_lm[0], tmp_path / "stats.safetensors"
    code, _, err = run(capsys, monkeypatch, "calibrate", orig, "--out", stats, "--tokens", 512, "--seq-len", 128)
    assert code == 0, err
    fp8 = quantize(
        QuantizeRequest(orig, tmp_path / "fp8", scheme="fp8", calibration=stats), Hooks(warn=lambda _: None)
    ).output
    (found,), err = _eval(capsys, monkeypatch, orig, fp8, "--text", DECODER, "--tokens", 128)
    assert found["status"] == OVERLAP and found["calibration_tokens"] == 512, found
    assert "warning:" in err
