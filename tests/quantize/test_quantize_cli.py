"""The quantize command as a user meets it: outputs, and one clear line for every kind of bad input."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from clirun import one_error_line, run, sigint_default
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest
from weightsmith.core.errors import OutputError
from weightsmith.io.checkpoint import Checkpoint
from weightsmith.quantization import pipeline


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = write_checkpoint(tmp_path / "src", llama_tensors(), shards=2)
    (folder / "tokenizer.json").write_text('{"model": {}}')
    (folder / "generation_config.json").write_text("{}")
    (folder / "modeling_custom.py").write_text("# remote code\n")
    (folder / "extra").mkdir()
    (folder / "extra" / "notes.txt").write_text("kept")
    return folder


def test_quantize_writes_a_complete_checkpoint_and_never_touches_the_source(src, tmp_path, capsys, monkeypatch) -> None:
    before = digest(src)
    code, out, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "out", "--json")
    assert code == 0
    result = json.loads(out)
    assert digest(src) == before
    ckpt = Checkpoint.open(tmp_path / "out")
    for f in ("tokenizer.json", "generation_config.json", "modeling_custom.py", "extra/notes.txt", "weightsmith.json"):
        assert (tmp_path / "out" / f).is_file(), f
    assert not list(tmp_path.glob("out.partial-*"))
    m = result["manifest"]
    assert m["sizes"]["bytes_after"] == ckpt.tensor_bytes < m["sizes"]["bytes_before"]
    assert set(m["source"]["files"]) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    shard = m["source"]["files"]["model-00001-of-00002.safetensors"]
    assert shard["sha256"] == hashlib.sha256((src / "model-00001-of-00002.safetensors").read_bytes()).hexdigest()
    assert ckpt.index["metadata"]["total_size"] == ckpt.tensor_bytes
    assert "model.layers.0.mlp.up_proj.weight" not in ckpt.tensors
    weights = ckpt.config["quantization_config"]["config_groups"]["W4A16_ASYM"]["weights"]  # the default scheme
    assert weights["group_size"] == 128 and weights["symmetric"] is False
    assert m["pre_pass"]["name"] == "sinq" and result["pre_pass_skipped"] is None  # a Llama: balanced by default


def test_the_summary_says_whether_the_pre_pass_ran(src, tmp_path, capsys, monkeypatch) -> None:
    code, out, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "sinq", "--no-hash")
    assert code == 0 and "pre-pass  sinq: weights balanced, column scales folded into 4 norms" in out
    code, out, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "rtn", "--scale-search", "none", "--no-hash")
    assert code == 0 and "pre-pass  none: --scale-search none asks for plain round-to-nearest" in out
    code, out, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "off", "--pre-pass", "none", "--no-hash")
    assert code == 0 and "pre-pass" not in out
    code, out, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "plan", "--dry-run")
    assert code == 0 and "pre-pass: sinq, folding into 4 norms and biases" in out
    code, out, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "plan", "--dry-run", "--scheme", "w8a16")
    assert code == 0 and "pre-pass: none (tensor model.layers.0.self_attn.q_proj.weight must be quantized as" in out
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "plan", "--dry-run", "--pre-pass", "awq")
    assert code == 2 and "--pre-pass 'awq': choose from auto, sinq, none" in err


def test_dry_run_prints_the_plan_and_writes_nothing(src, tmp_path, capsys, monkeypatch) -> None:
    code, out, _ = run(
        capsys, monkeypatch, "quantize", src, tmp_path / "out", "--dry-run", "--json", "--group-size", "64"
    )
    assert code == 0
    plan = json.loads(out)
    assert not (tmp_path / "out").exists()
    actions = {t["name"]: t["action"] for t in plan["tensors"]}
    assert actions["model.layers.0.self_attn.q_proj.weight"] == "quantize"
    assert plan["bytes_out_predicted"] < plan["bytes_in"]
    code, out, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "out", "--dry-run")
    assert code == 0 and "predicted:" in out and "embedding" in out


def test_existing_output_needs_force(src, tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("x")
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "out")
    assert code != 0 and "already exists" in one_error_line(err)
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "out", "--force")
    # not ours: --force is no licence
    assert code != 0 and "holds 'old.txt' and no weightsmith.json" in one_error_line(err)
    (tmp_path / "out" / "old.txt").unlink()
    for _ in range(2):  # an empty folder, then the output weightsmith wrote there
        code, _, _ = run(capsys, monkeypatch, "quantize", src, tmp_path / "out", "--force")
        assert code == 0 and (tmp_path / "out" / "config.json").exists()


def test_output_inside_source_is_refused(src, capsys, monkeypatch) -> None:
    code, _, err = run(capsys, monkeypatch, "quantize", src, src / "quantized")
    assert code != 0 and "inside the source" in one_error_line(err)
    assert not (src / "quantized").exists()


def test_symlinked_shards_from_a_hub_cache_are_read_through(src, tmp_path, capsys, monkeypatch) -> None:
    blobs, snap = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            blob = blobs / hashlib.sha256(f.name.encode()).hexdigest()
            blob.write_bytes(f.read_bytes())
            (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    code, _, _ = run(capsys, monkeypatch, "quantize", snap, tmp_path / "out", "--no-hash")
    assert code == 0
    out_files = list((tmp_path / "out").iterdir())
    assert out_files and not any(p.is_symlink() for p in out_files)


# --- bad input: each gives one line naming the file (and tensor), a non-zero exit, no output ---


def _shard(src: Path) -> Path:
    return src / "model-00001-of-00002.safetensors"


def _rewrite_header(path: Path, edit) -> None:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    new = edit(header) if callable(edit) else edit
    blob = new if isinstance(new, bytes) else json.dumps(new).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data[8 + n :])


def _first_tensor(header: dict) -> str:
    return min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 4953736192\n"


def _swap_dtype(h: dict) -> dict:
    h[_first_tensor(h)]["dtype"] = "I4"
    return h


def _overlap(h: dict) -> dict:
    names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    a, b = h[names[0]], h[names[1]]
    size_b = b["data_offsets"][1] - b["data_offsets"][0]
    b["data_offsets"] = [a["data_offsets"][1] - 2, a["data_offsets"][1] - 2 + size_b]
    return h


def _gap(h: dict) -> dict:
    for k in h:
        if k != "__metadata__":
            h[k]["data_offsets"] = [h[k]["data_offsets"][0] + 2, h[k]["data_offsets"][1] + 2]
    return h


def _duplicate(h: dict) -> bytes:
    """The same name twice in one header (the JSON text itself; a dict cannot hold it)."""
    first = _first_tensor(h)
    text = json.dumps(h)
    return text.replace("{", "{" + json.dumps(first) + ": " + json.dumps(h[first]) + ", ", 1).encode()


CASES = {
    "missing-config": (lambda s: (s / "config.json").unlink(), "config.json", "does not exist"),
    "lfs-config": (lambda s: (s / "config.json").write_bytes(LFS), "config.json", "git-LFS pointer"),
    "lfs-index": (lambda s: (s / "model.safetensors.index.json").write_bytes(LFS), "index.json", "git-LFS pointer"),
    "lfs-shard": (lambda s: _shard(s).write_bytes(LFS), "00001-of-00002", "download the real file"),
    "missing-shard": (lambda s: _shard(s).unlink(), "00001-of-00002", "does not exist"),
    "unreadable-shard": (lambda s: _shard(s).chmod(0), "00001-of-00002", "cannot be read"),
    "shard-is-a-folder": (lambda s: (_shard(s).unlink(), _shard(s).mkdir()), "00001-of-00002", "is a directory"),
    "truncated": (lambda s: _shard(s).write_bytes(_shard(s).read_bytes()[:-100]), "00001-of-00002", "truncated"),
    "trailing": (
        lambda s: _shard(s).write_bytes(_shard(s).read_bytes() + b"\0" * 7),
        "00001-of-00002",
        "trailing bytes",
    ),
    "header-too-large": (
        lambda s: _shard(s).write_bytes((200_000_000).to_bytes(8, "little") + b"{}"),
        "00001-of-00002",
        "header",
    ),
    "not-json": (lambda s: _rewrite_header(_shard(s), b"{not json"), "00001-of-00002", "not valid JSON"),
    "unknown-dtype": (lambda s: _rewrite_header(_shard(s), _swap_dtype), "00001-of-00002", "unknown dtype 'I4'"),
    "overlap": (lambda s: _rewrite_header(_shard(s), _overlap), "00001-of-00002", "inside the previous tensor"),
    "gap": (lambda s: _rewrite_header(_shard(s), _gap), "00001-of-00002", "starts at 2"),
    "duplicate-name": (lambda s: _rewrite_header(_shard(s), _duplicate), "00001-of-00002", "appears twice"),
    "index-names-missing-tensor": (
        lambda s: (s / "model.safetensors.index.json").write_text(
            json.dumps(
                {
                    "metadata": {},
                    "weight_map": json.loads((s / "model.safetensors.index.json").read_text())["weight_map"]
                    | {"model.layers.9.mlp.up_proj.weight": "model-00001-of-00002.safetensors"},
                }
            )
        ),
        "index.json",
        "shard lacks it",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_line(case, src, tmp_path, capsys, monkeypatch) -> None:
    if case == "unreadable-shard" and os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    breaker, where, what = CASES[case]
    breaker(src)
    before = digest(src) if case != "unreadable-shard" else None
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "out")
    line = one_error_line(err)
    assert code != 0
    assert where in line and what in line, line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.partial-*"))
    if before is not None:
        assert digest(src) == before


def test_bad_header_lines_name_the_tensor(src, tmp_path, capsys, monkeypatch) -> None:
    _rewrite_header(_shard(src), _swap_dtype)
    _, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "out")
    assert "tensor '" in one_error_line(err)


def test_nan_in_a_weight_names_file_tensor_and_position(tmp_path, capsys, monkeypatch) -> None:
    tensors = llama_tensors()
    bad = tensors["model.layers.1.mlp.up_proj.weight"].astype(np.float32)
    bad[7, 33] = np.nan
    tensors["model.layers.1.mlp.up_proj.weight"] = bad.astype(ml_dtypes.bfloat16)
    norm = tensors["model.norm.weight"].astype(np.float32)
    norm[0] = np.inf  # kept tensors are copied, not judged
    tensors["model.norm.weight"] = norm.astype(ml_dtypes.bfloat16)
    src = write_checkpoint(tmp_path / "src", tensors)
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "out")
    line = one_error_line(err)
    assert code != 0
    assert "model.safetensors" in line and "model.layers.1.mlp.up_proj.weight" in line and "row 7, column 33" in line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.partial-*"))


def test_unknown_scheme_and_preset(src, tmp_path, capsys, monkeypatch) -> None:
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "o", "--scheme", "w3a16")
    assert code != 0 and "unknown scheme" in one_error_line(err)
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "o", "--preset", "nope")
    assert code != 0 and "unknown preset" in one_error_line(err)
    code, _, err = run(capsys, monkeypatch, "quantize", src, tmp_path / "o", "--group-size", "100")
    assert code != 0 and "multiple of 8" in one_error_line(err)


@pytest.fixture
def tiny_fs(tmp_path: Path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_no_space_is_caught_before_writing(src, tiny_fs, capsys, monkeypatch) -> None:
    code, _, err = run(capsys, monkeypatch, "quantize", src, tiny_fs / "out")
    assert code != 0 and "GiB free" in one_error_line(err)
    assert list(tiny_fs.iterdir()) == []


def test_running_out_of_space_midway_leaves_nothing(src, tiny_fs, monkeypatch) -> None:
    from weightsmith.api import quantize

    monkeypatch.setattr(pipeline, "check_space", lambda out, needed: None)
    with pytest.raises(OutputError, match="ran out of disk space"):
        quantize(QuantizeRequest(src, tiny_fs / "out", scheme="w4a16", group_size=128, workers=2, pre_pass=None))
    assert list(tiny_fs.iterdir()) == []


def test_ctrl_c_leaves_nothing_that_looks_finished(tmp_path: Path) -> None:
    """A real interrupt of the command line, mid-run, on a checkpoint big enough to still be running."""
    big = {f"model.layers.{i}.mlp.up_proj.weight": np.ones((4096, 4096), ml_dtypes.bfloat16) for i in range(24)}
    src = write_checkpoint(tmp_path / "src", big, shards=4)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightsmith.cli", "quantize", str(src), str(out), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,
    )
    deadline = time.time() + 60
    while not list(tmp_path.glob("out.partial-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not out.exists() and not list(tmp_path.glob("out.partial-*"))


def test_gptq_dry_run_names_its_calibration_text_alike_in_json_and_words(tmp_path: Path) -> None:
    """`--dry-run` and `--dry-run --json` take the calibration text's name from one place."""
    from weightsmith.quantization.cli import GptqOptions, _gptq_json, _gptq_line

    for opts, label, words in (
        (GptqOptions(None, None, 512, 128, 0.01), "builtin:code", "the built-in code text"),
        (GptqOptions(None, "prose", 512, 128, 0.01), "builtin:prose", "the built-in prose text"),
        (GptqOptions(tmp_path / "t.txt", None, 512, 128, 0.01), str(tmp_path / "t.txt"), str(tmp_path / "t.txt")),
    ):
        assert _gptq_json(opts)["text"] == label
        assert f"512 tokens of {words} in sequences of 128" in _gptq_line(opts)
