"""The quantization schemes a user can ask for: what each writes per quantized Linear, and how.

A scheme turns a block of rows of one weight into byte ranges of its output tensors (`encode`).
The pipeline around it only reads, schedules and writes; everything a format means is here, in
the quantizer modules (`quant/`), and in `formats/compressed_tensors.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from weightsmith import names
from weightsmith.errors import WeightsmithError
from weightsmith.formats import compressed_tensors as ct
from weightsmith.quant import int4, int4_search, nvfp4
from weightsmith.safetensors.writer import TensorSpec

#: One write: (parameter name, data, byte offset within that tensor).
Write = tuple[str, np.ndarray, int]
#: Hands out a (possibly reused) array: alloc(key, shape, dtype).
Alloc = Callable[[str, tuple[int, ...], type], np.ndarray]


def fresh(key: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """An `Alloc` that allocates anew every time."""
    return np.empty(shape, dtype)


@dataclass(frozen=True)
class Scheme:
    """A weight-only scheme; `kind` is "int4" (pack-quantized) or "nvfp4" (nvfp4-pack-quantized)."""

    name: str
    kind: str
    symmetric: bool
    group_size: int
    num_bits: int = 4
    #: None (plain RTN), "mse" (our search) or "memoryless_mse" (llm-compressor's observer, exactly).
    scale_search: str | None = None

    @property
    def config_group_name(self) -> str:
        if self.kind == "nvfp4":
            return "NVFP4A16"
        return "W4A16" if self.symmetric else "W4A16_ASYM"

    @property
    def needs_tensor_amax(self) -> bool:
        """NVFP4's global scale needs each tensor's (and its fused partners') absolute maximum first."""
        return self.kind == "nvfp4"

    @property
    def needs_whole_tensor(self) -> bool:
        """llm-compressor's observer decides its early stop over the whole tensor."""
        return self.scale_search == "memoryless_mse"

    def unsupported(self, shape: tuple[int, ...]) -> str | None:
        """Why a 2-D weight of this shape cannot take the scheme, or None."""
        if self.kind == "nvfp4":
            return nvfp4.supports(shape[1])
        return int4.supports(shape[1], self.group_size)

    def outputs(self, module: str, shape: tuple[int, int], weight_dtype: str) -> list[TensorSpec]:
        """The tensors written in place of `module.weight`."""
        out, inp = shape
        groups = inp // self.group_size
        if self.kind == "nvfp4":
            return [
                TensorSpec(f"{module}.{names.WEIGHT_PACKED}", "U8", (out, inp // 2)),
                TensorSpec(f"{module}.{names.WEIGHT_SCALE}", "F8_E4M3", (out, groups)),
                TensorSpec(f"{module}.{names.WEIGHT_GLOBAL_SCALE}", "F32", (1,)),
            ]
        specs = [
            TensorSpec(f"{module}.{names.WEIGHT_PACKED}", "I32", (out, inp // int4.PACK)),
            TensorSpec(f"{module}.{names.WEIGHT_SCALE}", weight_dtype, (out, groups)),
            TensorSpec(f"{module}.{names.WEIGHT_SHAPE}", "I64", (2,)),
        ]
        if not self.symmetric:
            specs.append(TensorSpec(f"{module}.{names.WEIGHT_ZERO_POINT}", "I32", (-(-out // int4.PACK), groups)))
        return specs

    def quantization_config(self, ignore: list[str]) -> dict:
        if self.kind == "nvfp4":
            args = ct.weight_args(
                4, True, 16, type_="float", strategy="tensor_group", scale_dtype="torch.float8_e4m3fn"
            )
            return ct.quantization_config(self.config_group_name, ct.NVFP4_PACK_QUANTIZED, args, ignore)
        args = ct.weight_args(self.num_bits, self.symmetric, self.group_size)
        if self.scale_search == "memoryless_mse":
            args["observer"] = "memoryless_mse"
            args["observer_kwargs"] = dict(int4_search.MEMORYLESS)
        return ct.quantization_config(self.config_group_name, ct.PACK_QUANTIZED, args, ignore)

    def encode(
        self, x: np.ndarray, r0: int, shape: tuple[int, int], tensor_param: object = None, alloc: Alloc = fresh
    ) -> tuple[list[Write], int]:
        """Quantize rows [r0, r0 + len(x)) of a weight of `shape`; returns the writes and a NaN/Inf index.

        `tensor_param` is what the scheme needed from the whole tensor first: NVFP4's global scale,
        or the `memoryless_mse` clipping factors of these rows.
        """
        xin, mode = int4.kernel_input(x), int4.mode_of(x.dtype)
        n, cols = x.shape
        g = self.group_size
        if self.kind == "nvfp4":
            packed = alloc("packed", (n, cols // 2), np.uint8)
            codes = alloc("codes", (n, cols // g), np.uint8)
            gs = np.float32(tensor_param)
            bad = nvfp4.quantize_rows(xin, mode, gs, self.scale_search == "mse", packed, codes)
            writes: list[Write] = [
                (names.WEIGHT_PACKED, packed, r0 * (cols // 2)),
                (names.WEIGHT_SCALE, codes, r0 * (cols // g)),
            ]
            if r0 == 0:
                writes.append((names.WEIGHT_GLOBAL_SCALE, np.array([gs], np.float32), 0))
            return writes, bad
        if isinstance(tensor_param, np.ndarray):
            shrink = tensor_param
        else:
            shrink = alloc("shrink", (n, cols // g), np.float32)
            shrink.fill(1.0)
            if self.scale_search == "mse":
                bad = int4_search.search_mse(xin, mode, g, shrink, self.symmetric)
                if bad >= 0:
                    return [], bad
        packed = alloc("packed", (n, cols // int4.PACK), np.uint32)
        scale = alloc("scale", (n, cols // g), np.float32)
        zp = alloc("zp", (n, cols // g), np.int8)
        bad = int4.quantize_rows(xin, mode, g, self.symmetric, shrink, packed, scale, zp)
        stored_scale = int4.scale_storage(scale, mode)
        writes = [
            (names.WEIGHT_PACKED, packed, r0 * (cols // int4.PACK) * 4),
            (names.WEIGHT_SCALE, stored_scale, r0 * (cols // g) * stored_scale.itemsize),
        ]
        if not self.symmetric:
            writes.append((names.WEIGHT_ZERO_POINT, int4.pack_nibbles(zp, axis=0), (r0 // int4.PACK) * (cols // g) * 4))
        if r0 == 0:
            writes.append((names.WEIGHT_SHAPE, np.array(shape, np.int64), 0))
        return writes, bad


SCHEME_NAMES = ("w4a16", "w4a16-asym", "nvfp4a16")


def make_scheme(name: str, group_size: int | None = None, scale_search: str | None = None) -> Scheme:
    """The scheme a user named, or a one-line usage error."""
    if name not in SCHEME_NAMES:
        raise WeightsmithError(f"unknown scheme {name!r} (choose from {', '.join(SCHEME_NAMES)})", code="usage")
    if scale_search is not None and scale_search not in int4_search.SEARCHES:
        raise WeightsmithError(
            f"unknown scale search {scale_search!r} (choose from {', '.join(int4_search.SEARCHES)})", code="usage"
        )
    if name == "nvfp4a16":
        if group_size not in (None, nvfp4.GROUP):
            raise WeightsmithError(f"nvfp4a16 has a fixed group size of {nvfp4.GROUP}", code="usage")
        if scale_search == "memoryless_mse":
            raise WeightsmithError(
                "--scale-search memoryless_mse is for int4 schemes; nvfp4a16 takes mse", code="usage"
            )
        return Scheme(name, "nvfp4", symmetric=True, group_size=nvfp4.GROUP, scale_search=scale_search)
    group_size = 128 if group_size is None else group_size
    if group_size <= 0 or group_size % int4.PACK:
        raise WeightsmithError(f"--group-size {group_size} must be a positive multiple of {int4.PACK}", code="usage")
    symmetric = name == "w4a16"
    if scale_search == "memoryless_mse" and not symmetric:
        raise WeightsmithError(
            f"--scale-search memoryless_mse reproduces llm-compressor's symmetric observer; with {name} use mse",
            code="usage",
        )
    return Scheme(name, "int4", symmetric=symmetric, group_size=group_size, scale_search=scale_search)
