"""What the command line does to start fast leaves the process as it found it, and only where it should."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightsmith.cli import paused_gc

SRC = Path(__file__).resolve().parents[1] / "src"
BLAS_THREADS = """
import os, sys
from weightsmith.cli import build_app
build_app(sys.argv[1:])
print(os.environ.get("OPENBLAS_NUM_THREADS"), "numpy" in sys.modules)
"""


def test_paused_gc_pauses_and_restores_the_collector_even_on_error() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # a caller's choice stands
    finally:
        gc.enable()


def _blas_threads(*args: str, env: dict[str, str] | None = None) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | (env or {})
    environ["PYTHONPATH"] = os.pathsep.join([str(SRC), environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", BLAS_THREADS, *args], capture_output=True, text=True, env=environ)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_quantize_starts_openblas_without_its_thread_pool_unless_the_user_chose() -> None:
    assert _blas_threads("quantize") == "1 False"  # set before numpy loads, which reads it then
    assert _blas_threads("quantize", env={"OPENBLAS_NUM_THREADS": "3"}) == "3 False"
    assert _blas_threads("inspect").split()[0] == "None"  # other commands: untouched


KERNEL_WITHOUT_SCIPY = """
import sys
import ml_dtypes, numpy as np
from weightsmith.core import blas_probe
from weightsmith.schemes import make_scheme
blas_probe.skip()
x = np.ones((8, 128), ml_dtypes.bfloat16)
packed = make_scheme("w4a16", None, None).encode(x, 0, x.shape, None)
loaded = "scipy.linalg" in sys.modules
import scipy.linalg  # any later import is the real one
print(loaded, scipy.linalg.__name__)
"""


def test_running_a_kernel_after_skip_does_not_import_scipy_linalg() -> None:
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", KERNEL_WITHOUT_SCIPY], capture_output=True, text=True, env=environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "scipy.linalg"]


def test_quantize_skips_the_blas_probe_and_other_commands_do_not() -> None:
    script = BLAS_THREADS.replace(
        'print(os.environ.get("OPENBLAS_NUM_THREADS"), "numpy" in sys.modules)',
        'print(any(type(f).__name__ == "_NoBlasProbe" for f in sys.meta_path))',
    )
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    for command, expected in (("quantize", "True"), ("demo", "True"), ("inspect", "False")):
        done = subprocess.run([sys.executable, "-c", script, command], capture_output=True, text=True, env=environ)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected, command
