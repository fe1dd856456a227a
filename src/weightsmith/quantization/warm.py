"""Compiling the quantize kernels: each on its first use, said on screen; or all of them ahead of time.

numba compiles a kernel on its first call and caches the machine code (beside its source, or under
`NUMBA_CACHE_DIR`); later processes load it from there. A quantize run compiles only what it uses:
before its workers start on the weights, the pipeline runs each (scheme, input dtype) its plan
quantizes on a tiny block (`encode_block`), and `on_compile` tells the command line when that is a
compile rather than a load, so that a first run says why it takes longer ("compiling the w4a16
kernels once ..."), and a later one says nothing.

`python -m weightsmith.quantization.warm` compiles every kernel of every scheme and scale search for each input
dtype up front, for a machine that should never compile on first use (the tests and the benchmarks,
a shared install or an image). It is not part of `make demo`: a user runs one scheme on one dtype,
and compiling the rest took most of the demo's time. It also compiles the package's bytecode: an
editable install leaves none, and a fresh clone's first quantize paid some 0.3 s more CPU than its
second compiling it.
"""

from __future__ import annotations

import compileall
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.safetensors.dtypes import DTYPES
from weightsmith.schemes import REGISTRY, Scheme, make_scheme
from weightsmith.searches import NONE, searches_for

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


#: The dtypes (safetensors codes) a source weight reaches the kernels in (FP8 sources arrive decoded to BF16).
INPUT_DTYPES = ("BF16", "F16", "F32")


def encode_block(scheme: Scheme, dtype: np.dtype | type) -> None:
    """Run `scheme`'s kernels (first pass, scale search, encode) once on a tiny zero block of `dtype`:
    loaded from numba's cache, or compiled into it. Kernels are compiled per input type, not shape."""
    x = np.zeros((math.lcm(8, scheme.ROW_MULTIPLE), max(8, scheme.group_size)), dtype)
    param = None
    if scheme.first_pass is not None:
        state, _ = scheme.observe(x, 0, x.shape, None)
        param = scheme.conclude({"warm": state})["warm"]
    scheme.encode(x, 0, x.shape, param)


@contextmanager
def on_compile(callback: Callable[[], None]) -> Iterator[None]:
    """Within the block, call `callback` once, just before numba first compiles anything.

    numba announces a compile ("numba:compile") only when neither this process nor its cache holds
    the kernel for these argument types, so a run whose kernels are cached hears nothing.
    """
    from numba.core import event  # here, not at the top: the command line imports this module

    class FirstCompile(event.Listener):
        """Calls back once, at the start of the first compile numba begins (never for a cache load)."""

        def __init__(self) -> None:
            self.callback: Callable[[], None] | None = callback

        def on_start(self, ev: Any) -> None:
            call, self.callback = self.callback, None
            if call is not None:
                call()

        def on_end(self, ev: Any) -> None:
            pass

    with event.install_listener("numba:compile", FirstCompile()):
        yield


def _variants() -> list[Scheme]:
    out: list[Scheme] = []
    for name in REGISTRY:
        for search in (NONE, *searches_for(name)):
            try:
                out.append(make_scheme(name, None, search))
            except WeightsmithError:  # a search this scheme refuses (each scheme says why): nothing to compile
                continue
    return list(dict.fromkeys(out))


def compile_all() -> int:
    """Run each scheme's kernels once per input dtype; returns how many (scheme, dtype) pairs ran."""
    count = 0
    for scheme in _variants():
        for code in INPUT_DTYPES:
            encode_block(scheme, DTYPES[code].element)
            count += 1
    return count


def main() -> None:
    from weightsmith.engine.gptq import compile_kernel

    started = time.perf_counter()
    n = compile_all()
    compile_kernel()  # GPTQ's column loop
    n += 1
    compileall.compile_dir(Path(__file__).parents[1], quiet=1)  # the whole package
    print(f"weightsmith: {n} quantize kernels ready in numba's cache ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
