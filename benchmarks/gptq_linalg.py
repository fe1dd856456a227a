"""GPTQ's arithmetic, ours against torch's plain route, on SmolLM2-135M's shapes (2,048 calibration tokens).

Each row times one product both ways in this process (median of `--repeat`), prints the ratio, and
checks that the two agree to float32 rounding:
- a Linear over the tokens (gate_proj, 576 -> 1,536): `torch.nn.functional.linear` (MKL) against
  `engine.matmul.linear` (oneDNN), on two torch threads as the layer runs;
- a Hessian's X^T X (down_proj's input, 1,536 columns): `X.T @ X` against `engine.matmul.gram`, and
  one full oneDNN product against `gram`'s upper triangle in bands;
- the inverse-Hessian factor (1,536 columns): llm-compressor's three torch calls (`cholesky`,
  `cholesky_inverse`, `cholesky(upper=True)`) against `engine.lapack.inverse_factor`, one thread;
- down_proj's block products (every 128-column block's errors times the factor's block row):
  `matmul` against `engine.matmul.linear`, one thread, as a GPTQ worker runs them.

    python benchmarks/gptq_linalg.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

TOKENS, HIDDEN, INTERMEDIATE, BLOCK = 2048, 576, 1536, 128


def median_ms(f: Callable[[], Any], repeat: int) -> float:
    f()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        f()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def row(label: str, theirs: float, ours: float, error: float) -> None:
    ratio = theirs / ours
    print(f"{label:<52} torch {theirs:6.1f} ms  ours {ours:6.1f} ms  {ratio:4.2f}x  (max rel. diff {error:.1e})")


def relative(a: Any, b: Any) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    n = ap.parse_args().repeat

    import numpy as np
    import torch

    from weightsmith.engine import heap, lapack, matmul

    heap.keep_freed_memory()  # as the engine runs: allocations reuse freed memory
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, TOKENS // 8, HIDDEN, generator=g)
    w = torch.randn(INTERMEDIATE, HIDDEN, generator=g) / HIDDEN**0.5
    torch.set_num_threads(2)
    row("Linear 576 -> 1,536 over 2,048 tokens, 2 threads",
        median_ms(lambda: torch.nn.functional.linear(x, w), n), median_ms(lambda: matmul.linear(x, w), n),
        relative(matmul.linear(x, w), torch.nn.functional.linear(x, w)))  # fmt: skip
    acts = torch.randn(TOKENS, INTERMEDIATE, generator=g)
    row("X^T X, 2,048 x 1,536, 2 threads",
        median_ms(lambda: acts.t() @ acts, n), median_ms(lambda: matmul.gram(acts), n),
        relative(matmul.gram(acts), acts.t() @ acts))  # fmt: skip

    def one_product() -> Any:
        columns = acts.t().contiguous()
        return matmul.linear(columns, columns)

    row("  the same in one oneDNN product, against gram's bands",
        median_ms(one_product, n), median_ms(lambda: matmul.gram(acts), n),
        relative(matmul.gram(acts), one_product()))  # fmt: skip

    torch.set_num_threads(1)
    hessian = 2 * matmul.gram(acts) / TOKENS
    hessian.diagonal().add_(0.01 * hessian.diagonal().mean())

    def three_calls() -> Any:
        factor, _ = torch.linalg.cholesky_ex(hessian)
        return torch.linalg.cholesky(torch.cholesky_inverse(factor), upper=True)

    with lapack.one_blas_thread():
        ours = lapack.inverse_factor(hessian.numpy())
        assert ours is not None
        row("inverse-Hessian factor, 1,536 columns, 1 thread",
            median_ms(three_calls, n), median_ms(lambda: lapack.inverse_factor(hessian.numpy()), n),
            relative(torch.from_numpy(ours), three_calls()))  # fmt: skip
    factor = torch.from_numpy(ours)
    errors = torch.from_numpy(np.random.default_rng(0).standard_normal((BLOCK, HIDDEN), dtype=np.float32))

    def products(product: Callable[[Any, Any], Any]) -> Callable[[], None]:
        def run() -> None:
            for i2 in range(BLOCK, INTERMEDIATE, BLOCK):
                product(factor[i2 - BLOCK : i2, i2:].t(), errors)

        return run

    first = factor[:BLOCK, BLOCK:].t()
    row("down_proj's block products (576 rows), 1 thread",
        median_ms(products(lambda a, e: a.matmul(e)), n), median_ms(products(lambda a, e: matmul.linear(a, e.t())), n),
        relative(matmul.linear(first, errors.t()), first @ errors))  # fmt: skip
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")


if __name__ == "__main__":
    main()
