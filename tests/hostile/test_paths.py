"""Hostile file names: an index whose shard names lead out of the folder, special files named like
shards, duplicate and wrongly typed index entries, JSON nested too deeply, links out of the source.

Every command refuses before it opens anything the name reaches (one line naming the index and
the entry; `verify` reports an error finding instead), and nothing outside the destination changes:
the source shard an unchecked `../` name reached, a user's file beside the output, a transplant
target's shard outside the target.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
import socket
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.doctor_builders import halves, tiny_moe, write
from hostile.harness import Result, Sandbox, run_inprocess, run_subprocess
from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith.audit.survey import survey
from weightsmith.core.errors import CheckpointError, OutputError
from weightsmith.io.checkpoint import INDEX_FILE, Checkpoint
from weightsmith.safetensors.writer import ShardWriter, TensorSpec

CONFIG = dict(
    LLAMA_CONFIG,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    vocab_size=64,
    num_hidden_layers=1,
)
FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
KV = r"re:.*\.(k|v)_scale$"


def checkpoint(where: Path, shards: int = 2) -> Path:
    return write_checkpoint(where, llama_tensors(CONFIG), CONFIG, shards=shards)


def index(root: Path) -> dict:
    return json.loads((root / INDEX_FILE).read_text())


def repoint(root: Path, old: str, new: str) -> str:
    """Point every index entry of shard `old` at the name `new`; the first such tensor's name (in file order)."""
    doc = index(root)
    moved = [k for k, v in doc["weight_map"].items() if v == old]
    doc["weight_map"].update(dict.fromkeys(moved, new))
    (root / INDEX_FILE).write_text(json.dumps(doc))
    return moved[0]


def refused(result: Result, *words: str, code: int = 2) -> str:
    """The one error line of a refused command, which must name each of `words`."""
    line = result.error_line
    assert result.code == code, (result.code, line)
    for word in words:
        assert word in line, (word, line)
    return line


def verified(result: Result, check: str, *words: str) -> None:
    """`verify` found an error `check` (exit 1) whose line names each of `words`."""
    assert result.code == 1 and "Traceback" not in result.err and not result.err.strip(), result.err
    line = next((ln for ln in result.out.splitlines() if ln.startswith("error") and check in ln), None)
    assert line is not None, result.out
    for word in words:
        assert word in line, (word, line)


# --- shard names that leave the folder: the source, a user's file, an absolute path ---


@pytest.mark.parametrize("outside", ["../model-x.safetensors", "../notes.txt", "ABSOLUTE"])
def test_quantize_refuses_a_shard_name_outside_the_source(sandbox: Sandbox, capsys, monkeypatch, outside) -> None:
    """Today: `../model-x` truncates the source shard; `../notes.txt` replaces the user's file, exit 0."""
    src = checkpoint(sandbox.root / "src")
    target = sandbox.root / ("model-abs.safetensors" if outside == "ABSOLUTE" else outside[3:])
    name = str(target) if outside == "ABSOLUTE" else outside
    os.rename(src / FIRST, target)
    tensor = repoint(src, FIRST, name)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--no-hash")
    refused(result, INDEX_FILE, tensor, name)
    sandbox.assert_untouched()
    assert not (sandbox.root / "out").exists()


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "./x.safetensors", "a//b.safetensors", "sub/", "a\\..\\b.safetensors", "a\x00b", "a\nb",
     "sub/../model.safetensors", "/etc/passwd"],
)  # fmt: skip
def test_every_command_refuses_a_name_that_is_not_a_plain_relative_path(
    sandbox: Sandbox, capsys, monkeypatch, name: str
) -> None:
    src = checkpoint(sandbox.root / "src")
    tensor = repoint(src, FIRST, name)
    sandbox.freeze()
    shown = repr(name)[1:-1]  # the line shows the name escaped, so that it stays one line
    for args in (
        ["quantize", src, sandbox.root / "out"],
        ["inspect", src],
        ["diff", src, src],
        ["eval", src, src, "--no-logits"],
    ):
        refused(run_inprocess(capsys, monkeypatch, *args), INDEX_FILE, tensor, shown)
    verified(run_inprocess(capsys, monkeypatch, "verify", src), "index.unsafe-shard", INDEX_FILE, tensor, shown)
    sandbox.assert_untouched()


