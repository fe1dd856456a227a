"""Hostile input to a card meant for publishing: repo ids, front matter and results files that must be one line."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from hostile.harness import Sandbox, run_inprocess
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.bench.paths import PathMap, local_paths

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, vocab_size=64, num_hidden_layers=1)  # fmt: skip


@pytest.fixture(scope="module")
def quant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    orig = write_checkpoint(root / "orig", llama_tensors(TINY), TINY)
    out = root / "quant"
    quantize(QuantizeRequest(orig, out, scheme="w4a16", group_size=32, workers=1, hash_sources=False, pre_pass=None))
    return out


def _copy(sandbox: Sandbox, quant: Path) -> Path:
    out = sandbox.root / "quant"
    shutil.copytree(quant, out)
    return out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--repo", "org/a\nb"], "--repo"),
        (["--repo", "../../etc/passwd"], "is not a Hub repository id"),
        (["--base", "org//x"], "--base"),
        (["--license", "[1, 2"], "license"),
        (["--license", "true"], "read back by huggingface_hub as True"),
    ],
)
def test_bad_repo_base_or_license_is_one_line_and_writes_nothing(
    sandbox: Sandbox, quant: Path, capsys, monkeypatch, args: list[str], says: str
) -> None:
    folder = _copy(sandbox, quant)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", folder, *args)
    assert result.code == 2
    assert says in result.error_line
    sandbox.assert_untouched()


def test_results_file_of_an_unknown_version_is_one_line(sandbox: Sandbox, quant: Path, capsys, monkeypatch) -> None:
    folder = _copy(sandbox, quant)
    bench = sandbox.root / "results.json"
    bench.write_text(json.dumps({"schema": "weightsmith.bench.results", "schema_version": 99}))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", folder, "--bench", bench, "--repo", "org/quant")
    assert result.code == 2
    line = result.error_line
    assert str(bench) in line and "schema version 99 is not a supported one (1 or 2)" in line
    sandbox.assert_untouched()


def test_check_on_unreadable_front_matter_names_the_card(sandbox: Sandbox, quant: Path, capsys, monkeypatch) -> None:
    folder = _copy(sandbox, quant)
    assert run_inprocess(capsys, monkeypatch, "card", folder).code == 0
    card = folder / "README.md"
    card.write_text(card.read_text().replace("library_name: transformers", "library_name: [transformers", 1))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", folder, "--check")
    assert result.code == 2
    line = result.error_line
    assert str(card) in line and "front matter is not readable" in line
    sandbox.assert_untouched()


@pytest.mark.parametrize("download", ["hf download just-a-name --local-dir x", "hf download a/b/c --local-dir x"])
def test_check_on_a_download_line_that_names_no_repo_reports_it(
    sandbox: Sandbox, quant: Path, capsys, monkeypatch, download: str
) -> None:
    folder = _copy(sandbox, quant)
    assert run_inprocess(capsys, monkeypatch, "card", folder, "--repo", "org/quant").code == 0
    card = folder / "README.md"
    card.write_text(card.read_text().replace("hf download org/quant --local-dir quant", download))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", folder, "--check")
    assert result.code == 1 and "Traceback" not in result.err
    assert "which is not a Hub repository id" in result.out
    sandbox.assert_untouched()


@pytest.mark.parametrize("line", ["/" + "a" * 200_000, "+/" * 100_000, "x" * 200_000 + "/site-packages"])
def test_looking_for_local_paths_is_linear(line: str) -> None:
    started = time.perf_counter()
    local_paths(line)
    PathMap([("/home/u", "$MODEL")]).text(line)
    assert time.perf_counter() - started < 5
