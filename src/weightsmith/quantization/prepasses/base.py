"""What a pre-pass is to the rest of weightsmith, and the registry of pre-passes by name.

A pre-pass rewrites the weights before they are quantized so that they quantize better, and folds what
it did into other tensors so that the unquantized model computes the same function and the checkpoint
keeps its ordinary format. It owns its name, the schemes and checkpoints it applies to and its
refusals (checked from the headers, before any weight is read), the words that describe it (the
`--pre-pass` help, the quantize summary and the model card), and its transform, which the pipeline
reads every weight through.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quantization.plan import Plan
    from weightsmith.schemes.base import Scheme


class Transform(Protocol):
    """A pre-pass's result: each weight's rows as the quantizer is to see them, and the new values of the
    unquantized tensors its folds changed."""

    values: dict[str, np.ndarray]
    #: CPU seconds of each of its tasks (a layer's folds, say), for the benchmarks' schedules.
    task_seconds: list[float]

    def apply(self, name: str, x: np.ndarray, r0: int) -> np.ndarray:
        """Rows [r0, r0 + len(x)) of weight `name` transformed, in `x`'s dtype."""
        ...


class PrePass(ABC):
    """One pre-pass. Subclasses register an instance with `@register`."""

    #: The name `--pre-pass` takes.
    NAME: ClassVar[str]
    #: What it does, in the `--pre-pass` help's words (after its name).
    HELP: ClassVar[str]
    #: What it did, in the quantize summary's words; `{changed}` is the number of tensors it changed.
    SUMMARY: ClassVar[str]
    #: What it did, as the model card says it; `{iterations}` is the manifest's cited iteration bound.
    CARD: ClassVar[str]
    #: Whether `--pre-pass auto` takes it wherever its check passes.
    AUTO: ClassVar[bool] = False

    @abstractmethod
    def takes(self, scheme: Scheme) -> bool:
        """Whether a weight quantized with `scheme` can be transformed first."""

    @abstractmethod
    def check(self, plan: Plan) -> list[str]:
        """The parts of the model (decoder layers) it transforms, from the headers; a one-line usage
        refusal for anything it cannot transform exactly."""

    @abstractmethod
    def skipped(self, plan: Plan) -> str | None:
        """Why `--pre-pass auto` leaves `plan` untransformed, in words, or None where it applies."""

    @abstractmethod
    def changed_tensors(self, plan: Plan, parts: list[str]) -> list[str]:
        """The unquantized tensors whose values it changes, for the `parts` `check` gave."""

    @abstractmethod
    def transformed(self, plan: Plan) -> set[str]:
        """The quantized weights of `plan` read through the transform."""

    @abstractmethod
    def run(self, plan: Plan, workers: int) -> Transform:
        """The transform of `plan`'s weights, `workers` threads at a time."""


#: Pre-pass name -> its one instance, in registration order.
PRE_PASSES: dict[str, PrePass] = {}


def register(cls: type[PrePass]) -> type[PrePass]:
    """Class decorator: make a pre-pass available by its name."""
    if cls.NAME in PRE_PASSES:
        raise ValueError(f"pre-pass name {cls.NAME!r} registered twice")
    PRE_PASSES[cls.NAME] = cls()
    return cls
