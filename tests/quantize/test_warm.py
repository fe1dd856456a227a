"""Kernel compiling: every scheme and search ahead of time (`python -m weightsmith.quantization.warm`), or on
first use, said on the first line of the run that compiles and never by one that loads from the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from numba import njit

from small_demo import SMALL_DEMO
from weightsmith.quantization import warm
from weightsmith.quantization.demo import write_demo_checkpoint
from weightsmith.schemes import REGISTRY

SRC = Path(__file__).resolve().parents[2] / "src"


def test_every_scheme_and_search_is_compiled() -> None:
    variants = warm._variants()
    assert {s.name for s in variants} == set(REGISTRY)
    assert ("w4a16", "memoryless_mse") in {(s.name, s.scale_search) for s in variants}
    assert ("w4a16", None) in {(s.name, s.scale_search) for s in variants}  # `none`: plain round-to-nearest
    assert warm.compile_all() == len(variants) * len(warm.INPUT_DTYPES)


def test_on_compile_hears_a_compile_once_and_a_compiled_kernel_not_at_all() -> None:
    @njit
    def twice(x: int) -> int:
        return 2 * x

    heard: list[str] = []
    with warm.on_compile(lambda: heard.append("compile")):
        assert twice(2) == 4
        assert twice(3.5) == 7.0  # a second signature, a second compile: still one notice
    assert heard == ["compile"]
    with warm.on_compile(lambda: heard.append("again")):
        assert twice(5) == 10
    assert heard == ["compile"]
    assert twice(1.0) == 2.0  # outside the block: not heard
    assert heard == ["compile"]


def _quantize(src: Path, out: Path, cache: Path) -> list[str]:
    env = os.environ | {
        "NUMBA_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "weightsmith", "quantize", str(src), str(out), "--scheme", "mxfp8a16", "--no-hash"]
    command += ["--preset", "dflash-draft"]  # the demo is a DFlash draft: without it, quantize warns first
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if line.strip()]


def test_a_first_run_says_it_compiles_on_its_first_line_and_a_second_run_loads_silently(tmp_path: Path) -> None:
    src = write_demo_checkpoint(tmp_path / "bf16", config=SMALL_DEMO)
    first = _quantize(src, tmp_path / "first", tmp_path / "numba")
    assert first and first[0].startswith("compiling the mxfp8a16 kernels for bfloat16 weights once, about "), first
    assert sum("compiling" in line for line in first) == 1
    second = _quantize(src, tmp_path / "second", tmp_path / "numba")
    assert not any("compiling" in line for line in second), second
