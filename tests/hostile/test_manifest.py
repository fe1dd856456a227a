"""Hostile `weightsmith.json` handed to `card` and `card --check`: one line naming the file and the field.

A manifest is a file anyone can give the card (or edit inside a downloaded checkpoint), so every
field is read as the typed record declares it: wrong types, missing fields, numbers no run writes
(negative, beyond 2**63, longer than Python converts, infinite), a version this tool never wrote,
a scheme name that would break the card's front matter, and a top level that is not an object.
Nothing is written: no card, no kept `inspect.json` or `verify.json`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from hostile.harness import Sandbox, run_inprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.io.manifest import MANIFEST_VERSION

TINY = dict(LLAMA_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=64, num_hidden_layers=1)  # fmt: skip
MANIFEST = "weightsmith.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer Llama quantized W4A16 g32, for each case to copy into its sandbox."""
    root = tmp_path_factory.mktemp("tiny-manifest")
    src = write_checkpoint(root / "src", llama_tensors(TINY), TINY)
    return quantize(
        QuantizeRequest(src, root / "quant", scheme="w4a16", group_size=32, workers=1, hash_sources=False)
    ).output


def quant_copy(sandbox: Sandbox, tiny: Path) -> Path:
    quant = sandbox.root / "quant"
    shutil.copytree(tiny, quant)
    return quant


def edited(change: Callable[[dict], object]) -> Callable[[str], str]:
    """An edit of the manifest's text that changes the parsed document and writes it back as JSON."""

    def edit(text: str) -> str:
        doc = json.loads(text)
        change(doc)
        return json.dumps(doc, indent=2)

    return edit


def replaced(field: str, raw: str) -> Callable[[str], str]:
    """An edit that puts raw JSON text (`1e400`, `NaN`, a 5,000-digit integer) as the value of `field`."""

    def edit(text: str) -> str:
        doc = json.loads(text)
        section, key = field.split(".")
        doc[section][key] = "@@"
        return json.dumps(doc, indent=2).replace('"@@"', raw)

    return edit


def _rule(d: dict) -> dict:
    return d["recipe"]["rules"][0]


