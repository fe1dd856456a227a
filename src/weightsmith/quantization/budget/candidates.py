"""What a module may become under a bit budget, and what each choice costs in stored bits.

A candidate is a scheme with its group size (its default scale search: `wmse` for the int4 schemes, so
the int4 candidates are the default recipe at three group sizes), or the weight kept as the source
stores it. Bits are counted as `inspect` reports `bits_with_overhead`: every tensor written in place of
the weight (packed values, scales, zero points, the shape record) over the weight's parameters.

Modules vLLM builds as one layer take one choice together: q/k/v (`qkv_proj`), gate/up
(`gate_up_proj`), and all the routed experts of an MoE layer (one FusedMoE layer, one scheme).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from weightsmith.core.errors import WeightsmithError
from weightsmith.io import names
from weightsmith.safetensors.dtypes import DTYPES
from weightsmith.schemes import Scheme, make_scheme

#: The label of the candidate that keeps a weight as stored.
KEPT = "kept"


@dataclass(frozen=True)
class Candidate:
    """One choice for a module: `scheme` at `group_size` with its default search, or None: kept as stored."""

    label: str
    scheme: str | None
    group_size: int | None = None

    def make(self) -> Scheme | None:
        return None if self.scheme is None else make_scheme(self.scheme, self.group_size, None)

    def bits(self, module: str, shape: tuple[int, int], dtype: str) -> int:
        """Stored bits of `module`'s weight under this candidate (`dtype`: the source's safetensors code)."""
        scheme = self.make()
        if scheme is None:
            nbytes = DTYPES[dtype].nbytes(math.prod(shape))
            assert nbytes is not None
            return 8 * nbytes
        return 8 * sum(spec.nbytes for spec in scheme.outputs(module, shape, dtype))

    def refusal(self, shape: tuple[int, int]) -> str | None:
        """Why a weight of `shape` cannot take this candidate, or None."""
        scheme = self.make()
        return None if scheme is None else scheme.unsupported(shape)


#: The candidate families `--family` names. The first candidate is the family's uniform default.
#: int4: the default recipe (asymmetric, SINQ pre-pass, wmse) at group 128, 64 and 32, W8A16 at group 64
#: (64 divides every width of the models studied; the preset's 128 does not divide SmolLM2's 576; vLLM's
#: GPU kernels serve it, vLLM CPU does not, see `CPU_SERVED`), and the weight as stored.
#: nvfp4: NVFP4 and FP8 weights (activations left to the runtime: the measures see weights only).
FAMILIES: dict[str, tuple[Candidate, ...]] = {
    "int4": (
        Candidate("g128", "w4a16-asym", 128),
        Candidate("g64", "w4a16-asym", 64),
        Candidate("g32", "w4a16-asym", 32),
        Candidate("w8a16", "w8a16", 64),
        Candidate(KEPT, None),
    ),
    "nvfp4": (
        Candidate("nvfp4", "nvfp4a16"),
        Candidate("fp8", "fp8-dynamic"),
        Candidate(KEPT, None),
    ),
}
#: The candidates vLLM CPU has kernels for (CPUWNA16 takes 4-bit weights only): `--candidates` for a mix
#: that must serve there.
CPU_SERVED = ("g128", "g64", "g32", KEPT)


def candidates(family: str, only: tuple[str, ...] | None = None) -> tuple[Candidate, ...]:
    """`family`'s candidates, or those of them named in `only` (the family's default always included:
    the budget starts from it)."""
    found = FAMILIES.get(family)
    if found is None:
        raise WeightsmithError(f"--family {family!r}: choose from {', '.join(FAMILIES)}", code="usage")
    if only is None:
        return found
    labels = {c.label for c in found}
    unknown = [o for o in only if o not in labels]
    if unknown:
        raise WeightsmithError(
            f"--candidates {unknown[0]!r}: the {family} family's candidates are {', '.join(sorted(labels))}",
            code="usage",
        )
    return tuple(c for i, c in enumerate(found) if i == 0 or c.label in only)


def group_of(module: str) -> str:
    """The layer vLLM builds `module` into, whose modules take one choice together."""
    return names.expert_layer(module) or names.linear_layer(module)[0]
