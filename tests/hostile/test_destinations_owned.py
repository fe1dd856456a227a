"""Destinations, the second look: "ours" is proved, never a file name or an empty marker.

`--force` replaces a folder only when its `weightsmith.json` is a manifest of ours and it holds
nothing that manifest does not account for; a temporary file is made under a fresh name and only
that file is ever removed; `bench` and `demo` replace only what they provably wrote.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hostile.harness import TINY_LLAMA, Sandbox, run_inprocess
from synth import llama_tensors, write_checkpoint
from weightsmith import files
from weightsmith.manifest import MANIFEST_FILE

QUANTIZE = ("--scheme", "w4a16", "--group-size", "32", "--workers", "1", "--no-hash")


def _source(sandbox: Sandbox, name: str) -> Path:
    return write_checkpoint(sandbox.root / name, llama_tensors(TINY_LLAMA), TINY_LLAMA)


def _refused(capsys, monkeypatch, sandbox: Sandbox, *args: object) -> str:
    """`weightsmith ARGS`: exit 2, one line, and nothing in the sandbox changed."""
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, *args)
    line = result.error_line
    assert result.code == 2, result
    sandbox.assert_untouched()
    return line


# --- 1a: --force replaces only a folder its manifest accounts for --------------------------------------


def test_force_refuses_a_folder_with_an_empty_manifest(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """`{}` in weightsmith.json beside a thesis and photos once let --force delete them all."""
    src = _source(sandbox, "src")
    dl = sandbox.root / "dl"
    (dl / "photos").mkdir(parents=True)
    (dl / MANIFEST_FILE).write_text("{}\n")
    (dl / "thesis.tex").write_text("x\n")
    (dl / "photos" / "1.jpg").write_text("p\n")
    line = _refused(capsys, monkeypatch, sandbox, "quantize", src, dl, *QUANTIZE, "--force")
    assert str(dl) in line and MANIFEST_FILE in line, line


def test_force_refuses_our_output_holding_a_users_file(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A real output of ours is still refused once it holds a file (or folder) no run of ours wrote."""
    src = _source(sandbox, "src")
    (src / "tokenizer.json").write_text("{}\n")
    out = sandbox.root / "out"
    assert run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE).code == 0
    (out / "photos").mkdir()
    (out / "photos" / "1.jpg").write_text("p\n")
    line = _refused(capsys, monkeypatch, sandbox, "quantize", src, out, *QUANTIZE, "--force")
    assert "'photos'" in line, line
    (out / "photos" / "1.jpg").unlink()
    (out / "photos").rmdir()
    result = run_inprocess(capsys, monkeypatch, "quantize", src, out, *QUANTIZE, "--force")  # all ours again
    assert result.code == 0, result.err
    assert (out / "tokenizer.json").is_file()


# --- 1c, 4b, 4c: a temporary file has a fresh name; only it is ever removed ------------------------------


def test_replace_file_never_removes_a_file_named_like_its_temporary(sandbox: Sandbox) -> None:
    """`.NAME.partial-<pid>` of the user's was unlinked before and after every write."""
    target = sandbox.root / "report.md"
    mine = sandbox.root / f".report.md.partial-{os.getpid()}"
    mine.write_text("precious\n")
    folder = sandbox.root / f".results.json.partial-{os.getpid()}"
    folder.mkdir()  # a folder there once made the write fail after the whole run
    files.replace_file(target, b"new\n")
    files.replace_file(sandbox.root / "results.json", b"{}\n")
    assert mine.read_text() == "precious\n" and folder.is_dir()
    assert sorted(p.name for p in sandbox.root.iterdir()) == sorted(
        [mine.name, folder.name, "report.md", "results.json"]
    )


def test_replace_file_keeps_the_mode_of_the_file_it_replaces(sandbox: Sandbox) -> None:
    target = sandbox.root / "config.json"
    target.write_text("{}\n")
    target.chmod(0o600)
    files.replace_file(target, b'{"a": 1}\n')
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == '{"a": 1}\n'


def test_calibration_write_never_removes_a_file_named_like_its_temporary(sandbox: Sandbox) -> None:
    from weightsmith import calibration

    out = sandbox.root / "s7.safetensors"
    mine = sandbox.root / f".s7.safetensors.partial-{os.getpid()}"
    mine.write_text("precious\n")
    stats = calibration.CalibrationStats(
        calibration.Provenance("sha256:x", 64, 2, 32, "t", "ab" * 32, "original"),
        {"model.layers.0.self_attn": (1.0, 2.0)},
        {},
    )
    calibration.write(out, stats)
    assert mine.read_text() == "precious\n"
    assert calibration.read(out).kv == stats.kv
    assert sorted(p.name for p in sandbox.root.iterdir()) == sorted([mine.name, out.name])


def test_calibrate_refuses_a_name_too_long_before_its_run(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A 300-byte --out name failed with ENAMETOOLONG only after the whole calibration run."""
    from weightsmith.engine import calibrate

    def too_late(*args: object, **kwargs: object) -> None:
        raise AssertionError("the calibration run started before the name was checked")

    monkeypatch.setattr(calibrate, "calibration_tokens", too_late)
    src = _source(sandbox, "src")
    out = sandbox.root / ("p" * 300)
    line = _refused(capsys, monkeypatch, sandbox, "calibrate", src, "--out", out, "--tokens", "64", "--seq-len", "32")
    assert "longer than 255 bytes" in line, line


# --- 1b, 4a: demo replaces only the draft it wrote, never through a link --------------------------------


def test_demo_refuses_a_users_folder_behind_an_empty_marker(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """An empty `.weightsmith-demo` once let `demo --dir` delete the user's draft-bf16/notes.txt."""
    d2 = sandbox.root / "d2"
    (d2 / "draft-bf16").mkdir(parents=True)
    (d2 / ".weightsmith-demo").touch()
    (d2 / "draft-bf16" / "notes.txt").write_text("mywork\n")
    line = _refused(capsys, monkeypatch, sandbox, "demo", "--dir", d2, "--workers", "1")
    assert str(d2 / "draft-bf16") in line, line


def test_demo_refuses_a_draft_folder_that_is_a_link(capsys, monkeypatch, sandbox: Sandbox) -> None:
    """A link as draft-bf16 was a 42-line traceback (rmtree on a link)."""
    d1, elsewhere = sandbox.root / "d1", sandbox.root / "elsewhere"
    d1.mkdir()
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}\n")
    (d1 / ".weightsmith-demo").touch()
    (d1 / "draft-bf16").symlink_to(elsewhere)
    line = _refused(capsys, monkeypatch, sandbox, "demo", "--dir", d1, "--workers", "1")
    assert str(d1 / "draft-bf16") in line, line