def test_a_folder_link_out_of_the_source_is_refused(sandbox: Sandbox, capsys, monkeypatch) -> None:
    src = checkpoint(sandbox.root / "src")
    elsewhere = sandbox.root / "elsewhere"
    elsewhere.mkdir()
    os.rename(src / FIRST, elsewhere / FIRST)
    (src / "sub").symlink_to(elsewhere)
    tensor = repoint(src, FIRST, f"sub/{FIRST}")
    sandbox.freeze()
    refused(run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out"), tensor, "leads out")
    refused(run_inprocess(capsys, monkeypatch, "inspect", src), tensor, "leads out")
    verified(run_inprocess(capsys, monkeypatch, "verify", src), "index.unsafe-shard", tensor, f"sub/{FIRST}")
    sandbox.assert_untouched()


def test_a_shard_in_a_subfolder_inside_the_source_is_fine(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """The rule refuses names that leave the folder, not folders: `shards/x` is read and written as such."""
    src = checkpoint(sandbox.root / "src")
    (src / "shards").mkdir()
    os.rename(src / FIRST, src / "shards" / FIRST)
    repoint(src, FIRST, f"shards/{FIRST}")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out", "--no-hash")
    assert result.code == 0, result.err
    assert (sandbox.root / "out" / "shards" / FIRST).is_file() and not (sandbox.root / "out" / FIRST).exists()
    assert run_inprocess(capsys, monkeypatch, "verify", sandbox.root / "out").code == 0
    sandbox.assert_untouched("out")


def test_transplant_refuses_a_target_whose_index_points_outside_it(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """Today: `--replace` rewrites the outside shard without its KV scales (docs: refused, nothing written)."""
    donor = write(tiny_moe(kv_scales=True, seed=1), sandbox.root / "donor")
    model = tiny_moe(kv_scales=True, seed=2)
    model.shard_of = halves
    target = write(model, sandbox.root / "target")
    os.rename(target / FIRST, sandbox.root / "outside.safetensors")
    tensor = repoint(target, FIRST, "../outside.safetensors")
    sandbox.freeze()
    for out in ([], ["--out", sandbox.root / "out"]):
        result = run_inprocess(capsys, monkeypatch, "transplant", donor, target, "--select", KV, "--replace", *out)
        refused(result, INDEX_FILE, tensor, "../outside.safetensors")
    verified(run_inprocess(capsys, monkeypatch, "verify", target), "index.unsafe-shard", tensor)
    sandbox.assert_untouched()


@pytest.mark.parametrize("shard", ["../x.safetensors", "a\\b.safetensors", "a\x00.safetensors", "/x.safetensors"])
def test_transplant_refuses_a_new_shard_name_outside_the_target(sandbox: Sandbox, capsys, monkeypatch, shard) -> None:
    donor = write(tiny_moe(kv_scales=True, seed=1), sandbox.root / "donor")
    target = write(tiny_moe(kv_scales=False, seed=2), sandbox.root / "target")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "transplant", donor, target, "--select", KV, "--shard", shard)
    refused(result, "plain file name")
    sandbox.assert_untouched()


# --- special files where a shard, the config or the index should be (each would hang a reader) ---


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")  # a link to a device: mknod needs privileges


def _socket(path: Path) -> None:
    here = Path.cwd()
    os.chdir(path.parent)  # a socket's path is limited to ~100 bytes; bind a short relative one
    try:
        socket.socket(socket.AF_UNIX).bind(path.name)
    finally:
        os.chdir(here)


def _folder(path: Path) -> None:
    path.mkdir()


SPECIAL = {"fifo": (_fifo, "FIFO"), "device": (_device, "device"), "socket": (_socket, "socket"),
           "folder": (_folder, "directory")}  # fmt: skip


@pytest.mark.parametrize("special", SPECIAL)
@pytest.mark.parametrize("where", ["model.safetensors", FIRST, "config.json", INDEX_FILE])
def test_a_special_file_is_refused_not_opened(sandbox: Sandbox, capsys, monkeypatch, special: str, where: str) -> None:
    """FIFOs run as subprocesses with a timeout: today a FIFO named model.safetensors hangs every command.

    quantize refuses; verify reports it; inspect and diff refuse when nothing is left to read, and
    otherwise go on with what they can read (inspect notes the file; diff needs no config or index).
    """
    src = checkpoint(sandbox.root / "src", shards=1 if where == "model.safetensors" else 2)
    (src / where).unlink()
    make, word = SPECIAL[special]
    make(src / where)
    sandbox.freeze()

    def run(*args: object) -> Result:
        if special == "fifo":
            return run_subprocess(*args, timeout=30)
        return run_inprocess(capsys, monkeypatch, *args)

    refused(run("quantize", src, sandbox.root / "out"), where, word)
    verified(run("verify", src), "file.", where, word)
    if special == "fifo" and where != "model.safetensors":  # the other commands: once, on the headline case
        sandbox.assert_untouched()
        return
    inspect, diff = run("inspect", src), run("diff", src, src)
    if where == "model.safetensors":
        refused(inspect, where, word)
        refused(run("eval", src, src, "--no-logits"), where, word)
        refused(run("transplant", src, src, "--select", "lm_head.weight", "--out", sandbox.root / "out"), where, word)
    else:
        assert inspect.code == 0 and not inspect.err and f"could not read {where}: is a" in inspect.out, inspect
    if where in ("model.safetensors", FIRST):
        refused(diff, where, word)
    else:
        assert diff.code == 0 and not diff.err, diff
    sandbox.assert_untouched()


# --- the index itself: duplicate entries, wrong types, depth ---


def test_a_tensor_listed_twice_in_the_index(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """Today: json keeps the last entry and verify says clean."""
    src = checkpoint(sandbox.root / "src")
    doc = index(src)
    tensor = next(k for k, v in doc["weight_map"].items() if v == FIRST)
    entries = [f'"{k}": "{v}"' for k, v in doc["weight_map"].items()] + [f'"{tensor}": "{SECOND}"']
    text = f'{{"metadata": {json.dumps(doc["metadata"])}, "weight_map": {{{", ".join(entries)}}}}}'
    (src / INDEX_FILE).write_text(text)
    sandbox.freeze()
    for args in (["quantize", src, sandbox.root / "out"], ["inspect", src], ["diff", src, src]):
        refused(run_inprocess(capsys, monkeypatch, *args), INDEX_FILE, tensor, "listed twice", FIRST, SECOND)
    verified(run_inprocess(capsys, monkeypatch, "verify", src), "index.duplicate-entry", tensor, "listed twice")
    sandbox.assert_untouched()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.update(weight_map=sorted(d["weight_map"])), ["weight_map", "list"]),
        (lambda d: d["weight_map"].update({"model.norm.weight": 7}), ["model.norm.weight", "7"]),
        (lambda d: d["weight_map"].update({"model.norm.weight": None}), ["model.norm.weight", "None"]),
        (lambda d: d["weight_map"].update({"model.norm.weight": [FIRST]}), ["model.norm.weight", FIRST]),
        (lambda d: d.update(metadata="garbage"), ["metadata is str"]),
        (lambda d: d.update(metadata=[["total_size", 1]]), ["metadata is list"]),
    ],
    ids=["weight_map-list", "shard-int", "shard-null", "shard-list", "metadata-str", "metadata-list"],
)
def test_index_values_of_the_wrong_type(sandbox: Sandbox, capsys, monkeypatch, change, words) -> None:
    src = checkpoint(sandbox.root / "src")
    doc = index(src)
    change(doc)
    (src / INDEX_FILE).write_text(json.dumps(doc))
    sandbox.freeze()
    refused(run_inprocess(capsys, monkeypatch, "quantize", src, sandbox.root / "out"), INDEX_FILE, *words)
    refused(run_inprocess(capsys, monkeypatch, "eval", src, src, "--no-logits"), INDEX_FILE, *words)
    verified(run_inprocess(capsys, monkeypatch, "verify", src), "index.invalid", INDEX_FILE, *words)
    sandbox.assert_untouched()


