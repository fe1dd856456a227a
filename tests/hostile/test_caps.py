"""Readers with caps: every input is bounded in size, depth, time and digits before it is used.

- `preflight --vllm` reads a stranger's wheel or folder: a member that inflates past the cap, a
  damaged, encrypted or oddly compressed member, a FIFO among the files and a source nested too
  deeply for Python's parser are each one line naming the wheel (or folder) and the member;
- a JSON file of a checkpoint (config.json, the index, ...) or a bench results file is refused by
  its size before it is read;
- the time a run spends matching supplied patterns is bounded in all, not only per name;
- a 5,000-digit integer in a header or a recipe, and rich markup (`[/]`) in a name or a path, are
  one line, not a traceback.

Cases that could hang or blow up memory run in a subprocess under a time limit and a 3 GiB
address-space limit.
"""

from __future__ import annotations

import io
import json
import os
import struct
import time
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from rich.console import Console

from audit.doctor_builders import raw_shard, tiny_moe, write
from hostile.harness import TINY_LLAMA, Sandbox, run_inprocess, run_limited
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.bench.progress import RichProgress
from weightsmith.bench.results import VISIT_FAILED, VisitResult
from weightsmith.bench.schedule import Visit
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import MAX_JSON_BYTES
from weightsmith.formats import targets
from weightsmith.formats.targets import Targets
from weightsmith.preflight.source import MAX_SOURCE_BYTES
from weightsmith.quantization.demo import DEMO_CONFIG, write_demo_checkpoint

