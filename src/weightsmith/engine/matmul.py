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


#: `gram` computes its upper triangle in bands of at least this many columns.
GRAM_BAND = 384


def gram(rows: Any) -> Any:
    """`rows.T @ rows` for a float32 CPU matrix [n, d]: [d, d], exactly symmetric.

    The product is symmetric, so only the upper triangle is multiplied out, a band of rows at a time
    (each band against the columns from its own on) and mirrored: with 4 bands, 10/16 of the full
    product's arithmetic (1,536 columns of 2,048 tokens through oneDNN: 24.6 ms against 33.1 ms in
    one product).
    """
    import torch

    columns = rows.t().contiguous()
    d = columns.shape[0]
    bands = max(1, min(8, d // GRAM_BAND))
    edges = [d * b // bands for b in range(bands + 1)]
    out = torch.empty((d, d), dtype=columns.dtype)
    for b0, b1 in pairwise(edges):
        out[b0:b1, b0:] = linear(columns[b0:b1], columns[b0:])
    upper = out.triu_()
    return upper.add_(upper.triu(1).t())


@contextmanager
def onednn_linears(module: Any) -> Iterator[None]:
    """Every `torch.nn.Linear` inside `module` multiplying through `linear` for the duration.

    Only `forward` is replaced, on the instances: hooks (the Hessians' pre-hooks) run as before.
    """
    import torch

    linears: list[Any] = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
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