CASES: list[tuple[str, Callable[[str], str], str]] = [
    ("top-level-list", lambda text: "[1, 2]", "weightsmith.json: is not a JSON object"),
    ("top-level-string", lambda text: '"weightsmith"', "weightsmith.json: is not a JSON object"),
    ("empty-object", lambda text: "{}", "weightsmith.json: has no field manifest_version"),
    ("version-string", edited(lambda d: d.update(manifest_version="2")), "manifest_version is a string, not an int"),
    ("version-bool", edited(lambda d: d.update(manifest_version=True)), "manifest_version is true or false, not an"),
    ("version-newer", edited(lambda d: d.update(manifest_version=MANIFEST_VERSION + 1)),
     f"manifest_version {MANIFEST_VERSION + 1} is not one this"),
    ("version-huge", edited(lambda d: d.update(manifest_version=10**40)), "manifest_version is a 41-digit int"),
    ("tool-null", edited(lambda d: d.update(tool=None)), "tool is null, not an object"),
    ("no-source-format", edited(lambda d: d["recipe"].pop("source_format")), "has no field recipe.source_format"),
    ("no-sizes", edited(lambda d: d.pop("sizes")), "has no field sizes"),
    ("rules-object", edited(lambda d: d["recipe"].update(rules={})), "recipe.rules is an object, not a list or null"),
    ("rule-not-object", edited(lambda d: d["recipe"]["rules"].append("w4a16")), "recipe.rules[1] is a string, not an"),
    ("rule-targets-nested", edited(lambda d: _rule(d).update(targets=[["re:.*"]])),
     "recipe.rules[0].targets[0] is a list, not a string"),
    ("rule-count-negative", edited(lambda d: _rule(d).update(quantized=-1)),
     "recipe.rules[0].quantized is -1, not a count from 0 to 2**63-1"),
    ("rule-no-group", edited(lambda d: _rule(d).update(config_group=None)),
     "recipe.rules[0].config_group is null, yet the rule quantized"),
    ("ignore-null-entry", edited(lambda d: d["recipe"]["ignore"].append(None)), "recipe.ignore[1] is null, not a str"),
    ("bits-float", edited(lambda d: d["recipe"].update(num_bits=4.5)), "recipe.num_bits is a number, not an integer"),
    ("bytes-huge", edited(lambda d: d["sizes"].update(bytes_after=10**30)),
     "sizes.bytes_after is a 31-digit integer, not a count"),
    ("bytes-5000-digits", replaced("sizes.bytes_after", "9" * 5000), "is not valid JSON (an integer of more than"),
    ("gib-infinite", replaced("sizes.gib_saved", "1e400"), "sizes.gib_saved is inf, not a finite number"),
    ("bits-nan", replaced("sizes.bits_per_parameter_after", "NaN"),
     "sizes.bits_per_parameter_after is nan, not a finite number"),
    ("files-list", edited(lambda d: d["source"].update(files=[])), "source.files is a list, not an object"),
    ("file-entry-string", edited(lambda d: d["source"]["files"].update(x="big")),
     "source.files[x] is a string, not an object"),
    ("category-bytes-bool", edited(lambda d: d["sizes"]["by_category"].update(attention={"bytes_before": True,
                                                                                        "bytes_after": 1})),
     "sizes.by_category[attention].bytes_before is true or false, not an integer or a number"),
    ("scheme-newline", edited(lambda d: d["recipe"].update(scheme="w4a16\nlicense: mit")),
     "recipe.scheme 'w4a16\\nlicense: mit' is not a scheme name"),
    ("calibration-partial", edited(lambda d: d.update(calibration={"tokens": 1})),
     "has no field calibration.model_fingerprint"),
    ("calibration-activations", edited(lambda d: d.update(calibration={
        "model_fingerprint": "sha256:00", "tokens": 1, "sequences": 1, "seq_len": 1, "text": "t",
        "text_sha256": "00", "activations": "both"})), "calibration.activations must be one of original, quantized"),
    ("skipped-not-text", edited(lambda d: d.update(skipped_files={"pipe": 3})), "skipped_files[pipe] is an integer"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_card_refuses_a_hostile_manifest(sandbox: Sandbox, tiny: Path, capsys, monkeypatch, edit, expected) -> None:
    quant = quant_copy(sandbox, tiny)
    path = quant / MANIFEST
    path.write_text(edit(path.read_text()))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    assert result.code == 2
    line = result.error_line
    assert f"{path}: " in line and expected in line, line
    sandbox.assert_untouched()  # no card, no kept inspect.json or verify.json


def test_card_check_refuses_a_manifest_garbled_after_the_card(
    sandbox: Sandbox, tiny: Path, capsys, monkeypatch
) -> None:
    quant = quant_copy(sandbox, tiny)
    assert run_inprocess(capsys, monkeypatch, "card", quant).code == 0
    path = quant / MANIFEST
    path.write_text(edited(lambda d: d["tensors"].update(keep="all"))(path.read_text()))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant, "--check")
    assert result.code == 2
    assert f"{path}: tensors.keep is a string, not an integer" in result.error_line
    sandbox.assert_untouched()


def test_a_hostile_key_is_shown_escaped_and_cut(sandbox: Sandbox, tiny: Path, capsys, monkeypatch) -> None:
    """A shard name with terminal escapes and 10,000 characters names the entry without driving the terminal."""
    quant = quant_copy(sandbox, tiny)
    path = quant / MANIFEST
    key = "\x1b[2J" + "s" * 10_000
    path.write_text(edited(lambda d: d["source"]["files"].update({key: {"bytes": "x"}}))(path.read_text()))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    assert result.code == 2
    line = result.error_line
    assert "\x1b" not in line and "\\x1b[2J" in line and "is a string, not an integer" in line
    assert len(line) < 400, len(line)
    sandbox.assert_untouched()
