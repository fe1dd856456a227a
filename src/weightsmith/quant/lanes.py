"""Sums in one written order that still vectorise: the same bits from any CPU and any compile.

A float sum `s += x[i]` vectorises only if the compiler may reorder it (fastmath "reassoc"), and then
the order is the compiler's: it follows the vector width (4 float32 lanes with SSE2 or NEON, 16 with
AVX-512) and the unrolling chosen, which differed even between a kernel compiled fresh and the same
kernel loaded from numba's cache. Where such a sum decides a scale (the Sinkhorn spreads, a search's
candidate errors), the bytes written then depended on the machine.

So no kernel here uses fastmath, and every sum is written in one order that the compiler keeps and
still vectorises, in one of two ways:

- a lane per candidate (the clipping searches' scales, qkx2's inverse scales): lane k sums the whole
  group in order for candidate k, and one vector holds many candidates;
- `LANES` partial sums of one sum (the Sinkhorn rows, hqq's rounds, qkx2's moments and scores):
  value i adds into lane i % LANES in order, and `lane_total` adds the lanes pairwise.

Adds into different lanes are independent, so the compiler vectorises them as written, whatever its
vector width, and each result is one defined float32 expression (tests/quant/test_kernel_determinism.py
compiles them for x86-64's baseline and compares the bits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightsmith.quant.floatbits import array_helper

if TYPE_CHECKING:
    import numpy as np

#: Partial sums per sum: a multiple of every vector width (AVX-512's 16 float32 lanes at most);
#: `lane_total` is written for this many.
LANES = 16


@array_helper
def lane_total(lanes: np.ndarray) -> np.float32:
    """The sum of the `LANES` partial sums in `lanes` (float32 [16]), added pairwise: lane k + lane
    k + 8, then those + 4 apart, + 2, + 1. Written out, so that the adds stay in registers."""
    b0, b1, b2, b3 = lanes[0] + lanes[8], lanes[1] + lanes[9], lanes[2] + lanes[10], lanes[3] + lanes[11]
    b4, b5, b6, b7 = lanes[4] + lanes[12], lanes[5] + lanes[13], lanes[6] + lanes[14], lanes[7] + lanes[15]
    c0, c1, c2, c3 = b0 + b4, b1 + b5, b2 + b6, b3 + b7
    total: np.float32 = (c0 + c2) + (c1 + c3)
    return total
