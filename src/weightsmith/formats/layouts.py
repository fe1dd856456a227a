"""The description of a format's tensors: what a quantized Linear stores in place of `weight`.

A `Layout` gives, for a module whose logical weight is [out, in], every tensor it stores: name,
safetensors dtype and shape. Each compressed-tensors format builds its layouts from a config
group's `weights` QuantizationArgs (`Args`) and whether its activations keep a static scale
(`input_scale`), in its own module of formats/compressors/ (`compressors.of_group` finds it by the
group's `format`); ModelOpt's and the HF fp8 format's are fixed by their own configs
(formats/modelopt.py, formats/hf_fp8.py). The writer (`Scheme.outputs`), `verify`
(audit/check_quant.py), `eval` (formats/declaration.py) and the card (`Scheme.stored_words`) all read
the layout, so what is written, what is checked and what is said about it cannot drift apart.

Facts from compressed-tensors 0.19: `quantization/lifecycle/initialize.py` (scale shapes per
strategy, scales in the weight's float dtype, a float32 `*_global_scale` for `tensor_group`);
vLLM's loaders for ModelOpt and HF fp8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from weightsmith.core.terminal import short_repr
from weightsmith.io import names
from weightsmith.quant.fp8 import Block

#: `Tensor.dtype` of a float scale: stored in the weight's own float dtype, unless the config group
#: declares a `scale_dtype` (compressed-tensors keeps a scale in the dtype of what it observed).
FLOAT_SCALE = None


def parse_block(value: object) -> Block:
    """A declared block size (`weight_block_size`, `block_structure`): [rows, cols] of positive integers.

    Raises ValueError saying what is wrong, for the caller to name the file and key.
    """
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(v) is int and v > 0 for v in value)  # bool is not a block size
    ):
        raise ValueError(f"is {short_repr(value)}, not a list of two positive integers (rows, cols)")
    return value[0], value[1]


@dataclass(frozen=True)
class Tensor:
    """One stored tensor: its dtype (`FLOAT_SCALE`: a float of the weight's dtype) and shape."""

    dtype: str | None
    shape: tuple[int, ...]
    #: One value (a per-tensor scale): written [1], accepted in any shape that holds one element.
    scalar: bool = False


def _int(value: object) -> int | None:
    return value if type(value) is int else None  # exact: true is not an integer


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _one(dtype: str | None) -> Tensor:
    return Tensor(dtype, (1,), scalar=True)


@dataclass(frozen=True)
class Args:
    """The `QuantizationArgs` fields a layout depends on (None where the config leaves one unset)."""

    num_bits: int | None = None
    type: str | None = None
    strategy: str | None = None
    group_size: int | None = None
    #: `block_structure`: rows x columns one scale covers under the `block` strategy.
    block: tuple[int, int] | None = None
    symmetric: bool = True
    scale_dtype: str | None = None

    @classmethod
    def of(cls, weights: dict[str, Any]) -> Args:
        """From a config group's `weights` block as JSON gives it; a value of the wrong type reads as unset."""
        try:
            block: Block | None = parse_block(weights.get("block_structure"))
        except ValueError:
            block = None
        return cls(
            num_bits=_int(weights.get("num_bits")),
            type=_str(weights.get("type")),
            strategy=_str(weights.get("strategy")),
            group_size=_int(weights.get("group_size")),
            block=block,
            symmetric=weights.get("symmetric") is not False,
            scale_dtype=_str(weights.get("scale_dtype")),
        )

    @property
    def scale_block(self) -> tuple[int, int | None] | None:
        """Rows x columns one scale covers (columns None: the whole row), or None for one scale per tensor."""
        if self.block is not None:
            return self.block
        if self.strategy == "channel":
            return 1, None
        if self.strategy in ("group", "tensor_group") and self.group_size:
            return 1, self.group_size
        return None


@dataclass(frozen=True)
class Layout:
    """The tensors one quantized Linear stores, as a rule over its logical shape [out, in]."""

    args: Args
    #: The parameter holding the codes (`weight_packed` or `weight`) and its dtype.
    codes: str
    codes_dtype: str
    #: Bits of one code and of one stored element: several codes share an element when packed.
    code_bits: int = 8
    word_bits: int = 8
    scale: str = names.WEIGHT_SCALE
    scale_dtype: str | None = FLOAT_SCALE
    #: Rows x columns per scale (columns None: the whole row); None: one scale for the tensor.
    scale_block: tuple[int, int | None] | None = None
    #: pack-quantized: the logical shape stored as int64 [2], since words round the columns up.
    weight_shape: bool = False
    #: Asymmetric pack-quantized: int32 zero points, packed along the output dimension.
    zero_point: bool = False
    #: A float32 scale for the whole weight, beside the group scales (NVFP4).
    global_scale: str | None = None
    #: The activations' calibrated scale, when activations keep one, and its dtype.
    input_scale: str | None = None
    input_dtype: str | None = "F32"
    #: `tensors` by (out, in_features, inputs), filled as asked.
    _shapes: dict[tuple[int, int, bool], dict[str, Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def tensors(self, out: int, in_features: int, inputs: bool = True) -> dict[str, Tensor]:
        """Parameter name -> tensor, for a weight [out, in_features]; `inputs`: with the activation scale.

        A new dict each call (callers may change it) of tensors computed once per shape: the
        modules of a MoE share a few shapes, and `verify` asks for each of 100k modules.
        """
        key = (out, in_features, inputs)
        found = self._shapes.get(key)
        if found is None:
            found = self._shapes[key] = self._tensors(out, in_features, inputs)
        return dict(found)

    def _tensors(self, out: int, in_features: int, inputs: bool) -> dict[str, Tensor]:
        found = {self.codes: Tensor(self.codes_dtype, (out, math.ceil(in_features * self.code_bits / self.word_bits)))}
        if self.scale_block is None:
            scale = _one(self.scale_dtype)
        else:
            rows, cols = self.scale_block
            scale = Tensor(self.scale_dtype, (math.ceil(out / rows), math.ceil(in_features / cols) if cols else 1))
        found[self.scale] = scale
        if self.weight_shape:
            found[names.WEIGHT_SHAPE] = Tensor("I64", (2,))
        if self.zero_point:
            rows = math.ceil(out * self.code_bits / self.word_bits)
            found[names.WEIGHT_ZERO_POINT] = _one("I32") if scale.scalar else Tensor("I32", (rows, scale.shape[1]))
        if self.global_scale is not None:
            found[self.global_scale] = _one("F32")
        if inputs and self.input_scale is not None:
            found[self.input_scale] = _one(self.input_dtype)
        return found

    def dtypes(self, inputs: bool = True) -> dict[str, str | None]:
        """Parameter name -> dtype, in the order they are described (no shape needed)."""
        return {name: t.dtype for name, t in self.tensors(0, 0, inputs).items()}

    def in_features(self, columns: int) -> int | None:
        """The inputs `columns` stored columns of codes hold; None where words round them up (`weight_shape`)."""
        return None if self.weight_shape else columns * self.word_bits // self.code_bits

    def words(self) -> str:
        """The stored weights in a reader's words, e.g. `4-bit integer weights, symmetric, one scale per 128 ...`."""
        a = self.args
        kind = {4: "FP4 (E2M1)", 8: "FP8 (E4M3)"}.get(a.num_bits or 0) if a.type == "float" else "integer"
        text = f"{a.num_bits}-bit {kind or 'float'} weights"
        if a.type == "int":
            text += ", symmetric" if a.symmetric else ", asymmetric (with a zero point)"
        scale = {"F8_E4M3": "FP8 (E4M3) scale", "U8": "power-of-two (E8M0) scale", "F32": "float32 scale"}
        text += f", one {scale.get(self.scale_dtype or '', 'scale')} per "
        if self.scale_block is None:
            text += "tensor"
        else:
            rows, cols = self.scale_block
            text += f"{rows}x{cols} block" if rows > 1 else f"{cols} input columns" if cols else "output channel"
        if self.global_scale is not None:
            text += " and a float32 global scale per fused layer"
        return text


def input_scale(input_activations: object) -> str | None:
    """The parameter a config group's activations keep a calibrated scale in, or None (dynamic or absent).

    NVFP4 activations (`tensor_group`) keep a float32 global scale when not fully dynamic (`dynamic`
    false or "local": local scales at run time); any other static activations a per-tensor scale.
    """
    if not isinstance(input_activations, dict):
        return None
    dynamic = input_activations.get("dynamic")
    if input_activations.get("strategy") == "tensor_group":
        return names.INPUT_GLOBAL_SCALE if dynamic is False or dynamic == "local" else None
    return names.INPUT_SCALE if dynamic is False else None