METADATA = "vllm-0.1.dist-info/METADATA"
REGISTRY = "vllm/model_executor/models/registry.py"
SMALL = {**DEMO_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip


@pytest.fixture
def target(sandbox: Sandbox) -> Path:
    return write(tiny_moe(layers=2, experts=2), sandbox.root / "target")


# --- preflight's wheel and folder ------------------------------------------------------------------


def wheel(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    """A wheel holding `vllm/__init__.py` and MEMBERS."""
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in {"vllm/__init__.py": b"", **members}.items():
            z.writestr(name, data)
    return path


def patch_member(path: Path, name: str, *, flags: int = 0, method: int | None = None, size: int | None = None) -> None:
    """Rewrite fields of member NAME in both its local and its central header, as a hostile writer would.

    `flags` is or-ed into the general-purpose bits, `method` replaces the compression method, `size`
    the declared inflated size.
    """
    data = bytearray(path.read_bytes())
    encoded = name.encode()
    # (signature, offset of the name, of the flags, of the method, of the inflated size)
    for sig, name_at, flags_at, method_at, size_at in ((b"PK\x03\x04", 30, 6, 8, 22), (b"PK\x01\x02", 46, 8, 10, 24)):
        at = data.find(sig)
        while at >= 0:
            if data[at + name_at : at + name_at + len(encoded)] == encoded:
                old_flags = struct.unpack_from("<H", data, at + flags_at)[0]
                struct.pack_into("<H", data, at + flags_at, old_flags | flags)
                if method is not None:
                    struct.pack_into("<H", data, at + method_at, method)
                if size is not None:
                    struct.pack_into("<I", data, at + size_at, size)
            at = data.find(sig, at + 1)
    path.write_bytes(bytes(data))


def test_a_member_that_inflates_past_the_cap_is_refused_before_it_is_read(sandbox: Sandbox, target: Path) -> None:
    """64 MiB of zeros deflate to 64 KB: refused by the size it declares, under a 3 GiB address space."""
    bomb = wheel(sandbox.root / "vllm.whl", {METADATA: bytes(64 << 20)}, zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size < 1 << 20
    sandbox.freeze()
    r = run_limited("preflight", target, "--vllm", bomb)
    line = r.error_line
    assert r.code == 2 and "vllm.whl" in line and f"member {METADATA} declares 67,108,864 bytes inflated" in line
    sandbox.assert_untouched()


def test_a_member_declaring_3_gib_is_refused_before_it_is_inflated(sandbox: Sandbox, target: Path) -> None:
    bomb = wheel(sandbox.root / "vllm.whl", {METADATA: b"Version: 1\n" * 1000}, zipfile.ZIP_DEFLATED)
    patch_member(bomb, METADATA, size=3 << 30)
    sandbox.freeze()
    r = run_limited("preflight", target, "--vllm", bomb)
    assert r.code == 2 and f"member {METADATA} declares 3,221,225,472 bytes inflated" in r.error_line
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("crc", "Bad CRC-32"),
        ("longer than declared", "Bad CRC-32"),  # zipfile stops at the declared size; the check then fails
        ("method", "compression method is not supported"),
        ("encrypted", "is encrypted (a wheel's files never are)"),
    ],
)
def test_a_damaged_member_is_one_line_naming_the_wheel_and_member(
    sandbox: Sandbox, target: Path, capsys, monkeypatch, damage: str, says: str
) -> None:
    path = wheel(sandbox.root / "vllm.whl", {METADATA: b"Version: 0.1\n"})
    if damage == "crc":
        path.write_bytes(path.read_bytes().replace(b"Version: 0.1", b"Version: 9.9"))
    elif damage == "longer than declared":
        patch_member(path, METADATA, size=4)
    else:
        patch_member(path, METADATA, flags=1 if damage == "encrypted" else 0, method=99 if damage == "method" else None)
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", target, "--vllm", path)
    line = r.error_line
    assert r.code == 2 and f"vllm.whl: member {METADATA} " in line and says in line, line
    assert damage == "encrypted" or f"{METADATA} cannot be read (" in line, line
    sandbox.assert_untouched()


def site_packages(root: Path, files: dict[str, str]) -> Path:
    """A site-packages folder with a `vllm` package holding only FILES."""
    for rel, text in {"vllm/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_fifo_or_huge_file_in_the_folder_is_refused_without_reading_it(
    sandbox: Sandbox, target: Path, kind: str
) -> None:
    folder = site_packages(sandbox.root / "sp", {})
    meta = folder / METADATA
    meta.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(meta)
    else:
        with open(meta, "wb") as f:  # sparse: 3 GiB declared, no disk used
            f.truncate(3 << 30)
    sandbox.freeze()
    r = run_limited("preflight", target, "--vllm", folder, timeout=60)
    line = r.error_line
    why = f"is larger than {MAX_SOURCE_BYTES:,} bytes" if kind == "huge" else "is a FIFO (named pipe), not a regular"
    assert r.code == 2 and f"sp: {METADATA} {why}" in line, line
    sandbox.assert_untouched()


@pytest.mark.parametrize("source", ["x = y" + ".a" * 200_000, "x = " + "-" * 200_000 + "1"])
@pytest.mark.parametrize("packed", [True, False])
def test_a_source_nested_too_deeply_for_the_parser_is_one_line(
    sandbox: Sandbox, target: Path, capsys, monkeypatch, source: str, packed: bool
) -> None:
    """Python's parser gives up on 200,000 nested operators with a RecursionError or a MemoryError."""
    assert len(source) < MAX_SOURCE_BYTES
    draft = write_demo_checkpoint(sandbox.root / "draft", config=SMALL)
    if packed:
        vllm = wheel(sandbox.root / "vllm.whl", {REGISTRY: source.encode()})
    else:
        vllm = site_packages(sandbox.root / "sp", {REGISTRY: source})
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", target, "--draft", draft, "--vllm", vllm)
    line = r.error_line
    member = f"member {REGISTRY}" if packed else REGISTRY
    assert r.code == 2 and f"{vllm}: {member} is nested too deeply for Python's parser" in line, line
    sandbox.assert_untouched()


def test_a_3_gib_card_in_the_draft_costs_only_its_head(sandbox: Sandbox, target: Path) -> None:
    """The draft's README.md is read for its front matter (base_model): its first MiB, not 3 GiB."""
    draft = write_demo_checkpoint(sandbox.root / "draft", config=SMALL)
    with open(draft / "README.md", "wb") as f:
        f.write(b"---\nbase_model: someone/else\n---\n")
        f.truncate(3 << 30)
    vllm = site_packages(sandbox.root / "sp", {})
    sandbox.freeze()
    r = run_limited("preflight", target, "--draft", draft, "--vllm", vllm, "--json")
    assert r.code in (0, 1) and "Traceback" not in r.err, r.err
    assert "someone/else" in r.out
    sandbox.assert_untouched()


# --- JSON files, by size ---------------------------------------------------------------------------


def sparse(path: Path, size: int) -> None:
    """A file of `size` bytes that uses no disk: refused by its size, it is never read."""
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_a_3_gib_json_file_is_refused_by_its_size(sandbox: Sandbox, name: str) -> None:
    """Read whole, a 3 GiB config.json took 6.3 GB; refused before its first byte, under 3 GiB of address space."""
    src = write(tiny_moe(layers=2, experts=2), sandbox.root / "src")
    sparse(src / name, 3 << 30)
    sandbox.freeze()
    says = f"{name}: is larger than {MAX_JSON_BYTES:,} bytes, the cap on a JSON file"
    r = run_limited("quantize", src, sandbox.root / "out")
    assert r.code == 2 and says in r.error_line, r.err
    i = run_limited("inspect", src)  # reads what it can, and says what it could not
    assert i.code == 0 and "Traceback" not in i.err and says.split(": ", 1)[1] in i.out, i.err
    v = run_limited("verify", src, "--json")
    assert v.code == 1 and "Traceback" not in v.err, v.err
    assert any(f["check"] == "file.too-large" and f["file"] == name for f in json.loads(v.out)["findings"])
    sandbox.assert_untouched()


def test_a_results_file_past_the_cap_is_refused_by_its_size(sandbox: Sandbox) -> None:
    results = sandbox.root / "results.json"
    sparse(results, MAX_JSON_BYTES + 1)
    sandbox.freeze()
    r = run_limited("bench", "report", results, "--out", sandbox.root / "out")
    assert r.code == 2 and f"results.json: results file is larger than {MAX_JSON_BYTES:,} bytes" in r.error_line
    sandbox.assert_untouched("out")
    assert not (sandbox.root / "out").exists()


# --- numbers past Python's 4,300-digit conversion limit --------------------------------------------


def test_a_5000_digit_integer_in_a_header_shape_is_one_line(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = sandbox.root / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(TINY_LLAMA))
    raw_shard(src / "model.safetensors", '{"w":{"dtype":"U8","shape":[' + "7" * 5000 + '],"data_offsets":[0,1]}}', b"x")
    sandbox.freeze()
    for command in ("inspect", "quantize"):
        r = run_inprocess(capsys, monkeypatch, command, src, *([sandbox.root / "out"] if command == "quantize" else []))
        line = r.error_line
        assert r.code == 2 and "model.safetensors: header is not valid JSON (an integer of more than 4300" in line
    v = run_inprocess(capsys, monkeypatch, "verify", src, "--json")
    assert v.code == 1 and "Traceback" not in v.err
    assert [f["check"] for f in json.loads(v.out)["findings"] if f["severity"] == "error"] == ["header.not-json"]
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("7" * 5000, "is not valid TOML (an integer of more than 4300 digits)"),
        ("0x" + "f" * 5000, "rule 1: group_size must be an integer from 1 to 1,048,576, got an integer of 20,000 bits"),
    ],
)
def test_a_huge_group_size_in_a_recipe_is_one_line(sandbox: Sandbox, capsys, monkeypatch, value, says) -> None:
    """TOML reads a decimal integer under the conversion limit, a hexadecimal one without it (then it cannot be
    written back in decimal: the line describes it instead)."""
    src = write(tiny_moe(layers=2, experts=2), sandbox.root / "src")
    recipe = sandbox.root / "recipe.toml"
    recipe.write_text(f'[[rule]]\ntargets = ["Linear"]\nscheme = "w4a16"\ngroup_size = {value}\n')
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--recipe", recipe)
    line = r.error_line
    assert r.code == 2 and f"recipe.toml: {says}" in line, line
    sandbox.assert_untouched()


