"""FP8: E4M3 weights, compressed-tensors `float-quantized`: FP8_DYNAMIC, FP8_BLOCK and static FP8.

FP8_DYNAMIC scales each output channel; FP8_BLOCK each 128x128 block (DeepSeek-V3 style), with
activations quantized per group of 128 at run time. Weights whose sides are not multiples of 128
get partial edge blocks (`[ceil(out/128), ceil(in/128)]` scales), as compressed-tensors' zero
padding gives them. Neither needs calibration data: the activation scales are computed at run time.
Static FP8 (the FP8 preset) stores one activation scale per module, measured on calibration data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.quant import FLOAT
from weightsmith.safetensors.dtypes import DTYPES
from weightsmith.schemes.base import TENSOR, Alloc, Scheme, Write, fresh, register
from weightsmith.schemes.eightbit import EightBit, dynamic_activations, refuse_options

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import eightbit, int4, nvfp4
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    eightbit = lazy_module("weightsmith.quant.eightbit")
    int4 = lazy_module("weightsmith.quant.int4")
    nvfp4 = lazy_module("weightsmith.quant.nvfp4")

BLOCK = 128


@register
@dataclass(frozen=True)
class Fp8Dynamic(EightBit):
    NAMES: ClassVar[tuple[str, ...]] = ("fp8-dynamic",)
    FORMAT: ClassVar[str] = ct.FLOAT_QUANTIZED
    KIND: ClassVar[str] = FLOAT

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        refuse_options(name, group_size, scale_search)
        return cls(name, 0)

    def weight_args(self) -> dict[str, Any]:
        return ct.weight_args(8, True, None, type_=FLOAT, strategy="channel")

    def input_args(self) -> dict[str, Any]:
        return dynamic_activations(FLOAT, "token")


@register
@dataclass(frozen=True)
class Fp8Block(Fp8Dynamic):
    NAMES: ClassVar[tuple[str, ...]] = ("fp8-block",)
    ROW_MULTIPLE: ClassVar[int] = BLOCK

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        refuse_options(name, group_size, scale_search)
        return cls(name, BLOCK)

    def weight_args(self) -> dict[str, Any]:
        args = ct.weight_args(8, True, None, type_=FLOAT, strategy="block")
        return dict(args, block_structure=[BLOCK, BLOCK])

    def input_args(self) -> dict[str, Any]:
        return dynamic_activations(FLOAT, "group", BLOCK)


@register
@dataclass(frozen=True)
class Fp8Static(EightBit):
    """FP8 (W8A8, static): E4M3 weights with one scale per tensor, and one static per-tensor `input_scale`.

    compressed-tensors' FP8 preset, as llm-compressor's `oneshot` makes it: the weight scale is the
    whole weight's absolute maximum / 448 (a first pass over the tensor), the input scale the
    largest |x| the module's input reached on calibration data / 448, both in the weight dtype.
    """

    NAMES: ClassVar[tuple[str, ...]] = ("fp8",)
    FORMAT: ClassVar[str] = ct.FLOAT_QUANTIZED
    KIND: ClassVar[str] = FLOAT
    NEEDS_CALIBRATION: ClassVar[bool] = True

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        refuse_options(name, group_size, scale_search)
        return cls(name, 0)

    @property
    def first_pass(self) -> str | None:
        return TENSOR

    def describe(self) -> str:
        return f"{self.config_group_name} per tensor, static input scale"

    def weights_words(self) -> str:
        return (
            f"{self.stored_words()}; activations quantized to FP8 (E4M3) with one static scale per tensor "
            "measured on calibration data"
        )

    def weight_args(self) -> dict[str, Any]:
        # as llm-compressor's oneshot writes the FP8 preset's weights (its memoryless observer named)
        return dict(_per_tensor(), observer="memoryless_minmax")

    def input_args(self) -> dict[str, Any]:
        return dict(_per_tensor(), observer="static_minmax")

    def input_params(self, input_absmax: float, weight_dtype: str) -> list[tuple[str, np.ndarray]]:
        dtype = DTYPES[weight_dtype].element
        return [(names.INPUT_SCALE, np.array([eightbit.static_scale(input_absmax, dtype)], dtype))]

    def observe(self, x: np.ndarray, r0: int, shape: tuple[int, int], state: Any) -> tuple[Any, int]:
        """The largest magnitude so far (and the weight's dtype, which the scale is computed in)."""
        block_max, bad = nvfp4.amax_rows(int4.kernel_input(x), int4.mode_of(x.dtype))
        return (max(state[0], block_max) if state else block_max, x.dtype), bad

    def conclude(self, states: dict[str, Any]) -> dict[str, Any]:
        return {module: eightbit.static_scale(amax, dtype) for module, (amax, dtype) in states.items()}

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        q = eightbit.fp8_rows_with_scale(x, tensor_param, alloc("q", x.shape, np.uint8))
        writes: list[Write] = [(names.WEIGHT, q, r0 * shape[1])]
        if r0 == 0:
            writes.append((names.WEIGHT_SCALE, np.array([tensor_param], x.dtype), 0))
        return writes, -1


def _per_tensor() -> dict[str, Any]:
    return ct.weight_args(8, True, None, type_=FLOAT, strategy="tensor")
