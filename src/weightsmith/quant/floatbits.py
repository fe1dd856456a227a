"""Exact emulation of bf16 and fp16 arithmetic inside numba kernels.

compressed-tensors computes scales and quotients in the weight's own dtype on CPU: torch widens
each operand to float32, operates, and rounds the result back (round to nearest, ties to even).
Reproducing its bytes means rounding every intermediate the same way. Each kernel works on float32
values and calls `round_to(mode, v)` wherever torch would have rounded to the weight dtype.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Which dtype the arithmetic is emulated in.
MODE_F32, MODE_BF16, MODE_F16 = 0, 1, 2

_F16_MIN_NORMAL = np.float32(2.0**-14)
_TWO_POW_24 = np.float32(2.0**24)
_TWO_POW_M24 = np.float32(2.0**-24)
_RINT_MAGIC = np.float32(1.5 * 2.0**23)

#: How the kernels' scalar helpers (rounding, decoding, one element's code) are compiled: each is a
#: numba function of its own, which LLVM inlines into every kernel that calls it. The mode and flags a
#: kernel passes are literals there, so the helper's branches fold away as if it had been written
#: inline. numba's own inlining (`inline="always"`) instead copies and re-types the callee's IR at
#: every call site, recursively: with it the int4 kernel took 14 s of CPU to compile for BF16 and 20 s
#: for float32, without it about 4 s, and it runs as fast (benchmarks/startup_speed.py, quantize_speed.py).
scalar_helper = njit(nogil=True, error_model="numpy")
#: How helpers that take arrays, and the few a kernel calls with runtime arguments in its inner loops
#: (a group's scale), are compiled: inlined by numba. A call that passes an array through numba's
#: calling convention counts references on it each time; in the int4 kernel's per-group helper that
#: made the kernel 1.5x slower.
array_helper = njit(inline="always", nogil=True)


@scalar_helper
def bf16_round(v: np.float32) -> np.float32:
    """Round a float32 to the nearest bfloat16 (ties to even), returned as float32."""
    b = np.float32(v).view(np.uint32)
    b = np.uint32((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))
    return b.view(np.float32)


@scalar_helper
def rint_small(v: np.float32) -> np.float32:
    """`np.rint(v)` (ties to even) for |v| <= 2**22, as plain arithmetic so that loops vectorise.

    Past 1.5 * 2**23 a float32 has no fraction bits, so the addition itself rounds to the nearest
    integer, ties to even; subtracting gives it back exactly. (np.rint is a libm call per element.)
    Not for kernels compiled with fastmath "reassoc", which may fold the two operations away.
    """
    return (v + _RINT_MAGIC) - _RINT_MAGIC


@scalar_helper
def f16_round(v: np.float32) -> np.float32:
    """Round a float32 in fp16 range to the nearest float16 (ties to even), returned as float32."""
    if abs(v) < _F16_MIN_NORMAL:
        return np.float32(np.rint(v * _TWO_POW_24) * _TWO_POW_M24)
    b = np.float32(v).view(np.uint32)
    b = np.uint32((b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))
    return b.view(np.float32)


@scalar_helper
def round_to(mode: int, v: np.float32) -> np.float32:
    """`v` rounded to the emulated dtype."""
    if mode == MODE_BF16:
        return bf16_round(v)
    if mode == MODE_F16:
        return f16_round(v)
    return np.float32(v)


@scalar_helper
def decode(mode: int, raw: np.uint16 | np.uint32 | np.float32) -> np.float32:
    """One stored element as float32: bf16 or fp16 bits in a uint16, or a float32 as is."""
    if mode == MODE_BF16:
        return np.uint32(np.uint32(raw) << np.uint32(16)).view(np.float32)
    if mode == MODE_F16:
        h = np.uint32(raw)
        sign = np.float32(-1.0) if h & np.uint32(0x8000) else np.float32(1.0)
        e = (h >> np.uint32(10)) & np.uint32(0x1F)
        m = h & np.uint32(0x3FF)
        if e == 0:
            return sign * np.float32(m) * _TWO_POW_M24
        if e == 31:
            return sign * np.float32(np.inf) if m == 0 else np.float32(np.nan)
        bits = (
            ((h & np.uint32(0x8000)) << np.uint32(16)) | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13))
        )
        return np.uint32(bits).view(np.float32)
    return np.float32(raw)