# --- supplied patterns: a time budget for the whole run ---------------------------------------------


def test_a_pattern_slow_on_every_name_is_stopped_by_the_runs_budget(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """About 0.1 s on each of 200 names, under the 1 s limit for one: the run's budget stops it, with one line."""
    tensors = llama_tensors()
    for i in range(200):
        tensors[f"model.x{i}.{'a' * 24}b.weight"] = np.ones((64, 256), ml_dtypes.bfloat16)
    config = dict(LLAMA_CONFIG)
    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["re:model\\.x\\d+\\.(a|aa)+$"], "weights": weights}},
        "ignore": [],
    }
    src = write_checkpoint(sandbox.root / "src", tensors, config)
    sandbox.freeze()
    monkeypatch.setattr(targets, "MATCH_BUDGET_S", 2.0)
    started = time.perf_counter()
    r = run_inprocess(capsys, monkeypatch, "verify", src)
    took = time.perf_counter() - started
    line = r.error_line
    assert r.code == 2 and "config.json" in line and "(a|aa)+$" in line, line
    assert "was stopped: supplied patterns had spent 2 s matching, beyond 0.1 ms a name" in line, line
    assert took < 15, took  # 200 names, several matches each: 40 s and more without the budget
    sandbox.assert_untouched()


def test_a_pattern_that_ran_out_of_time_once_is_refused_at_once_after(monkeypatch) -> None:
    """Judged bad once, for the rest of the run: the next name costs nothing, and a new run judges afresh."""
    targets.reset_budget()  # this process may have matched before: the per-name limit, not the budget, must stop it
    slow = Targets(["re:(a|aa)+$"], "--ignore")
    with pytest.raises(WeightsmithError, match="took over 1 s to match one name"):
        slow.matches("a" * 60 + "b")
    started = time.perf_counter()
    with pytest.raises(WeightsmithError, match="took over 1 s to match one name"):
        slow.matches("a" * 60 + "c")
    assert time.perf_counter() - started < 0.5
    targets.reset_budget()
    assert Targets(["re:(a|aa)+$"], "--ignore").matches("aaaa")


