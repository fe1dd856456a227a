"""Quoting, caps and scans, the second look.

- an env name in a bench arms or results file was printed unchecked before the arm's command
  (`BAR; touch PWN6=1`), and the card wrote `'` for each backquote of a command: a name must now
  be a variable name, and every command and env is printed to paste as exactly itself;
- `card` read README.md and the JSON files beside it whole: a 3 GiB README.md or inspect.json was
  a MemoryError traceback under `card --check`;
- `verify --scan-values` read an MX format's E8M0 scales (stored as uint8) as plain bytes, so a
  scale of 0xFF (NaN) passed as clean;
- preflight kept every file it read and every tree it parsed from a vLLM wheel: 2,500 members of
  1 MiB, or a chain of base classes each in a 1 MiB file, held gigabytes; one run now has a budget
  of bytes read and syntax-tree nodes parsed per vLLM;
- transformers read a tokenizer file whole, whatever its size or kind: a 2 GB tokenizer.json held
  4.7 GB; each tokenizer file is now a regular file within a cap, checked before it is opened;
- `card --check` passed a cited number with digits glued on through markup (`7<!-- c -->&#48;`,
  `9<!-- x -->7<!-- c -->`): a number is now judged by what a reader sees on both sides;
- a MemoryError anywhere is one line, not a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

from hostile.harness import (
    TINY_LLAMA,
    Sandbox,
    carded,
    copies,
    run_inprocess,
    run_limited,
    run_subprocess,
    tiny_pair,
)
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.bench.config import parse_config
from weightsmith.bench.report import write_results_file
from weightsmith.bench.results import RequestRecord, VisitResult
from weightsmith.bench.runner import new_results
from weightsmith.card.check import MAX_CARD_BYTES
from weightsmith.card.cite import find_cited
from weightsmith.core.errors import WeightsmithError
from weightsmith.core.files import MAX_JSON_BYTES
from weightsmith.core.terminal import env_line
from weightsmith.io.checkpoint import MAX_TOKENIZER_BYTES
from weightsmith.preflight.source import MAX_NODES_TOTAL, MAX_READ_TOTAL, MAX_SOURCE_BYTES


def sparse(path: Path, size: int) -> None:
    """Make `path` a file of `size` bytes that uses no disk."""
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


# --- 3d. the card and the files beside it are read under a cap ---------------------------------


@pytest.mark.parametrize(("name", "cap"), [("README.md", MAX_CARD_BYTES), ("inspect.json", MAX_JSON_BYTES)])
def test_a_3_gib_card_or_kept_file_is_refused_by_its_size(
    name: str, cap: int, sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """Read whole, each was a MemoryError traceback under a 3 GiB address space."""
    quant = carded(sandbox, tiny, capsys, monkeypatch)
    sparse(quant / name, 3 << 30)
    sandbox.freeze()
    r = run_limited("card", quant, "--check")
    assert r.code == 2 and f"{quant / name}: is larger than {cap:,} bytes" in r.error_line, r.err
    if name == "README.md":  # writing a card reads the README.md it would replace
        r = run_limited("card", quant)
        assert r.code == 2 and f"{quant / name}: is larger than {cap:,} bytes" in r.error_line, r.err
    sandbox.assert_untouched()


# --- 5a. every scale dtype's NaN is found ------------------------------------------------------


def _fill(shard: Path, name: str, byte: int) -> str:
    """Set every byte of tensor NAME in the shard to BYTE, in place; its dtype."""
    data = bytearray(shard.read_bytes())
    (size,) = struct.unpack_from("<Q", data)
    entry = json.loads(data[8 : 8 + size])[name]
    begin, end = entry["data_offsets"]
    data[8 + size + begin : 8 + size + end] = bytes([byte]) * (end - begin)
    shard.write_bytes(bytes(data))
    return str(entry["dtype"])


@pytest.mark.parametrize(
    ("scheme", "byte"),
    [("mxfp4a16", 0xFF), ("mxfp8a16", 0xFF), ("nvfp4a16", 0x7F), ("nvfp4a16", 0xFF), ("fp8-dynamic", 0xFF)],
)
def test_scan_values_finds_a_nan_in_every_scale_dtype(
    scheme: str, byte: int, sandbox: Sandbox, capsys, monkeypatch
) -> None:
    """0xFF is NaN in E8M0 (an MX scale, stored as uint8); 0x7F and 0xFF in FP8 E4M3; all ones in F32."""
    src = write_checkpoint(sandbox.root / "src", llama_tensors(TINY_LLAMA), TINY_LLAMA)
    quant = quantize(QuantizeRequest(src, sandbox.root / "q", scheme=scheme, workers=1)).output
    name = "model.layers.0.mlp.down_proj.weight_scale"
    dtype = _fill(quant / "model.safetensors", name, byte)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "verify", quant, "--scan-values", "--json")
    sandbox.assert_untouched()
    found = [(f["check"], f["tensor"]) for f in json.loads(result.out)["findings"] if f["severity"] == "error"]
    assert result.code == 1 and ("values.non-finite", name) in found, (dtype, found)


# --- 3c. tokenizer files are checked before transformers reads them ----------------------------


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.json", "special_tokens_map.json"])
def test_a_tokenizer_file_past_its_cap_is_refused_unread(
    name: str, sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """transformers reads a tokenizer file whole: a 2 GB tokenizer.json held 4.7 GB before failing."""
    pytest.importorskip("transformers")
    orig, _ = copies(sandbox, tiny)
    sparse(orig / name, MAX_TOKENIZER_BYTES + 1)
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "calibrate", orig, "--out", sandbox.root / "s.safetensors")
    assert r.code == 2, r
    assert r.error_line == (
        f"error: {orig / name}: is larger than {MAX_TOKENIZER_BYTES:,} bytes, the cap on a tokenizer file"
    )
    sandbox.assert_untouched()


def test_a_tokenizer_file_that_is_a_fifo_is_refused_unopened(sandbox: Sandbox, tiny) -> None:
    pytest.importorskip("transformers")
    orig, quant = copies(sandbox, tiny)
    os.mkfifo(orig / "tokenizer.json")
    sandbox.freeze()
    r = run_subprocess("eval", orig, quant, timeout=300)
    assert r.code == 2, r
    assert r.error_line == f"error: {orig / 'tokenizer.json'}: is a FIFO (named pipe), not a regular file"
    sandbox.assert_untouched()


# --- 2a. env names are variable names, and every printed line pastes as itself ------------------

BAD_NAMES = ["BAR; touch PWN6", "X=$(touch P7)", "A B", "1X", ""]


def _results(sandbox: Sandbox, command: list[str], env: dict[str, str]) -> Path:
    """A bench results file of one arm running `command` under `env`, as `bench run` writes it."""
    config = parse_config({"repeats": 1, "arms": [{"name": "a", "command": command, "env": env}]})
    results = new_results(config)
    record = RequestRecord("p80.0", 80, 0, ttft_s=0.1, decode_tok_s=50.0, e2e_s=0.5, completion_tokens=16)
    results.visits.append(VisitResult(arm="a", repeat=0, position=0, requests=[record]))
    return write_results_file(results, None, sandbox.root / "run")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_env_name_that_is_not_a_variable_name_is_refused_in_an_arms_file(name: str) -> None:
    with pytest.raises(WeightsmithError, match="is not a usable variable name"):
        parse_config(
            {
                "repeats": 1,
                "arms": [{"name": "a", "command": ["vllm", "serve", "m", "--port", "{port}"], "env": {name: "1"}}],
            }
        )


def test_an_env_name_that_is_not_a_variable_name_is_refused_in_a_results_file(
    sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """Printed as `BAR; touch PWN6=1`, the report's and the card's environment ran commands when pasted."""
    path = _results(sandbox, ["vllm", "serve", "m", "--port", "{port}"], {"V": "1"})
    doc = json.loads(path.read_text())
    doc["arms"][0]["env"] = {"BAR; touch PWN6": "1", "X=$(touch P7)": "2"}
    path.write_text(json.dumps(doc))
    _, quant = copies(sandbox, tiny)
    sandbox.freeze()
    says = f"error: {path}: results file is malformed: field arms[0].env: 'BAR; touch PWN6' is not a variable name"
    r = run_inprocess(capsys, monkeypatch, "bench", "report", path)
    assert r.code == 2 and r.error_line == says, r
    r = run_inprocess(capsys, monkeypatch, "card", quant, "--bench", path)
    assert r.code == 2 and r.error_line == says, r
    sandbox.assert_untouched()


def test_an_env_pastes_as_exactly_that_env() -> None:
    env = {"V": "$(touch pwned) y", "W": "`touch pwned`", "Q": "it's", "E": "", "N": "line\nbreak"}
    line = env_line(env)
    for name, value in env.items():
        shown = subprocess.run(["bash", "-c", f"{line} printenv {name}"], capture_output=True, text=True, check=True)
        assert shown.stdout == value + "\n"
    with pytest.raises(ValueError, match="not a variable name"):
        env_line({"BAR; touch PWN6": "1"})


def test_a_command_with_backquotes_is_cited_exactly_and_checks(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """The card wrote `'` for each backquote, so the pasted line was not the command bench ran."""
    command = ["vllm", "serve", "m", "--port", "{port}", "--x", "`touch pwned`", "a``b"]
    path = _results(sandbox, command, {"V": "`id`"})
    _, quant = copies(sandbox, tiny)
    sandbox.freeze()
    assert run_inprocess(capsys, monkeypatch, "card", quant, "--bench", path).code == 0
    cited = {c.field: c.value for c in find_cited((quant / "README.md").read_text())}
    spans = {key: re.fullmatch(r"(`+) ?(.*?) ?\1", cited[f"arms[a].{key}"]) for key in ("command", "env")}
    assert spans["command"] and shlex.split(spans["command"][2]) == command
    assert spans["env"] and shlex.split(spans["env"][2]) == ["V=`id`"]
    r = run_inprocess(capsys, monkeypatch, "card", quant, "--check")
    assert r.code == 0, r.out
    sandbox.assert_untouched("quant")


# --- 5b. a cited number is judged as a reader sees it ------------------------------------------

MODULES = "<!-- inspect.json: quantization.statuses[0].modules -->"


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        (f"7{MODULES}", f"7{MODULES}&#48;", "is followed by '0'"),
        (f"7{MODULES}", f"7{MODULES}<!-- x -->0", "is followed by '0'"),
        (f"7{MODULES}", f"7{MODULES}\u200b0", "is followed by '0'"),
        (f"7{MODULES}", f"7{MODULES}**0**", "is followed by '0'"),
        (f"7{MODULES}", f"7{MODULES}<b>.5</b>", "is followed by '.5'"),
        (f"7{MODULES}", f"9<!-- x -->7{MODULES}", "is preceded by '9'"),
        (f"7{MODULES}", f"9**7{MODULES}**", "is preceded by '9'"),
        (f"7{MODULES}", f"1.<!-- x -->7{MODULES}", "is preceded by '1.'"),
    ],
    ids=["entity", "comment", "zero-width", "emphasis", "tag", "before-comment", "before-emphasis", "before-point"],
)
def test_digits_glued_on_through_markup_fail_the_check(
    old: str, new: str, says: str, sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """Each renders as 70, 7.5, 97 or 1.7, which `card --check` passed: markup hid the glued digit."""
    quant = carded(sandbox, tiny, capsys, monkeypatch)
    card = quant / "README.md"
    text = card.read_text()
    assert text.count(old) == 1, old
    card.write_text(text.replace(old, new))
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "card", quant, "--check")
    assert r.code == 1 and f"7 citing inspect.json: quantization.statuses[0].modules {says}" in r.out, r.out
    sandbox.assert_untouched()


def test_markup_that_does_not_extend_a_number_still_passes(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    quant = carded(sandbox, tiny, capsys, monkeypatch)
    card = quant / "README.md"
    text = card.read_text()
    card.write_text(text.replace(f"7{MODULES}", f"**7{MODULES}**&nbsp;<!-- x --> (seven)"))
    r = run_inprocess(capsys, monkeypatch, "card", quant, "--check")
    assert r.code == 0, r.out


# --- 3a/3b. what preflight reads and parses from one vLLM is bounded in all ----------------------

QUANTIZATION = "vllm/model_executor/layers/quantization"


def _vllm_wheel(path: Path, members: dict[str, str]) -> Path:
    """A wheel whose registry sends a DFlash draft to `foo.py` and compressed-tensors to class CT, plus MEMBERS."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr("vllm-0.99.0.dist-info/METADATA", "Version: 0.99.0\n")
        z.writestr("vllm/model_executor/models/registry.py", '_M = {"DFlashLlamaForCausalLM": ("foo", "Foo")}\n')
        z.writestr("vllm/model_executor/models/foo.py", "def f(quant_config):\n    quant_config.get_x()\n")
        for name, text in members.items():
            z.writestr(name, text)
    return path


