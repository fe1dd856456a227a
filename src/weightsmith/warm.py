"""Compile every quantize kernel into numba's on-disk cache, once, when weightsmith is installed.

numba compiles a kernel on its first call and caches the machine code beside its source. Without
this step a fresh install's first quantize pays the compile: a 288 MiB draft reported 12.4 s on its
first run and 4.2 s on its second. The Makefile runs `python -m weightsmith.warm` right after
installing, so the first run a user sees is as fast as later ones. It asks every registered scheme
(each scale search too) to encode a small block of each input dtype; nothing is written but the
caches. It also compiles the package's bytecode: an editable install leaves none, and a fresh
clone's first quantize paid some 0.3 s more CPU than its second compiling it (1.23x wall).
"""

from __future__ import annotations

import compileall
import math
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from weightsmith.errors import WeightsmithError
from weightsmith.schemes import NONE, REGISTRY, Scheme, make_scheme

#: The dtypes a source weight reaches the kernels in (FP8 sources arrive decoded to BF16).
INPUT_DTYPES = (ml_dtypes.bfloat16, np.float16, np.float32)


def _variants() -> list[Scheme]:
    out: list[Scheme] = []
    for name, cls in REGISTRY.items():
        for search in (NONE, *cls.SEARCHES):
            try:
                out.append(make_scheme(name, None, search))
            except WeightsmithError:  # a search this scheme refuses (each scheme says why): nothing to compile
                continue
    return list(dict.fromkeys(out))


def compile_all() -> int:
    """Run each scheme's kernels once per input dtype; returns how many (scheme, dtype) pairs ran."""
    count = 0
    for scheme in _variants():
        rows = math.lcm(8, scheme.ROW_MULTIPLE)
        cols = max(scheme.group_size, 128)
        for dtype in INPUT_DTYPES:
            x = np.zeros((rows, cols), dtype)
            param = None
            if scheme.first_pass is not None:
                state, _ = scheme.observe(x, 0, x.shape, None)
                param = scheme.conclude({"warm": state})["warm"]
            scheme.encode(x, 0, x.shape, param)
            count += 1
    return count


def main() -> None:
    from weightsmith.engine.gptq import compile_kernel

    started = time.perf_counter()
    n = compile_all()
    compile_kernel()  # GPTQ's column loop
    n += 1
    compileall.compile_dir(Path(__file__).parent, quiet=1)
    print(f"weightsmith: {n} quantize kernels ready in numba's cache ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