# --- rich markup in names, targets and paths is text -----------------------------------------------


def test_markup_in_tensor_names_targets_and_paths_is_printed_as_text(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """`[/]` read as markup raised rich's MarkupError (a traceback after the output was written); `[bold]`
    would restyle what follows. Every such string is printed as it is."""
    tensors = llama_tensors(TINY_LLAMA)
    tensors["model.layers.0.mlp.x[/]y.weight"] = np.ones((64, 64), ml_dtypes.bfloat16)
    tensors["model.layers.0.[bold]z[/].weight"] = np.ones((64, 64), ml_dtypes.bfloat16)
    src = write_checkpoint(sandbox.root / "s[" / "]rc", tensors, TINY_LLAMA)
    recipe = sandbox.root / "recipe.toml"
    recipe.write_text('[[rule]]\ntargets = ["re:.*_proj", "model.q[/]"]\nscheme = "w4a16"\ngroup_size = 32\n')
    sandbox.freeze()

    dry = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "o", "--recipe", recipe, "--dry-run")
    assert dry.code == 0 and "Traceback" not in dry.err, dry.err
    assert "target 'model.q[/]' matches no Linear-like weight" in dry.err
    assert "model.layers.0.[bold]z[/]" in dry.out  # the ignore list, as the names are
    out = sandbox.root / "o[" / "]ut"
    r = run_inprocess(capsys, monkeypatch, "quantize", src, out, "--recipe", recipe)
    assert r.code == 0 and "Traceback" not in r.err, r.err
    assert f"wrote {out}" in r.out
    for command in ("inspect", "verify"):
        r = run_inprocess(capsys, monkeypatch, command, out)
        assert r.code == 0 and "Traceback" not in r.err, r.err
    no_recipe = sandbox.root / "r[/]"
    missing = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "o2", "--recipe", no_recipe)
    assert missing.code == 2 and "r[/]: cannot read recipe file" in missing.error_line
    sandbox.assert_untouched("o[")


def test_markup_in_an_arm_name_or_a_servers_failure_is_printed_as_text() -> None:
    """Bench's progress prints arm names (the user's arms file) and failures (a server's words) through rich."""
    out = io.StringIO()
    with RichProgress(Console(file=out, width=200, color_system=None)) as progress:
        progress.run_started(1, 1)
        progress.visit_started(Visit("a[/]b", 0, 0), 0)
        progress.phase("starting [/]")
        progress.visit_finished(VisitResult("a[/]b", 0, 0, status=VISIT_FAILED, failure="died [bold]x[/]"))
        progress.message("arm 'a[/]b': [link=file:///etc]x[/link]")
    text = out.getvalue()
    assert "a[/]b repeat 1:" in text and "(died [bold]x[/])" in text and "[link=file:///etc]x[/link]" in text