def test_a_wheel_of_many_large_members_is_refused_at_the_read_budget(
    sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """2,500 members of 1 MiB made preflight hold 2.7 GB: every member's text was kept."""
    _, quant = copies(sandbox, tiny)
    body = "#" + "a" * (MAX_SOURCE_BYTES - 2) + "\n"
    members = {f"{QUANTIZATION}/__init__.py": 'method_to_config = {"compressed-tensors": CT}\n'}
    members |= {f"{QUANTIZATION}/m{i:05d}.py": body for i in range(MAX_READ_TOTAL // MAX_SOURCE_BYTES + 8)}
    members[f"{QUANTIZATION}/zzz.py"] = "class CT:\n    pass\n"
    vllm = _vllm_wheel(sandbox.root / "big.whl", members)
    _refused_at_budget(sandbox, capsys, monkeypatch, quant, vllm, f"{MAX_READ_TOTAL:,} bytes of source read")


def test_a_chain_of_large_base_classes_is_refused_at_the_parse_budget(
    sandbox: Sandbox, tiny, capsys, monkeypatch
) -> None:
    """Each base class in its own 1 MiB `x = (a, a, ...)` file: 2.3 GB of trees were parsed and kept."""
    _, quant = copies(sandbox, tiny)
    members = {f"{QUANTIZATION}/__init__.py": 'method_to_config = {"compressed-tensors": B0}\n'}
    for i in range(4):
        head = f"class B{i}(B{i + 1}):\n    pass\nx = ("
        members[f"{QUANTIZATION}/b{i:03d}.py"] = head + "a," * (MAX_NODES_TOTAL // 3) + ")\n"
    vllm = _vllm_wheel(sandbox.root / "chain.whl", members)
    _refused_at_budget(sandbox, capsys, monkeypatch, quant, vllm, f"{MAX_NODES_TOTAL:,} syntax-tree nodes parsed")


def _refused_at_budget(sandbox: Sandbox, capsys, monkeypatch, quant: Path, vllm: Path, budget: str) -> None:
    """preflight on `vllm` stops at its budget per vLLM with one line naming the wheel and the budget."""
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "preflight", quant, "--draft", quant, "--method", "dflash", "--vllm", vllm)
    assert r.code == 2, r
    assert r.error_line == (
        f"error: {vllm}: needs more than the {budget} preflight allows one vLLM; a real vLLM needs a fraction of that"
    )
    sandbox.assert_untouched()


def test_running_out_of_memory_anywhere_is_one_line(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """A reader without a cap of its own (a library's) can still exhaust memory: a line, not a traceback."""
    quant = carded(sandbox, tiny, capsys, monkeypatch)

    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr("weightsmith.card.check.find_cited", exhausted)
    sandbox.freeze()
    r = run_inprocess(capsys, monkeypatch, "card", quant, "--check")
    assert r.code == 2 and r.error_line == "error: ran out of memory; an input is larger than this machine can hold"
    sandbox.assert_untouched()
