"""`memoryless_mse`: llm-compressor's symmetric observer of that name, reproduced exactly (quant/int4_search.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from weightsmith.core.lazy import lazy_module
from weightsmith.searches.base import TensorSearch, register
from weightsmith.searches.clip import INT4

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import int4_search
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    int4_search = lazy_module("weightsmith.quant.int4_search")


@register
class MemorylessMse(TensorSearch):
    NAME = "memoryless_mse"
    SCHEMES = INT4
    HELP = "llm-compressor's symmetric observer, exactly"
    CARD = "llm-compressor's memoryless MSE search over each group's range"
    ASYMMETRIC_REFUSAL = (
        "--scale-search memoryless_mse reproduces llm-compressor's symmetric observer; with {scheme} use mse"
    )

    def weight_args(self) -> dict[str, Any]:
        return {"observer": "memoryless_mse", "observer_kwargs": dict(int4_search.MEMORYLESS)}

    def start(self, shape: tuple[int, int], group: int) -> Any:
        rows, cols = shape
        steps = int(int4_search.MEMORYLESS["maxshrink"] * int4_search.MEMORYLESS["grid"])
        return np.zeros((rows, cols // group), np.uint32), np.zeros(steps, np.bool_)

    def observe(self, x: np.ndarray, mode: int, group: int, r0: int, state: Any) -> int:
        masks, improved = state
        return int4_search.memoryless_steps(x, mode, group, masks[r0 : r0 + len(x)], improved)

    def conclude(self, state: Any) -> np.ndarray:
        return int4_search.memoryless_choice(*state)
