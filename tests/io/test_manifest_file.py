"""The manifest: a typed record written as `weightsmith.json`, read back by field in every version it had."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import weightsmith
from clirun import run
from synth import llama_tensors, write_checkpoint
from weightsmith.card.cite import find_cited
from weightsmith.core.errors import WeightsmithError
from weightsmith.io.manifest import MANIFEST_FILE, MANIFEST_VERSION, Manifest, load_manifest
from weightsmith.io.provenance import Provenance

CALIBRATION = Provenance(
    model_fingerprint="sha256:" + "ab" * 32, tokens=8192, sequences=16, seq_len=512, text="wikitext-2",
    text_sha256="cd" * 32, activations="original",
)  # fmt: skip


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    src = write_checkpoint(root / "src", llama_tensors(), shards=2)
    weightsmith.quantize(
        weightsmith.QuantizeRequest(src, root / "out", scheme="w4a16", group_size=64, scale_search="none", workers=1)
    )  # as version 1 ran
    return root / "out"


def test_the_written_file_is_the_record_and_reads_back_to_the_same_bytes(quantized: Path) -> None:
    path = quantized / MANIFEST_FILE
    m = load_manifest(path)
    assert m.manifest_version == MANIFEST_VERSION and m.tool.name == "weightsmith"
    assert m.recipe.rules is not None and m.recipe.rules[0].config_group == "W4A16" and m.recipe.group_size == 64
    assert m.tensors.quantize == m.recipe.rules[0].quantized == 14
    assert set(m.source.files) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert all(f.sha256 is not None and len(f.sha256) == 64 for f in m.source.files.values())
    assert (json.dumps(m.to_json(), indent=2) + "\n").encode() == path.read_bytes()
    assert Manifest.from_json(m.to_json()) == m


def test_the_written_layout_keeps_its_order_and_leaves_out_what_was_not_set(quantized: Path) -> None:
    """Readers of version 2 (and diffs of two runs) see the keys where they always were."""
    doc = json.loads((quantized / MANIFEST_FILE).read_text())
    assert list(doc) == ["manifest_version", "tool", "created_utc", "recipe", "source", "tensors", "sizes"]
    assert list(doc["recipe"]) == ["scheme", "config_group", "num_bits", "group_size", "symmetric", "scale_search",
                                   "rules", "recipe_file", "preset", "ignore", "source_format"]  # fmt: skip
    assert list(doc["recipe"]["rules"][0]) == ["targets", "scheme", "config_group", "weights", "quantized"]
    assert list(doc["sizes"]) == ["bytes_before", "bytes_after", "gib_saved", "parameters",
                                  "bits_per_parameter_before", "bits_per_parameter_after", "by_category"]  # fmt: skip
    assert list(doc["tensors"]) == ["quantize", "keep", "decode", "drop"]
    assert isinstance(doc["sizes"]["bytes_after"], int) and isinstance(doc["sizes"]["gib_saved"], float)


def test_calibration_and_skipped_files_are_written_only_when_set(quantized: Path) -> None:
    m = load_manifest(quantized / MANIFEST_FILE)
    assert m.calibration is None and m.skipped_files == {}
    full = dataclasses.replace(m, calibration=CALIBRATION, skipped_files={"pipe": "is a FIFO, not a regular file"})
    doc = full.to_json()
    assert list(doc)[-2:] == ["calibration", "skipped_files"]
    assert doc["calibration"] == dataclasses.asdict(CALIBRATION)
    back = Manifest.from_json(json.loads(json.dumps(doc)))
    assert back == full and back.calibration == CALIBRATION


def version_1(doc: dict, *, earliest: bool = False) -> dict:
    """What a version-1 run wrote for the same checkpoint: no rules, no recipe file (nor scale search, earliest)."""
    old = json.loads(json.dumps(doc))
    old["manifest_version"] = 1
    for key in ("rules", "recipe_file", *(("scale_search",) if earliest else ())):
        del old["recipe"][key]
    return old


@pytest.mark.parametrize("earliest", [False, True], ids=["v1", "v1-before-scale-search"])
def test_version_1_manifests_are_read(quantized: Path, earliest: bool) -> None:
    doc = json.loads((quantized / MANIFEST_FILE).read_text())
    m = Manifest.from_json(version_1(doc, earliest=earliest), "old.json")
    assert m.manifest_version == 1 and m.recipe.rules is None and m.recipe.recipe_file is None
    assert m.recipe.scale_search is None and m.recipe.scheme == "w4a16" and m.recipe.num_bits == 4
    assert m.sizes == load_manifest(quantized / MANIFEST_FILE).sizes


def test_a_card_is_written_from_a_version_1_manifest(quantized: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    folder = tmp_path / "old"
    shutil.copytree(quantized, folder)
    doc = json.loads((folder / MANIFEST_FILE).read_text())
    (folder / MANIFEST_FILE).write_text(json.dumps(version_1(doc, earliest=True), indent=2))
    code, _, err = run(capsys, monkeypatch, "card", folder)
    assert code == 0, err
    card = (folder / "README.md").read_text()
    assert "integer weights, symmetric; activations stay 16-bit" in card  # the version-1 wording, without rules
    sources = {c.source: c.value for c in find_cited(card)}
    assert sources["weightsmith.json: recipe.group_size"] == "64"
    assert run(capsys, monkeypatch, "card", folder, "--check")[0] == 0


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (6, "manifest_version 6 is not one this weightsmith reads (1 to 5)"),
        (0, "manifest_version 0 is not one this weightsmith reads (1 to 5)"),
        (None, "manifest_version is null, not an integer"),
    ],
)
def test_a_version_this_tool_never_wrote_is_refused(quantized: Path, version, message: str) -> None:
    doc = json.loads((quantized / MANIFEST_FILE).read_text())
    doc["manifest_version"] = version
    with pytest.raises(WeightsmithError) as info:
        Manifest.from_json(doc, "m.json")
    assert str(info.value) == f"m.json: {message}"


def test_quantize_returns_the_typed_manifest(quantized: Path) -> None:
    """The library result holds the same record the file does (the file is that record's JSON)."""
    src = quantized.parent / "src"
    result = weightsmith.quantize(
        weightsmith.QuantizeRequest(
            src, quantized.parent / "again", scheme="w4a16", group_size=64, scale_search="none", workers=1
        )
    )
    assert isinstance(result.manifest, Manifest)
    assert result.manifest == load_manifest(result.output / MANIFEST_FILE)
    first = load_manifest(quantized / MANIFEST_FILE)
    assert dataclasses.replace(result.manifest, created_utc=first.created_utc) == first


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _embedded_manifests(doc: object) -> list[dict]:
    """Every manifest inside a JSON document (`quantize --json` output kept in a report)."""
    if isinstance(doc, dict):
        own = [doc] if "manifest_version" in doc else []
        return own + [m for v in doc.values() for m in _embedded_manifests(v)]
    if isinstance(doc, list):
        return [m for v in doc for m in _embedded_manifests(v)]
    return []


def test_the_version_1_manifests_kept_in_the_docs_are_read() -> None:
    """Files a version-1 run really wrote: the example card's, and each recipe's in the fidelity report."""
    example = load_manifest(DOCS / "examples" / "smollm2-135m-w4a16" / MANIFEST_FILE)
    assert example.manifest_version == 1 and example.recipe.rules is None and example.recipe.ignore == ["lm_head"]
    kept = _embedded_manifests(json.loads((DOCS / "fidelity-smollm2.json").read_text()))
    read = [Manifest.from_json(doc, "docs/fidelity-smollm2.json") for doc in kept]
    assert len(read) >= 6 and {m.manifest_version for m in read} == {1}
    assert {m.recipe.scale_search for m in read} == {None, "mse", "memoryless_mse"}


def test_the_example_card_checks_against_its_version_1_manifest(tmp_path: Path, capsys, monkeypatch) -> None:
    folder = tmp_path / "example"
    shutil.copytree(DOCS / "examples" / "smollm2-135m-w4a16", folder)
    code, out, err = run(capsys, monkeypatch, "card", folder, "--check")
    assert code == 0, err
    assert out.rstrip().endswith("cited numbers, ok"), out