def test_transplant_onto_a_target_with_garbage_metadata(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """Today: dict('garbage') in the index rewrite is a traceback."""
    donor = write(tiny_moe(kv_scales=True, seed=1), sandbox.root / "donor")
    target = write(tiny_moe(kv_scales=False, seed=2), sandbox.root / "target")
    doc = index(target)
    doc["metadata"] = "garbage"
    (target / INDEX_FILE).write_text(json.dumps(doc))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "transplant", donor, target, "--select", KV)
    refused(result, INDEX_FILE, "metadata is str")
    sandbox.assert_untouched()


@pytest.mark.parametrize("file", ["config.json", INDEX_FILE])
def test_json_nested_too_deeply(sandbox: Sandbox, capsys, monkeypatch, file: str) -> None:
    """Today: RecursionError, a traceback."""
    src = checkpoint(sandbox.root / "src")
    (src / file).write_text("[" * 100_000 + "]" * 100_000)
    sandbox.freeze()
    for args in (["quantize", src, sandbox.root / "out"], ["eval", src, src, "--no-logits"]):
        refused(run_inprocess(capsys, monkeypatch, *args), file, "nested too deeply")
    verified(run_inprocess(capsys, monkeypatch, "verify", src), "json.invalid", file, "nested too deeply")
    sandbox.assert_untouched()


