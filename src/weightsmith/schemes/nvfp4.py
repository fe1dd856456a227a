"""NVFP4A16: FP4 (E2M1) weights in groups of 16 with FP8 (E4M3) scales, `nvfp4-pack-quantized`.

Each quantized weight also carries a float32 global scale `448 * 6 / amax`, from the largest
magnitude of the weight and of its fused partners (q/k/v, gate/up): vLLM loads a fused layer with
one global scale, so the first pass sees every target before any row is encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from weightsmith.core.errors import WeightsmithError
from weightsmith.core.lazy import lazy_module
from weightsmith.formats import compressed_tensors as ct
from weightsmith.io import names
from weightsmith.quant import NVFP4_GROUP, nvfp4_unsupported
from weightsmith.safetensors.dtypes import DTYPES
from weightsmith.schemes.base import FUSED, Alloc, Scheme, Write, fresh, fused_members, register

if TYPE_CHECKING:
    import numpy as np

    from weightsmith.quant import int4, nvfp4
else:  # imported at first use: a --help or a header-only command starts without numpy or numba
    np = lazy_module("numpy")
    int4 = lazy_module("weightsmith.quant.int4")
    nvfp4 = lazy_module("weightsmith.quant.nvfp4")


@register
@dataclass(frozen=True)
class Nvfp4(Scheme):
    NAMES: ClassVar[tuple[str, ...]] = ("nvfp4a16",)
    FORMAT: ClassVar[str] = ct.NVFP4_PACK_QUANTIZED
    COMPILE_SECONDS: ClassVar[int] = 5  # with its scale search

    @classmethod
    def make(cls, name: str, group_size: int | None, scale_search: str | None) -> Scheme:
        if group_size not in (None, NVFP4_GROUP):
            raise WeightsmithError(f"{name} has a fixed group size of {NVFP4_GROUP}", code="usage")
        return cls(name, NVFP4_GROUP, scale_search=scale_search)

    @property
    def config_group_name(self) -> str:
        return "NVFP4A16"

    @property
    def first_pass(self) -> str | None:
        return FUSED

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        return nvfp4_unsupported(shape[1])

    def weight_args(self) -> dict[str, Any]:
        return ct.weight_args(4, True, 16, type_="float", strategy="tensor_group", scale_dtype="torch.float8_e4m3fn")

    def observe(self, x: np.ndarray, r0: int, shape: tuple[int, int], state: Any) -> tuple[Any, int]:
        """The largest magnitude so far, and the dtype mode the global scale is computed in."""
        mode = int4.mode_of(x.dtype)
        block_max, bad = nvfp4.amax_rows(int4.kernel_input(x), mode)
        return (max(state[0], block_max) if state else block_max, mode), bad

    def conclude(self, states: dict[str, Any]) -> dict[str, Any]:
        """One global scale per fused set, from the largest amax in the set."""
        return {
            module: nvfp4.global_scale(max(states[m][0] for m in fused_members(module, states)), mode)
            for module, (_, mode) in states.items()
        }

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: Any = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        xin, mode = int4.kernel_input(x), int4.mode_of(x.dtype)
        n, cols = x.shape
        g = self.group_size
        packed = alloc("packed", (n, cols // 2), np.uint8)
        codes = alloc("codes", (n, cols // g), np.uint8)
        gs = np.float32(tensor_param)
        bad = nvfp4.quantize_rows(xin, mode, gs, self.search is not None, packed, codes)
        writes: list[Write] = [
            (names.WEIGHT_PACKED, packed, r0 * (cols // 2)),
            (names.WEIGHT_SCALE, codes, r0 * (cols // g)),
        ]
        if r0 == 0:
            writes.append((names.WEIGHT_GLOBAL_SCALE, np.array([gs], np.float32), 0))
        return writes, bad


@register
@dataclass(frozen=True)
class Nvfp4W4A4(Nvfp4):
    """NVFP4 (W4A4): NVFP4A16's weights byte for byte, plus a static activation global scale per module.

    At run time each group of 16 activations gets its own FP8 scale (compressed-tensors'
    `dynamic: local`) under a float32 `input_global_scale` = 448 * 6 / (largest |x| the module's
    input reached on calibration data), which the fused NVFP4 kernels need. The formula is
    compressed-tensors' `generate_gparam`, the one the weight global scale uses.
    """

    NAMES: ClassVar[tuple[str, ...]] = ("nvfp4",)
    NEEDS_CALIBRATION: ClassVar[bool] = True

    @property
    def config_group_name(self) -> str:
        return "NVFP4"

    def weight_args(self) -> dict[str, Any]:
        # as llm-compressor's oneshot writes the NVFP4 preset's weights (its memoryless observer named)
        return dict(super().weight_args(), observer="memoryless_minmax")

    def input_args(self) -> dict[str, Any]:
        args = ct.weight_args(4, True, 16, type_="float", strategy="tensor_group", scale_dtype="torch.float8_e4m3fn")
        return dict(args, dynamic="local", observer="static_minmax")

    def input_params(self, input_absmax: float, weight_dtype: str) -> list[tuple[str, np.ndarray]]:
        dtype = DTYPES[weight_dtype].element
        amax = np.float32(np.float32(input_absmax).astype(dtype))  # the observer's maximum is an activation
        return [
            (names.INPUT_GLOBAL_SCALE, np.array([nvfp4.global_scale(float(amax), int4.mode_of(dtype))], np.float32))
        ]

    def weights_words(self) -> str:
        return (
            f"{self.stored_words()}; activations quantized to FP4 (E2M1) at run time, one FP8 scale per group "
            f"of {self.group_size} under a float32 global scale measured on calibration data"
        )
