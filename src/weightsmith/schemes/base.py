"""What a quantization scheme is to the rest of weightsmith, and the registry of schemes by name.

A scheme is its quantization arithmetic and the format it writes: which command-line names select
it and how their options are checked, which weights it can take, its compressed-tensors config
group (whose format, formats/compressors/, gives the tensors it writes per quantized Linear and
reads them back to a dense weight), an optional first pass over whole tensors (NVFP4's global
scale from each fused set's absolute maximum; llm-compressor's observer, which decides over a
whole tensor), the encoding of a block of rows with its kernel (quant/), packed as its format
packs, and the words that describe it in a plan and a card. The pipeline and the plan ask the
scheme; `eval` and `verify` ask the format a checkpoint declares; none of them knows a scheme by
name. Adding a scheme on an existing format is one module in this package plus its kernel and tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.core.terminal import echo
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats import compressors, layouts
from weightsmith.formats.layouts import Layout
from weightsmith.io import names
from weightsmith.safetensors.writer import TensorSpec
from weightsmith.searches import NONE, SEARCHES, ScaleSearch

if TYPE_CHECKING:
    import numpy as np
else:  # a --help or a header-only command imports this module without them
    np = lazy_module("numpy")


#: One write: (parameter name, data, byte offset within that tensor).
Write = tuple[str, "np.ndarray", int]
#: Hands out a (possibly reused) array: alloc(key, shape, dtype).
Alloc = Callable[[str, tuple[int, ...], type], "np.ndarray"]

#: `Scheme.first_pass` values: what must be seen of whole tensors before any row is encoded.
TENSOR, FUSED = "tensor", "fused"


@dataclass(frozen=True)
class Grid:
    """The integer grid round-to-nearest puts rows of a weight on, which GPTQ then chooses points of.

    `scale` [rows, cols/group] in the scale's storage dtype (the arithmetic is done in it, as
    compressed-tensors does), `zero_point` [rows, cols/group] (None when symmetric); a weight value
    w maps to `clamp(round(w / scale + zero_point), q_min, q_max)`. `shrink` [rows, cols/group]
    float32 is the factor a scale search clipped each group's range by to get `scale` (None: 1, plain
    round-to-nearest's range); the stored scales are made again from it, so it travels with `Chosen`.
    """

    scale: np.ndarray
    zero_point: np.ndarray | None
    group: int
    q_min: int
    q_max: int
    shrink: np.ndarray | None = None


@dataclass(frozen=True)
class Chosen:
    """Integer values chosen for a whole weight by a data-aware method (GPTQ), on the `Grid` that
    `grid` gives for the same rows: `encode` stores them instead of rounding its input, with the
    scales of that grid (its `shrink`, when a search chose one)."""

    codes: np.ndarray  # int8 [rows, cols]
    shrink: np.ndarray | None = None  # float32 [rows, cols/group], the grid's own


def fresh(key: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """An `Alloc` that allocates anew every time."""
    return np.empty(shape, dtype)


@dataclass(frozen=True)
class Scheme(ABC):
    """One weight scheme with its options. Subclasses register with `@register`."""

    name: str
    group_size: int
    symmetric: bool = True
    num_bits: int = 4
    #: None (plain round-to-nearest) or the name of a scale search that applies to it (`weightsmith.searches`).
    scale_search: str | None = None

    #: The command-line names this class serves, in help order.
    NAMES: ClassVar[tuple[str, ...]] = ()
    #: The scale search used when none is named (None: plain round-to-nearest). `make_scheme` applies
    #: it; `--scale-search none` asks for round-to-nearest whatever the default.
    DEFAULT_SEARCH: ClassVar[str | None] = None
    #: The compressed-tensors format of its config group: a name in `compressors.REGISTRY`.
    FORMAT: ClassVar[str]
    #: Row blocks are cut at multiples of this many rows (packed zero points span 8 rows).
    ROW_MULTIPLE: ClassVar[int] = 1
    #: Whether the scheme stores static activation parameters measured on calibration data
    #: (`input_params`): a plan refuses to quantize with it without statistics for every module.
    NEEDS_CALIBRATION: ClassVar[bool] = False
    #: About how many seconds numba takes to compile the scheme's kernels for one input dtype, on a
    #: 2-core machine (benchmarks/startup_speed.py measures it): what a run that compiles them says
    #: first. Compiled once per machine, then loaded from numba's cache.
    COMPILE_SECONDS: ClassVar[int] = 4
    # --- construction ---

    @classmethod
    @abstractmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        """The scheme a user named with these options, or a one-line usage error (`scale_search`
        None: round-to-nearest; `make_scheme` has already resolved the default and `none`)."""

    @property
    def first_pass(self) -> str | None:
        """What must be seen of whole tensors before any row is encoded.

        None: rows encode on their own. TENSOR: `observe` sees every row block of a tensor, then
        `conclude` gives its parameter, within one job. FUSED: `observe` sees every target first
        and `conclude` sees them all, so that fused partners can share a parameter.
        """
        return None

    @property
    def search(self) -> ScaleSearch | None:
        """The scale search's class, None for round-to-nearest."""
        return None if self.scale_search is None else SEARCHES[self.scale_search]

    # --- what it takes and what it writes ---

    @property
    @abstractmethod
    def config_group_name(self) -> str:
        """compressed-tensors' preset name, written as the config group's name."""

    @abstractmethod
    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        """Why a 2-D weight of this shape cannot take the scheme, or None."""

    def layer_refusal(self, layer: str, partitions: list[tuple[str, int]]) -> str | None:
        """Why vLLM would refuse to build `layer` under this scheme, or None.

        `partitions` are the layer's shards (module name, output rows) in vLLM's row order
        (`names.linear_layer`). Only block-wise weights have such a rule: vLLM refuses a fused
        layer whose shards do not fill whole blocks, whatever each weight's own shape allows.
        """
        args = self.weight_args()
        if args.get("strategy") != "block":
            return None
        refused = ct.block_shape_refusal(layer, partitions, layouts.parse_block(args.get("block_structure")))
        return None if refused is None else refused[1]

    @property
    def layout(self) -> Layout:
        """What the scheme stores per quantized Linear: its format's layout for its arguments."""
        layout = compressors.of_group(self.FORMAT, self.weight_args(), self.input_args())
        if layout is None:
            raise TypeError(f"{type(self).__name__}: no {self.FORMAT} layout in formats/compressors/ for its args")
        return layout

    def outputs(self, module: str, shape: tuple[int, int], weight_dtype: str) -> list[TensorSpec]:
        """The tensors written in place of `module.weight` (`weight_dtype`: the source's float dtype).

        A float scale takes the declared `scale_dtype`, else the weight's dtype, as `verify` expects.
        """
        scale_dtype = ct.TORCH_DTYPES.get(self.weight_args().get("scale_dtype") or "", weight_dtype)
        return [
            TensorSpec(f"{module}.{param}", tensor.dtype or scale_dtype, tensor.shape)
            for param, tensor in self.layout.tensors(*shape).items()
        ]

    @abstractmethod
    def weight_args(self) -> dict[str, Any]:
        """The config group's `weights` block (`QuantizationArgs`)."""

    def input_args(self) -> dict[str, Any] | None:
        """The config group's `input_activations` block: None for weight-only schemes."""
        return None

    def input_params(self, input_absmax: float, weight_dtype: str) -> list[tuple[str, np.ndarray]]:
        """The static activation parameters stored beside a module's weight (`NEEDS_CALIBRATION` schemes).

        `input_absmax` is the largest |x| that reached the module (and its fused partners, which
        vLLM runs on one input) on the calibration tokens; `weight_dtype` is the source weight's
        float dtype, the dtype the activations had. Returns (parameter name, value array) pairs.
        """
        raise NotImplementedError(f"{type(self).__name__} takes no calibration data")

    def quantization_config(self, ignore: list[str]) -> dict[str, Any]:
        return ct.quantization_config(
            self.config_group_name, self.FORMAT, self.weight_args(), ignore, self.input_args()
        )

    def describe(self) -> str:
        """The plan's reason for a quantized weight, e.g. `W4A16 g128, mse scale search`."""
        search = f", {self.scale_search} scale search" if self.scale_search else ""
        return f"{self.config_group_name} g{self.group_size}{search}"

    def stored_words(self) -> str:
        """How the stored weights are described to a reader, e.g. `4-bit integer weights, symmetric, ...`."""
        return self.layout.words()

    def weights_words(self) -> str:
        """The scheme in a model card's words: the stored weights, then what happens to activations."""
        act = self.input_args()
        if act is None:
            return f"{self.stored_words()}; activations stay 16-bit"
        bits, kind = act.get("num_bits"), act.get("type")
        floats: dict[tuple[object, object], str] = {("float", 8): "FP8 (E4M3)", ("float", 4): "FP4 (E2M1)"}
        kind = floats.get((kind, bits), f"{bits}-bit integers")
        scale = "power-of-two (E8M0) scale" if act.get("scale_dtype") == "torch.uint8" else "scale"
        per = f"group of {act['group_size']}" if act.get("strategy") == "group" else act.get("strategy")
        return f"{self.stored_words()}; activations quantized to {kind} at run time, one {scale} per {per}"

    # --- the work ---

    def grid(self, x: np.ndarray) -> Grid | None:
        """The grid round-to-nearest uses for rows `x` (a whole weight), or None when the scheme has
        none a data-aware method can choose points of. Raises ValueError on NaN/Inf."""
        return None

    def observe(self, x: np.ndarray, r0: int, shape: tuple[int, int], state: Any) -> tuple[Any, int]:
        """First pass over rows [r0, r0 + len(x)): the updated state (None at first) and a NaN/Inf index."""
        raise NotImplementedError(f"{type(self).__name__} has no first pass")

    def conclude(self, states: dict[str, Any]) -> dict[str, Any]:
        """Module name -> what `encode` needs, from every observed module's state."""
        raise NotImplementedError(f"{type(self).__name__} has no first pass")

    @abstractmethod
    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        """Quantize rows [r0, r0 + len(x)) of a weight of `shape`: the writes and a NaN/Inf index (-1: none).

        `tensor_param` is what `conclude` gave for this weight's module (None without a first pass).
        """


