"""What a scale search is to the rest of weightsmith, and the registry of searches by name.

A scale search chooses each group's scale (and zero point) of a grid a scheme already defines; the
format on disk is the scheme's, only the values differ. A search owns its name, the schemes it
applies to and its refusals, the words that describe it (the `--scale-search` help and the model
card read them), whether GPTQ can start from it, and its kernel. There are three kinds, by what the
int4 scheme asks of them:

- `ClipSearch`: a factor per group that clips or widens the group's range, chosen from the rows
  alone; round-to-nearest then puts the rows on that grid, which GPTQ can start from too.
- `TensorSearch`: factors that need the whole tensor first (a first pass, then a choice).
- `ParameterSearch`: each group's scale and integer zero point set directly, which no clip factor
  makes again (so GPTQ, which carries clip factors, cannot start from it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np


class Scheme(Protocol):
    """What a search asks of the scheme it is to serve (a `weightsmith.schemes` scheme; schemes import
    searches, not the other way round)."""

    @property
    def name(self) -> str: ...

    @property
    def symmetric(self) -> bool: ...


#: The scale search a user names for plain round-to-nearest (a scheme's `scale_search` None).
NONE = "none"


class ScaleSearch(ABC):
    """One scale search. Subclasses of its kinds register an instance with `@register`."""

    #: The name `--scale-search` and a recipe's `scale_search` take.
    NAME: ClassVar[str]
    #: The scheme names (`--scheme`) it applies to.
    SCHEMES: ClassVar[tuple[str, ...]]
    #: What it does, in the `--scale-search` help's words (after its name, in parentheses).
    HELP: ClassVar[str]
    #: What it does, as the model card's "how it was made" section says it.
    CARD: ClassVar[str]
    #: Why `--method gptq` cannot start from it (after "it does not take --scale-search NAME"), or None.
    GPTQ_REFUSAL: ClassVar[str | None] = None
    #: Why an asymmetric scheme of `SCHEMES` cannot take it (`{scheme}`: its name), or None where it can.
    ASYMMETRIC_REFUSAL: ClassVar[str | None] = None

    def refusal(self, scheme: Scheme) -> str | None:
        """Why `scheme` (as made with this search) cannot take it, in the command line's words, or None."""
        if scheme.name in self.SCHEMES:
            if scheme.symmetric or self.ASYMMETRIC_REFUSAL is None:
                return None
            return self.ASYMMETRIC_REFUSAL.format(scheme=scheme.name)
        takes = ", ".join(searches_for(scheme.name)) or "none"
        return f"--scale-search {self.NAME} is for {', '.join(self.SCHEMES)}; {scheme.name} takes {takes}"

    def weight_args(self) -> dict[str, Any]:
        """What it adds to the config group's `weights` block (an observer that reproduces it)."""
        return {}


class ClipSearch(ScaleSearch):
    """A factor per group, from the rows alone, that scales the group's range before its scale is computed."""

    @abstractmethod
    def fill(self, x: np.ndarray, mode: int, group: int, symmetric: bool, shrink: np.ndarray) -> int:
        """Fill `shrink` (float32 [rows, cols/group]) with each group's factor: a NaN/Inf flat index or -1.

        `x` and `mode` as `quant.int4.kernel_input` and `mode_of` give them."""


class TensorSearch(ScaleSearch):
    """Clip factors decided over the whole tensor: every row block is observed before any is encoded."""

    GPTQ_REFUSAL = "whose factors need the whole tensor first"

    @abstractmethod
    def start(self, shape: tuple[int, int], group: int) -> Any:
        """The empty state of a first pass over a weight of `shape`."""

    @abstractmethod
    def observe(self, x: np.ndarray, mode: int, group: int, r0: int, state: Any) -> int:
        """Rows [r0, r0 + len(x)) seen into `state`: a NaN/Inf flat index (within `x`) or -1."""

    @abstractmethod
    def conclude(self, state: Any) -> np.ndarray:
        """The factors (float32 [rows, cols/group]) once every row was observed."""


class ParameterSearch(ScaleSearch):
    """Each group's scale and integer zero point, chosen by the search itself."""

    GPTQ_REFUSAL = "which sets each group's scale and zero point itself, not a clip factor"

    @abstractmethod
    def parameters(
        self, x: np.ndarray, mode: int, group: int, symmetric: bool, scale: np.ndarray, zero_point: np.ndarray
    ) -> int:
        """Fill `scale` (float32 [rows, cols/group], exact in the weight dtype) and `zero_point` (int8 in
        [-8, 7]; 0 when symmetric): a NaN/Inf flat index or -1."""


#: Search name -> its one instance, in registration order.
SEARCHES: dict[str, ScaleSearch] = {}


def register(cls: type[ScaleSearch]) -> type[ScaleSearch]:
    """Class decorator: make a search available by its name."""
    if cls.NAME in SEARCHES or cls.NAME == NONE:
        raise ValueError(f"scale search name {cls.NAME!r} registered twice")
    SEARCHES[cls.NAME] = cls()
    return cls


def searches_for(scheme: str) -> tuple[str, ...]:
    """The searches that apply to the scheme named `scheme`, in registration order."""
    return tuple(name for name, search in SEARCHES.items() if scheme in search.SCHEMES)


def gptq_starts() -> tuple[str, ...]:
    """The searches whose grid `--method gptq` can start from."""
    return tuple(name for name, search in SEARCHES.items() if search.GPTQ_REFUSAL is None)
