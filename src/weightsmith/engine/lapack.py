"""GPTQ's inverse-Hessian factor in half the arithmetic, on a path that releases the GIL.

GPTQ needs U, the upper Cholesky factor of H^-1 (H^-1 = U^T U). llm-compressor computes it in
three calls: the Cholesky factor of H, `cholesky_inverse`, and the upper Cholesky factor of that
inverse: 4n^3/3 flops. The same U comes from one Cholesky factorization and one triangular
inverse, 2n^3/3: with J the matrix that reverses the order of rows, if J H J = L L^T (L lower),
then H^-1 = J L^-T L^-1 J = (J L^-1 J)^T (J L^-1 J), and J L^-1 J is upper triangular with a
positive diagonal, so it is U (the factor is unique). The values agree with the three-call route
to float32 rounding, not bit for bit.

torch has no triangular inverse (`solve_triangular` against the identity costs n^3), so the two
calls are LAPACK's `spotrf` and `strtri` from scipy's table of Cython LAPACK functions, called
through ctypes: a ctypes call releases the GIL, so each GPTQ worker's factorization runs on a core
of its own. (scipy's own Python wrappers hold the GIL.) The BLAS behind them should run on one
thread meanwhile (`one_blas_thread`): the workers already fill the cores, and a BLAS pool per call
would make two factorizations wait on each other.

On one core of an AMD EPYC (Zen 5; torch's MKL, scipy's OpenBLAS), 1,536 columns: 115 ms for the
three torch calls, 35 ms for these two (`python benchmarks/gptq_linalg.py`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

_INT = ctypes.POINTER(ctypes.c_int)


@cache
def _routines() -> tuple[Any, Any]:
    """(spotrf, strtri) as ctypes functions over scipy's Cython LAPACK (32-bit integers, Fortran order)."""
    from numba.extending import get_cython_function_address

    potrf = ctypes.CFUNCTYPE(None, ctypes.c_char_p, _INT, ctypes.c_void_p, _INT, _INT)
    trtri = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, _INT, ctypes.c_void_p, _INT, _INT)
    table = "scipy.linalg.cython_lapack"
    return potrf(get_cython_function_address(table, "spotrf")), trtri(get_cython_function_address(table, "strtri"))


def inverse_factor(hessian: npt.NDArray[np.float32]) -> npt.NDArray[np.float32] | None:
    """U, upper triangular with H^-1 = U^T U, float32 C-contiguous; None when H is not positive definite.

    `hessian` is symmetric float32 [n, n] and is left as it was.
    """
    return factor_reversed(np.array(hessian[::-1, ::-1], dtype=np.float32, order="C"))


def factor_reversed(reversed_hessian: npt.NDArray[np.float32]) -> npt.NDArray[np.float32] | None:
    """`inverse_factor` of H given J H J (H with its rows and columns in reverse order), C-contiguous
    float32, which LAPACK overwrites: a caller that permutes H anyway builds it in the same pass, and
    a wide Hessian (8,960 columns: 321 MB) is not copied again."""
    import torch

    n = reversed_hessian.shape[0]
    if n == 0:
        return np.zeros((0, 0), np.float32)
    if n >= 2**31:
        raise ValueError(f"a Hessian of {n:,} columns is past LAPACK's 32-bit sizes")
    if reversed_hessian.dtype != np.float32 or not reversed_hessian.flags.c_contiguous:
        raise ValueError("factor_reversed takes a C-contiguous float32 matrix")
    potrf, trtri = _routines()
    # C order seen as Fortran order is the transpose, which for a symmetric matrix is itself. Fortran's
    # upper triangle is C's lower one: "U" factors F = J H J as R^T R with R^T = L in C's lower triangle,
    # and inverts R there in place, leaving (R^-1)^T = L^-1.
    size, info = ctypes.c_int(n), ctypes.c_int(0)
    potrf(b"U", ctypes.byref(size), reversed_hessian.ctypes.data, ctypes.byref(size), ctypes.byref(info))
    if info.value != 0:
        return None
    trtri(b"U", b"N", ctypes.byref(size), reversed_hessian.ctypes.data, ctypes.byref(size), ctypes.byref(info))
    if info.value != 0:
        return None
    torch.from_numpy(reversed_hessian).tril_()  # in place: L^-1 alone
    factor: npt.NDArray[np.float32] = np.ascontiguousarray(reversed_hessian[::-1, ::-1])  # U = J L^-1 J
    if not np.isfinite(factor.sum(dtype=np.float64)):  # NaN in, NaN out: LAPACK does not report it
        return None
    return factor


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Every BLAS loaded in the process (numpy's, and scipy's behind `inverse_factor`) on one thread for the
    duration."""
    from threadpoolctl import threadpool_limits

    _routines()  # scipy's LAPACK loaded first: a limit reaches only the libraries already loaded
    with threadpool_limits(limits=1, user_api="blas"):
        yield
