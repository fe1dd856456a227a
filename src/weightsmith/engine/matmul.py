"""Float32 matrix products through oneDNN, the CPU kernel library inside torch, where it works.

torch sends a float32 `Linear` and `mm` on CPU to MKL's sgemm. MKL picks its code path by CPU
vendor: on AMD it runs AVX2 kernels even where the CPU has AVX-512. oneDNN, also inside torch,
picks by instruction set. On a 2-core AMD EPYC (Zen 5), SmolLM2-135M's gate_proj over 2,048
tokens (576 -> 1,536) takes 22.8 ms through `torch.nn.functional.linear` and 10.4 ms through
oneDNN, and down_proj's X^T X (2,048 x 1,536) 57.7 ms against 26.5 ms for `gram`
(`python benchmarks/gptq_linalg.py`). The arithmetic is float32 throughout
(`torch.backends.mkldnn.matmul.fp32_precision` stays "none": no bf16 or tf32 passes), summed in
another order, so results agree with MKL's to float32 rounding, not bit for bit.

The op is `torch.ops.mkldnn._linear_pointwise`, which torch's own compiler emits for a CPU
Linear. It is not public API, so it is used only once a probe shows that it exists and agrees with
`torch.nn.functional.linear`; otherwise every product goes through torch as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from itertools import pairwise
from typing import Any


@cache
def _onednn() -> Any:
    """The oneDNN linear op, or None where this torch has none or it disagrees with torch's."""
    import torch

    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None:
        return None
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 5, 64, generator=g), torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    try:
        found = op(x, w, b, "none", [], "")
    except RuntimeError:  # a torch built without oneDNN
        return None
    expected = torch.nn.functional.linear(x, w, b)
    if found.shape != expected.shape or not torch.allclose(found, expected, rtol=1e-5, atol=1e-5):
        return None
    return op


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    """`x @ weight.T + bias` for float32 CPU tensors (any leading dimensions), as `torch.nn.functional.linear`."""
    import torch

    op = _onednn()
    if op is None or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu":
        return torch.nn.functional.linear(x, weight, bias)
    return op(x, weight, bias, "none", [], "")


#: `add_gram` multiplies out its upper triangle in bands of at least this many rows (the fewer, wider
#: bands the better a product runs), and of at most `PRODUCT_BYTES` each: a larger temporary is a fresh
#: mapping from the kernel each time (glibc's mmap threshold tops out at 32 MiB), every page faulted in.
GRAM_BAND = 384
PRODUCT_BYTES = 16 * 2**20


def add_gram(total: Any, rows: Any, alpha: float = 1.0) -> None:
    """`total += alpha * rows.T @ rows`, upper triangle only, for a float32 CPU matrix `rows` [n, d].

    The product is symmetric, so only the upper triangle is multiplied out, a band of rows at a time
    (each band against the columns from its own on): with 4 bands, 10/16 of the full product's
    arithmetic (`python benchmarks/gptq_linalg.py` times both). `symmetrize` fills the lower
    triangle once every batch is in.
    """
    columns = rows.t().contiguous()
    d = columns.shape[0]
    bands = max(1, min(8, d // GRAM_BAND), -(-d * d * columns.element_size() // PRODUCT_BYTES))
    edges = [d * b // bands for b in range(bands + 1)]
    for b0, b1 in pairwise(edges):
        total[b0:b1, b0:].add_(linear(columns[b0:b1], columns[b0:]), alpha=alpha)


def symmetrize(upper: Any) -> Any:
    """The symmetric matrix whose upper triangle (diagonal included) `upper` holds, in place."""
    d = upper.shape[0]
    step = max(1, PRODUCT_BYTES // max(1, d * upper.element_size()))
    for r0 in range(0, d, step):  # row bands of the lower triangle from the columns above them
        r1 = min(r0 + step, d)
        upper[r0:r1, :r0] = upper[:r0, r0:r1].t()
        block = upper[r0:r1, r0:r1]
        block.copy_(block.triu() + block.triu(1).t())
    return upper


def gram(rows: Any) -> Any:
    """`rows.T @ rows` for a float32 CPU matrix [n, d]: [d, d], exactly symmetric."""
    import torch

    total = torch.zeros((rows.shape[1], rows.shape[1]), dtype=torch.float32)
    add_gram(total, rows)
    return symmetrize(total)


@contextmanager
def onednn_linears(module: Any) -> Iterator[None]:
    """Every `torch.nn.Linear` inside `module` multiplying through `linear` for the duration.

    Only `forward` is replaced, on the instances: hooks (the Hessians' pre-hooks) run as before.
    """
    import torch

    # a Linear whose instance already has a forward of its own (a hook library's) is left to it
    linears: list[Any] = [m for m in module.modules() if isinstance(m, torch.nn.Linear) and "forward" not in vars(m)]
    if _onednn() is None:
        yield
        return
    for m in linears:
        m.forward = lambda x, _m=m: linear(x, _m.weight, _m.bias)
    try:
        yield
    finally:
        for m in linears:
            del m.forward