#: Command-line name -> the class that serves it, in registration order.
REGISTRY: dict[str, type[Scheme]] = {}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator: make a scheme's names available to `make_scheme`."""
    for name in cls.NAMES:
        if name in REGISTRY:
            raise ValueError(f"scheme name {name!r} registered twice")
        REGISTRY[name] = cls
    return cls


def make_scheme(name: str, group_size: int | None = None, scale_search: str | None = None) -> Scheme:
    """The scheme a user named, or a one-line usage error.

    `scale_search` None means the scheme's `DEFAULT_SEARCH` and `"none"` plain round-to-nearest. The
    scheme checks its own options first, then the search says whether it applies to the scheme made.
    """
    cls = REGISTRY.get(name)
    if cls is None:
        raise WeightsmithError(f"unknown scheme {echo(name)} (choose from {', '.join(REGISTRY)})", code="usage")
    if scale_search is not None and scale_search != NONE and scale_search not in SEARCHES:
        raise WeightsmithError(
            f"unknown scale search {echo(scale_search)} (choose from {', '.join((NONE, *SEARCHES))})", code="usage"
        )
    if scale_search is None:
        scale_search = cls.DEFAULT_SEARCH
    scheme = cls.make(name, group_size, None if scale_search == NONE else scale_search)
    refused = None if scheme.search is None else scheme.search.refusal(scheme)
    if refused is not None:
        raise WeightsmithError(refused, code="usage")
    return scheme


def fused_members(module: str, present: dict[str, Any]) -> list[str]:
    """`module` and its fused partners (q/k/v, gate/up) among `present`: the set vLLM loads as one layer."""
    fused = names.fused_partners(module)
    return [m for m in (fused[1] if fused else (module,)) if m in present]
