"""`hqq`: half-quadratic quantization of each int4 group's scale and zero point (quant/int4_hqq.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightsmith.core.lazy import lazy_module
from weightsmith.searches.base import ParameterSearch, register
from weightsmith.searches.clip import INT4

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import int4_hqq
else:  # imported at first use: listing the schemes must not start numba
    int4_hqq = lazy_module("weightsmith.quant.int4_hqq")


@register
class Hqq(ParameterSearch):
    NAME = "hqq"
    SCHEMES = INT4
    HELP = "half-quadratic quantization: each group's integer zero point and scale for the lowest lp error"
    CARD = (
        "each group's integer zero point and scale are solved by half-quadratic quantization (HQQ) "
        "for the lowest lp error"
    )

    def parameters(
        self, x: np.ndarray, mode: int, group: int, symmetric: bool, scale: np.ndarray, zero_point: np.ndarray
    ) -> int:
        return int4_hqq.search_hqq(x, mode, group, symmetric, scale, zero_point)
