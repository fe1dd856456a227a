"""`qkx2`: llama.cpp's weighted k-quant search of each int4 group's scale and offset (quant/int4_qkx2.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightsmith.core.lazy import lazy_module
from weightsmith.searches.base import ParameterSearch, register
from weightsmith.searches.clip import INT4

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import int4_qkx2
else:  # imported at first use: listing the schemes must not start numba
    int4_qkx2 = lazy_module("weightsmith.quant.int4_qkx2")


@register
class Qkx2(ParameterSearch):
    NAME = "qkx2"
    SCHEMES = INT4
    HELP = "llama.cpp's k-quant weighted scale and offset search, integer zero points"
    CARD = "each group's scale and integer zero point are fitted by llama.cpp's weighted k-quant search"

    def parameters(
        self, x: np.ndarray, mode: int, group: int, symmetric: bool, scale: np.ndarray, zero_point: np.ndarray
    ) -> int:
        return int4_qkx2.search_qkx2(x, mode, group, symmetric, scale, zero_point)
