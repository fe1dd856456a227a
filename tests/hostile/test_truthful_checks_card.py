"""A card's numbers are checked as numbers, in range, and against each other where two sources state one fact.

`card --check` used to pass `14<!-- weightsmith.json: tensors.quantize -->0` (which reads as 140),
and a manifest count edited, with the card, to disagree with the inspect figure the same card
cites; `card` published a KL of -5 and a top-1 agreement of 170 % from an eval file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostile.harness import Result, Sandbox, carded, copies, run_inprocess, tiny_pair

QUANTIZED = "weightsmith.json: tensors.quantize -->"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


def _check(sandbox: Sandbox, capsys, monkeypatch, folder: Path) -> Result:
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", folder, "--check")
    assert "Traceback" not in result.err and result.err == "", result.err
    sandbox.assert_untouched()
    return result


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def test_a_cited_number_followed_by_digits_fails_the_check(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    quant = carded(sandbox, tiny, capsys, monkeypatch)
    _edit(quant / "README.md", f"7<!-- {QUANTIZED}", f"7<!-- {QUANTIZED}0")
    result = _check(sandbox, capsys, monkeypatch, quant)
    assert result.code == 1
    assert "7 citing weightsmith.json: tensors.quantize is followed by '0'" in result.out, result.out
    assert "1 mismatch(es)" in result.out


@pytest.mark.parametrize("after", [".5", ",000", "x"])
def test_anything_that_extends_the_number_fails_the_check(
    after: str, sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    quant = carded(sandbox, tiny, capsys, monkeypatch)
    _edit(quant / "README.md", f"7<!-- {QUANTIZED}", f"7<!-- {QUANTIZED}{after}")
    result = _check(sandbox, capsys, monkeypatch, quant)
    assert result.code == 1 and f"is followed by {after[:2]!r}" in result.out, result.out


def test_a_manifest_count_that_disagrees_with_inspect(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """The manifest and the card edited together: the card still disagrees with what inspect counts."""
    quant = carded(sandbox, tiny, capsys, monkeypatch)
    manifest = json.loads((quant / "weightsmith.json").read_text())
    assert manifest["tensors"]["quantize"] == 7
    manifest["tensors"]["quantize"] = 70
    manifest["recipe"]["rules"][0]["quantized"] = 70
    (quant / "weightsmith.json").write_text(json.dumps(manifest, indent=2))
    _edit(quant / "README.md", f"7<!-- {QUANTIZED}", f"70<!-- {QUANTIZED}")
    result = _check(sandbox, capsys, monkeypatch, quant)
    assert result.code == 1, result.out
    assert (
        "weightsmith.json: tensors.quantize is 70, but inspect.json counts 7 modules stored quantized" in result.out
    ), result.out

    # writing a card from that manifest is refused: nothing written
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    line = result.error_line
    assert result.code == 2 and str(quant) in line and "inspect.json counts 7" in line and "nothing written" in line
    sandbox.assert_untouched()


def test_a_manifest_total_that_disagrees_with_its_rules(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    _, quant = copies(sandbox, tiny)
    manifest = json.loads((quant / "weightsmith.json").read_text())
    manifest["recipe"]["rules"][0]["quantized"] = 5
    (quant / "weightsmith.json").write_text(json.dumps(manifest, indent=2))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    line = result.error_line
    assert result.code == 2 and "tensors.quantize is 7, but its recipe rules quantized 5" in line, line
    sandbox.assert_untouched()


def _eval_doc() -> dict:
    return {
        "schema": "weightsmith.eval", "schema_version": 1, "orig": "o", "quant": "q",
        "weights": {"source_format": "dense", "layers": [], "categories": [],
                    "overall": {"name": "overall", "layers": 1, "numel": 10, "rel_mse": 0.01, "sqnr_db": 20.0},
                    "original_grid": {"blocks": 10, "on_4bit_grid": 0}},
        "logits": {"status": "ok", "reason": None, "text_source": "t", "tokens": 8, "kl": 0.1, "top1_agreement": 0.9,
                   "ppl_orig": 7.0, "ppl_quant": 7.5},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d["logits"].update(kl=-5), "logits.kl is -5, out of range: it must be at least"),
        (lambda d: d["logits"].update(top1_agreement=1.7), "logits.top1_agreement is 1.7, out of range: it must be "
                                                           "from 0 to 1"),
        (lambda d: d["logits"].update(ppl_quant=0.5), "logits.ppl_quant is 0.5, out of range: it must be at least 1"),
        (lambda d: d["logits"].update(tokens=-8), "logits.tokens is -8, out of range"),
        (lambda d: d["weights"]["overall"].update(rel_mse=-0.01), "weights.overall.rel_mse is -0.01, out of range"),
        (lambda d: d["weights"]["original_grid"].update(on_4bit_grid=11), "on_4bit_grid is 11, more than the 10"),
    ],
    ids=["kl-negative", "top1-170", "ppl-below-1", "tokens-negative", "mse-negative", "grid-over"],
)  # fmt: skip
def test_card_refuses_eval_figures_out_of_range(change, said, sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    _, quant = copies(sandbox, tiny)
    doc = _eval_doc()
    change(doc)
    eval_json = sandbox.root / "eval-in.json"
    eval_json.write_text(json.dumps(doc))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant, "--eval", eval_json)
    line = result.error_line
    assert result.code == 2 and "eval-in.json" in line and said in line, line
    sandbox.assert_untouched()


def test_card_with_figures_in_range_publishes_them(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """The valid edge beside the refusals: KL 0, top-1 100 %, perplexity 1 are all measurements."""
    _, quant = copies(sandbox, tiny)
    doc = _eval_doc()
    doc["logits"].update(kl=0, top1_agreement=1, ppl_orig=1, ppl_quant=1.0)
    eval_json = sandbox.root / "eval-in.json"
    eval_json.write_text(json.dumps(doc))
    result = run_inprocess(capsys, monkeypatch, "card", quant, "--eval", eval_json)
    assert result.code == 0, result.err
    assert "100.0<!-- eval.json: logits.top1_agreement -->" in (quant / "README.md").read_text()
    assert run_inprocess(capsys, monkeypatch, "card", quant, "--check").code == 0
