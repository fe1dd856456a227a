"""What every hostile-input case asserts: one line, a non-zero exit, nothing outside the target changed.

A case builds a hostile checkpoint or config under a `sandbox` folder, snapshots the whole folder
(every file's bytes hashed, links and special files by kind, so a truncated source or a replaced
neighbour shows), runs a command, and checks:
- the exit status is non-zero (or zero, for a valid input that must now work);
- stderr holds exactly one non-empty line, `error: ...`, naming the file and entry, and no traceback;
- every path in the snapshot is unchanged except below the declared destination;
- nothing that looks finished was left: no destination unless the run succeeded, no `*.partial-*`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from synth import LLAMA_CONFIG, llama_tensors, write_checkpoint
from weightsmith import cli
from weightsmith.api import QuantizeRequest


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def error_line(self) -> str:
        """The single `error: ...` line; fails the test unless there is exactly one and no traceback."""
        assert "Traceback" not in self.err, self.err
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{self.err}"
        assert lines[0].startswith("error: "), lines[0]
        return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry below `folder` (links not followed) -> a digest of what it is and holds."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(folder))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(chunk)
                out[rel] = f"file:{st.st_size}:{h.hexdigest()}"
            else:
                out[rel] = f"special:{stat.S_IFMT(st.st_mode)}"
    return out


def changed_outside(before: dict[str, str], after: dict[str, str], *allowed: str) -> list[str]:
    """Paths added, removed or changed, leaving out those at or below an allowed relative path."""

    def inside(rel: str) -> bool:
        return any(rel == a or rel.startswith(a.rstrip("/") + "/") for a in allowed)

    keys = set(before) | set(after)
    return sorted(k for k in keys if before.get(k) != after.get(k) and not inside(k))


def leftovers(folder: Path) -> list[str]:
    """Anything below `folder` that an interrupted or failed run might leave looking finished."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".partial-" in p.name)


def run_inprocess(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: object) -> Result:
    """`weightsmith ARGS...` in this process (an uncaught exception fails the test as a traceback would)."""
    monkeypatch.setattr(sys, "argv", ["weightsmith", *map(str, args)])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return Result(code, out, err)


def run_subprocess(*args: object, timeout: float = 120, cwd: Path | None = None) -> Result:
    """`weightsmith ARGS...` as a separate process, for cases that could hang or must see real signals."""
    return _child([sys.executable, "-m", "weightsmith", *map(str, args)], timeout, cwd)


_ADDRESS_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
sys.argv = ["weightsmith", *sys.argv[1:]]
from weightsmith.cli import main
main()
"""


def run_limited(*args: object, timeout: float = 120) -> Result:
    """`weightsmith ARGS` in a child under a 3 GiB address-space limit and a time limit: an input that
    would blow up memory fails the case instead of the machine."""
    return _child([sys.executable, "-c", _ADDRESS_LIMITED, *map(str, args)], timeout, None)


def _child(argv: list[str], timeout: float, cwd: Path | None) -> Result:
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


class Sandbox:
    """A folder holding the hostile input and its neighbours; asserts nothing outside `allowed` changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.before: dict[str, str] = {}

    def freeze(self) -> None:
        self.before = snapshot(self.root)

    def assert_untouched(self, *allowed: str) -> None:
        changed = changed_outside(self.before, snapshot(self.root), *allowed)
        assert not changed, f"changed outside {allowed}: {changed}"
        left = leftovers(self.root)
        assert not left, f"left behind: {left}"


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    root = tmp_path / "sandbox"
    root.mkdir()
    return Sandbox(root)


#: A one-layer Llama small enough for every case to copy.
TINY_LLAMA = dict(LLAMA_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=32, vocab_size=64, num_hidden_layers=1)  # fmt: skip


def tiny_pair(root: Path) -> tuple[Path, Path]:
    """(ORIG, QUANT) under `root`: a one-layer BF16 Llama and its W4A16 g32 copy, built once per module."""
    from weightsmith.api import quantize

    orig = write_checkpoint(root / "orig", llama_tensors(TINY_LLAMA), TINY_LLAMA)
    quant = root / "quant"
    quantize(QuantizeRequest(orig, quant, scheme="w4a16", group_size=32, workers=1, hash_sources=False, pre_pass=None))
    return orig, quant


def copies(sandbox: Sandbox, pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """Copies of a `tiny_pair` inside the case's sandbox, for a command to be handed."""
    orig, quant = sandbox.root / "orig", sandbox.root / "quant"
    shutil.copytree(pair[0], orig)
    shutil.copytree(pair[1], quant)
    return orig, quant


def tiny_source(sandbox: Sandbox, name: str) -> Path:
    """A one-layer BF16 Llama named `name` inside the sandbox."""
    return write_checkpoint(sandbox.root / name, llama_tensors(TINY_LLAMA), TINY_LLAMA)


def carded(sandbox: Sandbox, pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch) -> Path:  # fmt: skip
    """A copy of a `tiny_pair`'s quantized checkpoint with its card written, which `card --check` passes."""
    _, quant = copies(sandbox, pair)
    assert run_inprocess(capsys, monkeypatch, "card", quant).code == 0
    assert run_inprocess(capsys, monkeypatch, "card", quant, "--check").code == 0
    return quant


def row_cells(row: str) -> int:
    """The cells of a Markdown table row as GitHub (cmark-gfm) splits it: a `|` with a backslash before
    it never ends a cell (that backslash alone is dropped), every other one does."""
    return len(re.findall(r"(?<!\\)\|", row.strip())) - 1
