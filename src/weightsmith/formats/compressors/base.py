"""What one on-disk compressed-tensors format is to weightsmith, and the registry of formats by name.

compressed-tensors keeps one registered compressor per `format` a config group declares, with
compress beside decompress; so do we. A `Compressor` owns everything its format means on disk:
the tensors a quantized Linear stores (`layout`: names, dtypes, shapes), how stored values are
packed into them and unpacked again (each format's own `pack`/`unpack`), which declared groups it
reads back (`recognizes`) and the dense weight it reads back (`decompress`). The schemes (schemes/)
say which format they write and quantize with kernels (quant/) that write this format's bytes;
`verify`, `eval` and the engine find a group's format here by its declared name. Adding a format
is one module in this package, found without editing any list.

This package imports no numba: `inspect` and `verify` read layouts without starting the kernels;
`decompress` imports the dequantization arithmetic of quant/ when first asked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.formats.layouts import FLOAT_SCALE, Args, Layout, input_scale
from weightsmith.io import names

if TYPE_CHECKING:
    import numpy as np


class Compressor(ABC):
    """One compressed-tensors format. Not instantiated: subclasses register with `@register`."""

    #: The `format` name a config group declares (formats/compressed_tensors.py).
    NAME: ClassVar[str]

    @classmethod
    @abstractmethod
    def layout(cls, args: Args, inputs: str | None = None) -> Layout | None:
        """The tensors a module of a group with `args` stores (`inputs`: the activation scale
        `layouts.input_scale` gave), or None for an argument combination the format does not describe."""

    @classmethod
    @abstractmethod
    def recognizes(cls, weights: dict[str, Any]) -> bool:
        """Whether `decompress` reads a group of this format declaring this `weights` block."""

    @classmethod
    @abstractmethod
    def decompress(cls, weights: dict[str, Any], params: dict[str, np.ndarray]) -> np.ndarray:
        """The dense weight a module stands for, from its on-disk parameters (as compressed-tensors gives it)."""


def input_dtype(inputs: str | None) -> str | None:
    """The dtype of the activation scale `inputs`: a global scale is float32 as every `*_global_scale`;
    a per-tensor one a float scale of the weight's dtype."""
    return "F32" if inputs == names.INPUT_GLOBAL_SCALE else FLOAT_SCALE


#: Format name -> the class that owns it, in registration order.
REGISTRY: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator: make a format readable and writable by its declared name."""
    if cls.NAME in REGISTRY:
        raise ValueError(f"format {cls.NAME!r} registered twice")
    REGISTRY[cls.NAME] = cls
    return cls


def layout_of(fmt: str | None, args: Args, inputs: str | None = None) -> Layout | None:
    """The layout of a compressed-tensors config group (`inputs`: what `layouts.input_scale` gave), or
    None for a format or argument combination no registered format describes."""
    cls = REGISTRY.get(fmt or "")
    return None if cls is None else cls.layout(args, inputs)


def of_group(fmt: str | None, weights: dict[str, Any], input_activations: object = None) -> Layout | None:
    """The layout of a config group as JSON gives it (its `format`, `weights` and `input_activations`)."""
    return layout_of(fmt, Args.of(weights), input_scale(input_activations))


def decompress(fmt: str, weights: dict[str, Any], params: dict[str, np.ndarray]) -> np.ndarray:
    """The dense weight of a quantized module, read back by its group's format.

    NotImplementedError: no registered format reads this format with these declared arguments.
    """
    cls = REGISTRY.get(fmt)
    if cls is None or not cls.recognizes(weights):
        raise NotImplementedError(
            f"dequantizing {fmt} with {weights.get('num_bits')}-bit {weights.get('strategy')} weights"
        )
    return cls.decompress(weights, params)
