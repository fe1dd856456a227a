"""The range-clipping searches of int4 groups (kernels: quant/int4_search.py, docs/scale-search-study.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightsmith.core.lazy import lazy_module
from weightsmith.searches.base import ClipSearch, register

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import int4_search
else:  # imported at first use: listing the schemes must not start numba
    int4_search = lazy_module("weightsmith.quant.int4_search")

#: The int4 schemes' names: their groups share one grid and one kernel.
INT4 = ("w4a16", "w4a16-asym", "w4afp8")


@register
class Wmse(ClipSearch):
    NAME = "wmse"
    SCHEMES = INT4
    HELP = (
        "clipping or widening by magnitude-weighted error: lower KL than RTN on two real models, "
        "docs/scale-search-study.md"
    )
    CARD = "each group's range is clipped to the value that lowers its magnitude-weighted squared error"

    def fill(self, x: np.ndarray, mode: int, group: int, symmetric: bool, shrink: np.ndarray) -> int:
        return int4_search.search_mse(x, mode, group, shrink, symmetric, int4_search.MAGNITUDE)


@register
class Mse(ClipSearch):
    NAME = "mse"
    SCHEMES = (*INT4, "nvfp4a16")  # NVFP4's kernel runs its own mse search over each group's FP8 scale
    HELP = "clipping by the group's |error|^2.5, unweighted"
    CARD = "each group's range is clipped to the value that lowers its squared error"

    def fill(self, x: np.ndarray, mode: int, group: int, symmetric: bool, shrink: np.ndarray) -> int:
        return int4_search.search_mse(x, mode, group, shrink, symmetric, int4_search.POWER25)


@register
class Noclip(ClipSearch):
    NAME = "noclip"
    SCHEMES = INT4
    HELP = "symmetric: largest weight on the grid's end"
    CARD = "each group's scale puts its largest weight on the end of the int4 grid"
    ASYMMETRIC_REFUSAL = (
        "--scale-search noclip sets a symmetric scale; {scheme}'s range already ends on the grid's ends"
    )

    def fill(self, x: np.ndarray, mode: int, group: int, symmetric: bool, shrink: np.ndarray) -> int:
        return int4_search.search_noclip(x, mode, group, shrink)
