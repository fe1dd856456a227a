"""FP8_DYNAMIC and FP8_BLOCK: E4M3 weights with dynamic FP8 activations, compressed-tensors `float-quantized`.

FP8_DYNAMIC scales each output channel; FP8_BLOCK each 128x128 block (DeepSeek-V3 style), with
activations quantized per group of 128 at run time. Weights whose sides are not multiples of 128
get partial edge blocks (`[ceil(out/128), ceil(in/128)]` scales), as compressed-tensors' zero
padding gives them. Neither needs calibration data: the activation scales are computed at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from weightsmith.formats import compressed_tensors as ct
from weightsmith.quant import eightbit
from weightsmith.schemes.base import Scheme, register
from weightsmith.schemes.eightbit import EightBit, dynamic_activations, refuse_options

BLOCK = 128


@register
@dataclass(frozen=True)
class Fp8Dynamic(EightBit):
    NAMES: ClassVar[tuple[str, ...]] = ("fp8-dynamic",)
    FORMAT: ClassVar[str] = ct.FLOAT_QUANTIZED
    KIND: ClassVar[str] = eightbit.FLOAT

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        refuse_options(name, group_size, scale_search)
        return cls(name, 0)

    def weight_args(self) -> dict:
        return ct.weight_args(8, True, None, type_=eightbit.FLOAT, strategy="channel")

    def input_args(self) -> dict:
        return dynamic_activations(eightbit.FLOAT, "token")


@register
@dataclass(frozen=True)
class Fp8Block(Fp8Dynamic):
    NAMES: ClassVar[tuple[str, ...]] = ("fp8-block",)
    ROW_MULTIPLE: ClassVar[int] = BLOCK

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        refuse_options(name, group_size, scale_search)
        return cls(name, BLOCK)

    def weight_args(self) -> dict:
        args = ct.weight_args(8, True, None, type_=eightbit.FLOAT, strategy="block")
        return dict(args, block_structure=[BLOCK, BLOCK])

    def input_args(self) -> dict:
        return dynamic_activations(eightbit.FLOAT, "group", BLOCK)