# --- other files: links out of the source, loops, special files ---


def test_other_files_never_carry_what_lies_outside_the_source(sandbox: Sandbox) -> None:
    """Links out of SRC are skipped and named; links inside are copied as files; loops and FIFOs are skipped."""
    src = checkpoint(sandbox.root / "src")
    (sandbox.root / "secret.txt").write_text("not for upload")
    (sandbox.root / "secrets").mkdir()
    (sandbox.root / "secrets" / "key").write_text("not for upload either")
    (src / "tokenizer.json").write_text("{}")
    (src / "leak.txt").symlink_to(sandbox.root / "secret.txt")
    (src / "leaks").symlink_to("../secrets")
    (src / "alias.json").symlink_to("tokenizer.json")
    (src / "loop-a").symlink_to("loop-b")
    (src / "loop-b").symlink_to("loop-a")
    (src / "extra").mkdir()
    (src / "extra" / "notes.md").write_text("kept")
    (src / "extra" / "again").symlink_to("..")
    os.mkfifo(src / "pipe")
    sandbox.freeze()
    out = sandbox.root / "out"
    result = run_subprocess("quantize", src, out, "--no-hash", "--json", timeout=30)
    assert result.code == 0 and "Traceback" not in result.err, result.err
    skipped = json.loads(result.out)["manifest"]["skipped_files"]
    assert set(skipped) == {"leak.txt", "leaks", "loop-a", "loop-b", "extra/again", "pipe"}, skipped
    assert "out of the checkpoint" in skipped["leak.txt"] and "FIFO" in skipped["pipe"]
    assert json.loads((out / "weightsmith.json").read_text())["skipped_files"] == skipped
    copied = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert copied == sorted([*(p.name for p in out.glob("model-*")), "alias.json", "config.json",
                             "extra/notes.md", INDEX_FILE, "tokenizer.json", "weightsmith.json"])  # fmt: skip
    assert not any(p.is_symlink() for p in out.rglob("*")) and (out / "alias.json").read_text() == "{}"
    summary = run_subprocess("quantize", src, sandbox.root / "out2", "--no-hash", timeout=30)
    assert summary.code == 0 and "skipped   leak.txt: is a link out of the checkpoint folder" in summary.out
    sandbox.assert_untouched("out", "out2")


def test_a_hub_cache_snapshot_carries_its_blobs(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """Every file of a hub snapshot is a link into REPO/blobs: those are followed, whatever the file."""
    repo = sandbox.root / "models--x"
    snap, blobs = repo / "snapshots" / "rev", repo / "blobs"
    src = checkpoint(sandbox.root / "plain")
    (src / "tokenizer.json").write_text('{"t": 1}')
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(src.iterdir())):
        os.rename(f, blobs / f"blob{i}")
        (snap / f.name).symlink_to(f"../../blobs/blob{i}")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "quantize", snap, sandbox.root / "out", "--no-hash")
    assert result.code == 0, result.err
    assert (sandbox.root / "out" / "tokenizer.json").read_text() == '{"t": 1}'
    assert "skipped" not in result.out
    sandbox.assert_untouched("out")


# --- the writer: new files only, below its folder only ---


