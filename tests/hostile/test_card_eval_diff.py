"""Hostile inputs to `card`, `eval`, `diff`, the names `verify`/`diff`/`inspect` print, and `transplant --select`."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hostile.harness import Result, Sandbox, copies, run_inprocess, tiny_pair
from weightsmith.bench.logcheck import scan_lines
from weightsmith.card.cite import find_cited
from weightsmith.card.sources import CARD_RECORD as RECORD
from weightsmith.core.errors import CheckpointError
from weightsmith.core.terminal import printable

Q_SCALE = "model.layers.0.self_attn.q_proj.weight_scale"
HOSTILE_NAME = "a\x1b[2Jb.weight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


def edit_tensor(folder: Path, name: str, change) -> Path:
    """Rewrite the shard of `folder` holding `name` with `change(array)` in its place; returns the shard."""
    for shard in folder.glob("*.safetensors"):
        tensors = load_file(str(shard))
        if name in tensors:
            tensors[name] = change(tensors[name])
            save_file(tensors, str(shard), metadata={"format": "pt"})
            return shard
    raise AssertionError(f"{name} not found in {folder}")


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def no_escape(result: Result) -> None:
    assert "\x1b" not in result.out and "\x1b" not in result.err, (result.out, result.err)


# --- 1. no regex on user text backtracks: a 200,000-character line is read in linear time ---


def test_card_check_on_a_200k_character_line_does_not_hang(sandbox: Sandbox, capsys, monkeypatch) -> None:
    (sandbox.root / "README.md").write_text("1" * 200_000 + "\n")
    sandbox.freeze()
    started = time.perf_counter()
    result = run_inprocess(capsys, monkeypatch, "card", sandbox.root, "--check")
    seconds = time.perf_counter() - started
    assert seconds < 5, f"{seconds:.1f} s"  # a hang guard: quadratic matching took minutes
    assert result.code == 2
    line = result.error_line
    assert "README.md" in line and "cites no numbers" in line
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    "line",
    ["a" * 200_000, "`" + "x" * 200_000, "`a" * 100_000, "v<!-- " * 40_000, "v<!-- f: " * 25_000,
     "<!-- f: " + "g" * 200_000, "1.5-" * 50_000 + "<!--"],
    ids=["token-run", "open-code-span", "backticks", "open-comments", "unclosed-fields", "long-field", "no-anchor"],
)  # fmt: skip
def test_finding_citations_is_linear(line: str) -> None:
    started = time.perf_counter()
    assert find_cited(line) == []
    assert time.perf_counter() - started < 5


def test_citations_still_found_beside_long_runs() -> None:
    text = "a" * 50_000 + " `w4a16`<!-- weightsmith.json: recipe.scheme --> and 1.5<!-- eval.json: logits.kl -->"
    assert [(c.value, c.source) for c in find_cited(text)] == [
        ("`w4a16`", "weightsmith.json: recipe.scheme"),
        ("1.5", "eval.json: logits.kl"),
    ]


@pytest.mark.parametrize(
    "line", ["Using " * 40_000, "file type = x" + " " * 200_000 + "y", "speculative_config=SpeculativeConfig(" * 5_000]
)
def test_server_log_patterns_are_linear(line: str) -> None:
    started = time.perf_counter()
    scan_lines([line])
    assert time.perf_counter() - started < 5


# --- 2. card never replaces a README.md it did not write, unless --force ---


def test_card_refuses_to_replace_an_upstream_readme(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    _, quant = copies(sandbox, tiny)
    (quant / "README.md").write_text("# Upstream model card\n\nLicensed under the upstream terms.\n")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    assert result.code == 2
    line = result.error_line
    assert "quant/README.md" in line and "--force" in line
    sandbox.assert_untouched()  # no README, and no inspect.json or verify.json either

    result = run_inprocess(capsys, monkeypatch, "card", quant, "--force")
    assert result.code == 0, result.err
    assert find_cited((quant / "README.md").read_text())
    sandbox.assert_untouched("quant/README.md", "quant/inspect.json", "quant/verify.json", f"quant/{RECORD}")


def test_card_regenerates_its_own_readme(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    _, quant = copies(sandbox, tiny)
    assert run_inprocess(capsys, monkeypatch, "card", quant).code == 0
    first = (quant / "README.md").read_text()
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant, "--license", "mit")
    assert result.code == 0, result.err
    assert "license: mit" in (quant / "README.md").read_text() and "license: mit" not in first
    sandbox.assert_untouched("quant/README.md", "quant/inspect.json", "quant/verify.json", f"quant/{RECORD}")


def test_card_never_writes_through_a_readme_link(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    _, quant = copies(sandbox, tiny)
    outside = sandbox.root / "elsewhere.md"
    outside.write_text("someone else's file\n")
    (quant / "README.md").symlink_to(outside)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    assert result.code == 2 and "README.md" in result.error_line
    sandbox.assert_untouched()
    assert run_inprocess(capsys, monkeypatch, "card", quant, "--force").code == 0
    assert not (quant / "README.md").is_symlink()
    # the target is intact
    sandbox.assert_untouched("quant/README.md", "quant/inspect.json", "quant/verify.json", f"quant/{RECORD}")


# --- 3. malformed manifest or eval JSON: one line naming the file and the field ---


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["recipe"].pop("num_bits"), "has no field recipe.num_bits"),
        (lambda d: d["recipe"].update(scheme=4), "recipe.scheme is an integer, not a string"),
        (lambda d: d["sizes"].update(bytes_after="many"), "sizes.bytes_after is a string, not an integer or a number"),
        (lambda d: d["source"]["files"].update(x={"bytes": None}), "source.files[x].bytes is null, not an integer"),
        (lambda d: d.update(tensors=[]), "tensors is a list, not an object"),
    ],
    ids=["missing", "scheme-int", "bytes-str", "file-bytes-null", "tensors-list"],
)
def test_card_with_a_malformed_manifest(sandbox: Sandbox, tiny, capsys, monkeypatch, change, field) -> None:
    _, quant = copies(sandbox, tiny)
    edit_json(quant / "weightsmith.json", change)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant)
    assert result.code == 2
    line = result.error_line
    assert "weightsmith.json" in line and field in line, line
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("weights"), "has no field weights"),
        (lambda d: d["weights"]["overall"].update(sqnr_db="high"), "weights.overall.sqnr_db is a string"),
        (lambda d: d["weights"]["categories"].append(7), "weights.categories[0] is an integer, not an object"),
        (lambda d: d["logits"].pop("kl"), "has no field logits.kl"),
        (lambda d: d["logits"].update(status=None), "logits.status is null, not a string"),
    ],
    ids=["no-weights", "sqnr-str", "category-int", "no-kl", "status-null"],
)
def test_card_with_a_malformed_eval_json(sandbox: Sandbox, tiny, capsys, monkeypatch, change, field) -> None:
    _, quant = copies(sandbox, tiny)
    doc = {
        "schema": "weightsmith.eval", "schema_version": 1, "orig": "o", "quant": "q",
        "weights": {"source_format": "dense", "layers": [], "categories": [],
                    "overall": {"name": "overall", "layers": 1, "numel": 10, "rel_mse": 0.01, "sqnr_db": 20.0}},
        "logits": {"status": "ok", "reason": None, "text_source": "t", "tokens": 8, "kl": 0.1, "top1_agreement": 0.9,
                   "ppl_orig": 7.0, "ppl_quant": 7.5},
    }  # fmt: skip
    change(doc)
    eval_json = sandbox.root / "eval-in.json"
    eval_json.write_text(json.dumps(doc))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant, "--eval", eval_json)
    assert result.code == 2
    line = result.error_line
    assert "eval-in.json" in line and field in line, line
    sandbox.assert_untouched()


def test_card_check_on_a_card_that_is_not_utf8(sandbox: Sandbox, capsys, monkeypatch) -> None:
    (sandbox.root / "README.md").write_bytes(b"1.5<!-- a: b -->\xff\n")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", sandbox.root, "--check")
    assert result.code == 2 and "README.md" in result.error_line and "UTF-8" in result.error_line
    sandbox.assert_untouched()


# --- 4. eval: non-finite scales or weights are an error, never `-inf dB` ---


def test_eval_names_an_all_nan_scale(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, quant = copies(sandbox, tiny)
    shard = edit_tensor(quant, Q_SCALE, lambda a: np.full_like(a, np.nan))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "eval", orig, quant, "--no-logits")
    assert result.code == 2
    line = result.error_line
    assert shard.name in line and f"tensor '{Q_SCALE}'" in line and "NaN or infinite" in line, line
    assert "inf dB" not in result.out
    sandbox.assert_untouched()


def test_eval_names_an_infinite_original_weight(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, quant = copies(sandbox, tiny)
    name = "model.layers.0.mlp.up_proj.weight"

    def one_inf(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[0, 0] = np.inf
        return a

    shard = edit_tensor(orig, name, one_inf)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "eval", orig, quant, "--no-logits", "--json")
    assert result.code == 2
    line = result.error_line
    assert f"orig/{shard.name}" in line and f"tensor '{name}'" in line and "NaN or infinite" in line, line
    sandbox.assert_untouched()


def test_eval_names_a_non_integer_weight_shape(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, quant = copies(sandbox, tiny)
    name = Q_SCALE.replace("weight_scale", "weight_shape")
    edit_tensor(quant, name, lambda a: np.full(a.shape, np.nan, np.float32))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "eval", orig, quant, "--no-logits")
    assert result.code == 2 and f"tensor '{name}'" in result.error_line
    sandbox.assert_untouched()


def test_eval_names_a_bad_target_regex_in_the_config(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, quant = copies(sandbox, tiny)

    def bad_target(config: dict) -> None:
        for group in config["quantization_config"]["config_groups"].values():
            group["targets"].insert(0, "re:([")

    edit_json(quant / "config.json", bad_target)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "eval", orig, quant, "--no-logits")
    assert result.code == 2
    line = result.error_line
    assert "quant/config.json" in line and "'re:(['" in line and "not a valid regular expression" in line, line
    sandbox.assert_untouched()


# --- 5. diff: bytes that differ never print as equal, and NaN is named rather than printed as a figure ---


def pair(sandbox: Sandbox, a: np.ndarray, b: np.ndarray, name: str = "w") -> tuple[Path, Path]:
    save_file({name: a}, str(sandbox.root / "a.safetensors"))
    save_file({name: b}, str(sandbox.root / "b.safetensors"))
    return sandbox.root / "a.safetensors", sandbox.root / "b.safetensors"


def test_diff_names_nan_on_one_side(sandbox: Sandbox, capsys, monkeypatch) -> None:
    a, b = pair(sandbox, np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([1.0, np.nan, 3.0, 4.5], np.float32))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "diff", a, b)
    assert result.code == 1 and not result.err
    line = next(ln for ln in result.out.splitlines() if ln.startswith("differs"))
    assert "NaN only in B at 1 element(s), first at element 1" in line, line
    assert "max abs err 0.5" in line and "nan" not in line
    doc = json.loads(run_inprocess(capsys, monkeypatch, "diff", a, b, "--json").out)
    assert doc["tensors"][0]["max_abs_error"] == 0.5 and doc["differ"] == 1
    sandbox.assert_untouched()


def test_diff_all_nan_against_numbers_has_no_figures(sandbox: Sandbox, capsys, monkeypatch) -> None:
    a, b = pair(sandbox, np.full(3, np.nan, np.float32), np.array([1.0, np.inf, -np.inf], np.float32))
    result = run_inprocess(capsys, monkeypatch, "diff", a, b)
    assert result.code == 1
    line = next(ln for ln in result.out.splitlines() if ln.startswith("differs"))
    assert "NaN only in A at 3 element(s)" in line and "max abs err" not in line and "nan" not in line, line


def test_diff_never_prints_differing_bytes_as_equal(sandbox: Sandbox, capsys, monkeypatch) -> None:
    quiet = struct.unpack("<f", struct.pack("<I", 0x7FC00001))[0]  # a NaN with another payload
    a = np.array([np.nan, 0.0, 1.0], np.float32)
    b = np.array([0.0, -0.0, 1.0], np.float32)
    b[0] = quiet
    b.view(np.uint32)[0] = 0x7FC00001
    assert a.tobytes() != b.tobytes() and math.isnan(b[0])
    a_path, b_path = pair(sandbox, a, b)
    result = run_inprocess(capsys, monkeypatch, "diff", a_path, b_path)
    assert result.code == 1
    line = next(ln for ln in result.out.splitlines() if ln.startswith("differs"))
    assert "equal as numbers but the bytes differ" in line, line


# --- 6. names from a checkpoint never reach the terminal raw ---


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert printable("model.layers.0.q_proj.weight") == "model.layers.0.q_proj.weight"
    assert printable(HOSTILE_NAME) == "a\\x1b[2Jb.weight"
    assert printable("x\r\ny\u202ez\x00\x7f\x9b") == "x\\r\\ny\\u202ez\\x00\\x7f\\x9b"
    assert printable("é ü 名前") == "é ü 名前"


def test_escape_sequences_in_tensor_names_are_shown_escaped(sandbox: Sandbox, capsys, monkeypatch) -> None:
    a, b = pair(sandbox, np.ones(4, np.float32), np.array([1, 1, 1, np.nan], np.float32), name=HOSTILE_NAME)
    sandbox.freeze()
    for args in (("diff", a, b), ("verify", a, "--scan-values"), ("inspect", a, "--by", "layer"),
                 ("inspect", a, "--by", "dtype")):  # fmt: skip
        result = run_inprocess(capsys, monkeypatch, *args)
        assert result.code in (0, 1) and not result.err, (args, result.err)
        no_escape(result)
    diff_out = run_inprocess(capsys, monkeypatch, "diff", a, b).out
    assert "a\\x1b[2Jb.weight" in diff_out
    verify_out = run_inprocess(capsys, monkeypatch, "verify", b, "--scan-values").out
    assert "a\\x1b[2Jb.weight" in verify_out  # the NaN finding names the tensor, escaped
    doc = json.loads(run_inprocess(capsys, monkeypatch, "diff", a, b, "--json").out)
    assert doc["tensors"][0]["name"] == HOSTILE_NAME  # JSON keeps the real name
    sandbox.assert_untouched()


@pytest.mark.parametrize("name", [HOSTILE_NAME, "a[/]b.weight", "x[bold]y.weight"])
def test_error_lines_show_hostile_names_escaped(sandbox: Sandbox, capsys, monkeypatch, name: str) -> None:
    header = json.dumps({name: {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})  # 4 floats need 16
    shard = sandbox.root / "bad.safetensors"
    shard.write_bytes(len(header).to_bytes(8, "little") + header.encode() + b"\0" * 12)
    good = sandbox.root / "good.safetensors"
    save_file({name: np.ones(4, np.float32)}, str(good))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "diff", good, shard)
    assert result.code == 2
    line = result.error_line
    no_escape(result)
    assert "bad.safetensors" in line and printable(name) in line, line
    assert str(CheckpointError("x", file=shard, tensor=HOSTILE_NAME)).count("\x1b") == 0
    sandbox.assert_untouched()


# --- 7. a bad --select regex is one line naming it ---


def test_transplant_with_a_bad_select_regex(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    orig, quant = copies(sandbox, tiny)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "transplant", orig, quant, "--select", "re:([")
    assert result.code == 2
    line = result.error_line
    assert "--select 're:(['" in line and "not a valid regular expression" in line, line
    sandbox.assert_untouched()
