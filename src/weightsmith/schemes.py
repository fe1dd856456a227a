"""The quantization schemes a user can ask for, and what each writes per quantized Linear."""

from __future__ import annotations

from dataclasses import dataclass

from weightsmith import names
from weightsmith.errors import WeightsmithError
from weightsmith.formats import compressed_tensors as ct
from weightsmith.quant import int4, int4_search
from weightsmith.safetensors.writer import TensorSpec


@dataclass(frozen=True)
class Scheme:
    """A weight-only scheme: int4 group-wise, symmetric or with zero points."""

    name: str
    symmetric: bool
    group_size: int
    num_bits: int = 4
    #: None (plain RTN), "mse" (our clipping search) or "memoryless_mse" (llm-compressor's, exactly).
    scale_search: str | None = None

    @property
    def config_group_name(self) -> str:
        return "W4A16" if self.symmetric else "W4A16_ASYM"

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        """Why a 2-D weight of this shape cannot take the scheme, or None."""
        return int4.supports(shape[1], self.group_size)

    def outputs(self, module: str, shape: tuple[int, int], weight_dtype: str) -> list[TensorSpec]:
        """The tensors written in place of `module.weight`."""
        out, inp = shape
        groups = inp // self.group_size
        specs = [
            TensorSpec(f"{module}.{names.WEIGHT_PACKED}", "I32", (out, inp // int4.PACK)),
            TensorSpec(f"{module}.{names.WEIGHT_SCALE}", weight_dtype, (out, groups)),
            TensorSpec(f"{module}.{names.WEIGHT_SHAPE}", "I64", (2,)),
        ]
        if not self.symmetric:
            specs.append(TensorSpec(f"{module}.{names.WEIGHT_ZERO_POINT}", "I32", (-(-out // int4.PACK), groups)))
        return specs

    def quantization_config(self, ignore: list[str]) -> dict:
        args = ct.weight_args(self.num_bits, self.symmetric, self.group_size)
        if self.scale_search == "memoryless_mse":
            args["observer"] = "memoryless_mse"
            args["observer_kwargs"] = dict(int4_search.MEMORYLESS)
        return ct.quantization_config(self.config_group_name, ct.PACK_QUANTIZED, args, ignore)


SCHEME_NAMES = ("w4a16", "w4a16-asym")


def make_scheme(name: str, group_size: int = 128, scale_search: str | None = None) -> Scheme:
    """The scheme a user named, or a one-line usage error."""
    if name not in SCHEME_NAMES:
        raise WeightsmithError(f"unknown scheme {name!r} (choose from {', '.join(SCHEME_NAMES)})", code="usage")
    if group_size <= 0 or group_size % int4.PACK:
        raise WeightsmithError(f"--group-size {group_size} must be a positive multiple of {int4.PACK}", code="usage")
    if scale_search is not None and scale_search not in int4_search.SEARCHES:
        raise WeightsmithError(
            f"unknown scale search {scale_search!r} (choose from {', '.join(int4_search.SEARCHES)})", code="usage"
        )
    symmetric = name == "w4a16"
    if scale_search is not None and not symmetric:
        raise WeightsmithError(f"--scale-search works with the symmetric scheme w4a16, not {name}", code="usage")
    return Scheme(name, symmetric=symmetric, group_size=group_size, scale_search=scale_search)