@pytest.mark.parametrize("name", ["../x.safetensors", "/tmp/x.safetensors", "", "a/../../x", "a\\b", "a\x00"])
def test_the_writer_refuses_a_name_outside_its_folder(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(OutputError) as err:
        ShardWriter(folder, name, [TensorSpec("t", "F32", (2,))])
    assert err.value.code == "output.unsafe-name"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out"]


def test_the_writer_never_reuses_a_file_or_follows_a_link(tmp_path: Path) -> None:
    folder, victim = tmp_path / "out", tmp_path / "victim.safetensors"
    folder.mkdir()
    victim.write_bytes(b"precious")
    (folder / "link.safetensors").symlink_to(victim)
    (folder / "old.safetensors").write_bytes(b"old")
    (folder / "dir").symlink_to(tmp_path)
    specs = [TensorSpec("t", "F32", (2,))]
    for name in ("link.safetensors", "old.safetensors", "dir/victim.safetensors", "dir/new.safetensors"):
        with pytest.raises((OSError, OutputError)):
            ShardWriter(folder, name, specs)
    assert victim.read_bytes() == b"precious" and (folder / "old.safetensors").read_bytes() == b"old"
    assert not (tmp_path / "new.safetensors").exists()
    with ShardWriter(folder, "sub/new.safetensors", specs) as writer:
        writer.write("t", np.ones(2, np.float32))
    assert (folder / "sub" / "new.safetensors").stat().st_size > 8


# --- fuzzing the index: any weight_map opens or is one CheckpointError, and nothing outside is opened ---

FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2), database=None)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
HOSTILE_NAMES = [
    *(FIRST, SECOND, "../canary.safetensors", "", ".", "..", "/", f"./{FIRST}", f"{FIRST}/", f"x/../{FIRST}"),
    *(f"out/{FIRST}", f"loop/{FIRST}", f"in/{FIRST}", "in", "a\\b", "a\x00b", "\ud800", "config.json"),
    *("a" * 300, "a/" * 600 + "x", "a/" * 499 + "x"),
]
TENSORS = sorted(llama_tensors(CONFIG))


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint with every kind of neighbour a name could reach: a canary outside, links out, a loop."""
    base = tmp_path_factory.mktemp("fuzz")
    root = checkpoint(base / "ckpt")
    shutil.copy(root / FIRST, base / "canary.safetensors")
    (base / "outside").mkdir()
    shutil.copy(root / FIRST, base / "outside" / FIRST)
    (root / "out").symlink_to(base / "outside")
    (root / "loop").symlink_to("loop")
    (root / "in").mkdir()
    shutil.copy(root / FIRST, root / "in" / FIRST)
    return root


def _object(pairs: list[tuple[str, object]]) -> str:
    """A JSON object that may repeat a key (which `json.dumps` of a dict cannot)."""
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"


def opens_or_refuses(root: Path, index_text: str) -> None:
    """`Checkpoint.open` and `survey` on this index: a checkpoint or a CheckpointError, and only files inside opened."""
    (root / INDEX_FILE).write_text(index_text, encoding="utf-8", errors="surrogatepass")
    opened: list[str] = []

    def spy(real_open: Callable[..., object]) -> Callable[..., object]:
        def wrapper(path: object, *args: object, **kwargs: object) -> object:
            opened.append(os.path.realpath(path))
            return real_open(path, *args, **kwargs)

        return wrapper

    with mock.patch.object(os, "open", spy(os.open)), mock.patch.object(builtins, "open", spy(builtins.open)):
        with contextlib.suppress(CheckpointError):
            Checkpoint.open(root)
        with contextlib.suppress(CheckpointError):
            survey(root)
    real = str(root.resolve())
    assert all(p.startswith(real + os.sep) for p in opened), opened
    assert (root.parent / "canary.safetensors").read_bytes() == (root / FIRST).read_bytes()


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(TENSORS) | st.text(max_size=8), st.sampled_from(HOSTILE_NAMES) | st.text(max_size=12) | JSON
        ),
        max_size=14,
    ),
    st.none() | JSON | st.fixed_dictionaries({"total_size": st.integers() | JSON}),
)
def test_fuzzed_weight_map(fuzz_root: Path, pairs: list[tuple[str, object]], metadata: object) -> None:
    head = "" if metadata is None else f'"metadata": {json.dumps(metadata)}, '
    opens_or_refuses(fuzz_root, "{" + head + f'"weight_map": {_object(pairs)}' + "}")


@FUZZ
@given(JSON, st.text(alphabet=st.sampled_from(list('{}[]":,. 0123456789-eE_ntrufalsw\\/')), max_size=200))
def test_fuzzed_index_shape_and_text(fuzz_root: Path, doc: object, text: str) -> None:
    opens_or_refuses(fuzz_root, json.dumps({"weight_map": doc}))
    opens_or_refuses(fuzz_root, text)
