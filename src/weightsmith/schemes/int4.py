"""W4A16 and W4A16_ASYM: int4 group-wise round-to-nearest, compressed-tensors `pack-quantized`.

The formula is compressed-tensors' (see quant/int4.py). A scale search (`weightsmith.searches`) changes
the grid's values, never the format: a clip search scales each group's range by a factor it chooses
from the rows, a tensor search (llm-compressor's `memoryless_mse`) decides its factors over the whole
tensor (a first pass per tensor), and a parameter search (`hqq`, `qkx2`) chooses each group's scale and
integer zero point itself, which the kernel then rounds to (`int4.quantize_given`): parameters no
range clip reaches. The default is `wmse`: on the two real models of
docs/scale-search-study.md it lowers KL and perplexity and raises top-1 against plain
round-to-nearest of the same symmetry; `--scale-search none` is plain round-to-nearest,
byte-identical to llm-compressor's `model_free_ptq`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.formats.compressors.pack_quantized import PackQuantized
from weightsmith.io import names
from weightsmith.quant import INT4_PACK, int4_unsupported
from weightsmith.schemes.base import TENSOR, Alloc, Chosen, Grid, Scheme, Write, fresh, register
from weightsmith.searches import SEARCHES, ClipSearch, ParameterSearch, TensorSearch

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import int4
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    int4 = lazy_module("weightsmith.quant.int4")

DEFAULT_GROUP = 128


@register
@dataclass(frozen=True)
class Int4(Scheme):
    NAMES: ClassVar[tuple[str, ...]] = ("w4a16", "w4a16-asym")
    DEFAULT_SEARCH: ClassVar[str | None] = "wmse"
    FORMAT: ClassVar[str] = ct.PACK_QUANTIZED
    ROW_MULTIPLE: ClassVar[int] = INT4_PACK
    COMPILE_SECONDS: ClassVar[int] = 6  # the kernel and a scale search's

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        group_size = DEFAULT_GROUP if group_size is None else group_size
        if group_size <= 0 or group_size % INT4_PACK:
            raise WeightsmithError(
                f"--group-size {group_size} must be a positive multiple of {INT4_PACK}", code="usage"
            )
        return cls(name, group_size, symmetric=name == "w4a16", scale_search=scale_search)

    @property
    def first_pass(self) -> str | None:
        return TENSOR if isinstance(self.search, TensorSearch) else None

    @property
    def config_group_name(self) -> str:
        return "W4A16" if self.symmetric else "W4A16_ASYM"

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        return int4_unsupported(shape[1], self.group_size)

    def weight_args(self) -> dict[str, Any]:
        args = ct.weight_args(self.num_bits, self.symmetric, self.group_size)
        return args if self.search is None else args | self.search.weight_args()

    def observe(self, x: np.ndarray, r0: int, shape: tuple[int, int], state: Any) -> tuple[Any, int]:
        """A tensor search's first pass, over every row block of the tensor."""
        search = self.search
        assert isinstance(search, TensorSearch), "only a tensor search has a first pass"
        if state is None:
            state = search.start(shape, self.group_size)
        xin, mode = int4.kernel_input(x), int4.mode_of(x.dtype)
        return state, search.observe(xin, mode, self.group_size, r0, state)

    def conclude(self, states: dict[str, Any]) -> dict[str, Any]:
        """A tensor search's factors for each module, once the whole tensor was seen."""
        search = self.search
        assert isinstance(search, TensorSearch), "only a tensor search has a first pass"
        return {module: search.conclude(state) for module, state in states.items()}

    def grid(self, x: np.ndarray) -> Grid | None:
        """Round-to-nearest's grid, on the clip factors this scheme's search chooses from the weight
        alone (none for a tensor search, whose factors need a first pass over the whole tensor, nor
        for a parameter search, whose scales no clip factor makes again)."""
        if self.search is not None and not isinstance(self.search, ClipSearch):
            return None
        n, cols = x.shape
        mode, g = int4.mode_of(x.dtype), self.group_size
        xin = int4.kernel_input(np.ascontiguousarray(x))
        scale = np.empty((n, cols // g), np.float32)
        zp = np.zeros((n, cols // g), np.int8)
        packed = np.empty((n, cols // INT4_PACK), np.uint32)
        shrink = np.ones((n, cols // g), np.float32)
        bad = self._search(xin, mode, shrink)
        if bad < 0:
            bad = int4.quantize_rows(xin, mode, g, self.symmetric, shrink, packed, scale, zp)
        if bad >= 0:
            raise ValueError(f"non-finite value at row {bad // cols}, column {bad % cols}")
        searched = shrink if self.scale_search is not None else None
        zero_point = None if self.symmetric else zp
        return Grid(int4.scale_storage(scale, mode), zero_point, g, int4.Q_MIN, int4.Q_MAX, searched)

    def _search(self, xin: np.ndarray, mode: int, shrink: np.ndarray) -> int:
        """Fill `shrink` with the clip search's factor per group (left at 1 without one): a NaN/Inf index or -1."""
        if isinstance(self.search, ClipSearch):
            return self.search.fill(xin, mode, self.group_size, self.symmetric, shrink)
        return -1

    def quantize_into(
        self, x: np.ndarray, r0: int, tensor_param: Any, alloc: Alloc, packed: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Rows of `x` quantized into `packed` (see `int4.quantize_rows`): (scale in its stored
        dtype, zero points int8 [rows, groups], flat index of a NaN/Inf or -1; when it is not -1
        the rest is not to be written). With `Chosen` values (GPTQ) the grid is these rows' own and
        the points on it are the chosen ones."""
        xin, mode = int4.kernel_input(x), int4.mode_of(x.dtype)
        n, cols = x.shape
        g = self.group_size
        scale = alloc("scale", (n, cols // g), np.float32)
        zp = alloc("zp", (n, cols // g), np.int8)
        search = self.search
        if isinstance(search, ParameterSearch):  # (never with `Chosen`: GPTQ does not start from these)
            bad = search.parameters(xin, mode, g, self.symmetric, scale, zp)
            if bad < 0:
                bad = int4.quantize_given(xin, mode, g, self.symmetric, scale, zp, packed)
            return int4.scale_storage(scale, mode), zp, bad
        if isinstance(tensor_param, Chosen) and tensor_param.shrink is not None:  # GPTQ on a searched grid
            shrink = tensor_param.shrink[r0 : r0 + n]
        elif isinstance(tensor_param, np.ndarray):  # a tensor search's factors for the whole tensor
            shrink = tensor_param[r0 : r0 + n]
        else:
            shrink = alloc("shrink", (n, cols // g), np.float32)
            shrink.fill(1.0)
            if not isinstance(tensor_param, Chosen):
                bad = self._search(xin, mode, shrink)
                if bad >= 0:
                    return scale, zp, bad
        bad = int4.quantize_rows(xin, mode, g, self.symmetric, shrink, packed, scale, zp)
        if isinstance(tensor_param, Chosen):  # in `packed`'s layout: nibbles, or one int8 per value (W4AFP8)
            codes = tensor_param.codes[r0 : r0 + n]
            packed[:] = codes if packed.dtype == np.int8 else PackQuantized.pack(codes, 4, axis=1).view(np.uint32)
        return int4.scale_storage(scale, mode), zp, bad

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        n, cols = x.shape
        g = self.group_size
        packed = alloc("packed", (n, cols // INT4_PACK), np.uint32)
        stored_scale, zp, bad = self.quantize_into(x, r0, tensor_param, alloc, packed)
        if bad >= 0:
            return [], bad
        writes: list[Write] = [
            (names.WEIGHT_PACKED, packed, r0 * (cols // INT4_PACK) * 4),
            (names.WEIGHT_SCALE, stored_scale, r0 * (cols // g) * stored_scale.itemsize),
        ]
        if not self.symmetric:
            zero_point = PackQuantized.pack(zp, 4, axis=0)
            writes.append((names.WEIGHT_ZERO_POINT, zero_point, (r0 // INT4_PACK) * (cols // g) * 4))
        if r0 == 0:
            writes.append((names.WEIGHT_SHAPE, np.array(shape, np.int64), 0))
        return writes, -1


@dataclass(frozen=True)
class Int4Weight:
    """One quantized weight as stored on disk."""

    packed: np.ndarray  # int32 [out, in/8]
    scale: np.ndarray  # weight dtype [out, in/group]
    zero_point: np.ndarray | None  # int32 [ceil(out/8), in/group], asymmetric only
    shape: tuple[int, int]


def quantize(
    w: np.ndarray,
    group: int = 128,
    symmetric: bool = True,
    shrink: np.ndarray | None = None,
    search: str | None = None,
) -> Int4Weight:
    """Quantize a whole 2-D weight (bf16, fp16 or fp32). Raises ValueError on NaN/Inf.

    `shrink` (float32 [rows, cols/group]) clips each group's range, as a scale search chooses;
    `search`, the name of a parameter search (`hqq`, `qkx2`), sets each group's scale and zero point instead.
    """
    mode = int4.mode_of(w.dtype)
    rows, cols = w.shape
    why = int4_unsupported(cols, group)
    if why:
        raise ValueError(why)
    packed = np.empty((rows, cols // INT4_PACK), np.uint32)
    scale = np.empty((rows, cols // group), np.float32)
    zp = np.zeros((rows, cols // group), np.int8)
    if shrink is None:
        shrink = np.ones((rows, cols // group), np.float32)
    x = int4.kernel_input(np.ascontiguousarray(w))
    if search is not None:
        parameter_search = SEARCHES[search]
        assert isinstance(parameter_search, ParameterSearch), f"{search} is not a parameter search"
        bad = parameter_search.parameters(x, mode, group, symmetric, scale, zp)
        if bad < 0:
            bad = int4.quantize_given(x, mode, group, symmetric, scale, zp, packed)
    else:
        bad = int4.quantize_rows(x, mode, group, symmetric, shrink, packed, scale, zp)
    if bad >= 0:
        raise ValueError(f"non-finite value at row {bad // cols}, column {bad % cols}")
    return Int4Weight(
        packed.view(np.int32),
        int4.scale_storage(scale, mode),
        None if symmetric else PackQuantized.pack(zp, 4, axis=0),
        (rows, cols),
    )


def dequantize(weight: Int4Weight, group: int) -> np.ndarray:
    """`(q - zp) * scale`, rounded to the scale dtype as compressed-tensors does."""
    rows, cols = weight.shape
    q = PackQuantized.unpack(weight.packed, 4, cols, axis=1).astype(np.float32)
    scale = np.repeat(weight.scale.astype(np.float32), group, axis=1)
    if weight.zero_point is not None:
        zp = PackQuantized.unpack(weight.zero_point, 4, rows, axis=0).astype(np.float32)
        q = q - np.repeat(zp, group, axis=1)
    return (q * scale).astype(weight.scale.dtype)
