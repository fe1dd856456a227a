"""Weight error for every format `quantize` writes: NVFP4A16 against compressed-tensors' own
decompressor, and the scale searches measured against plain round-to-nearest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from eval_checkpoints import load_tensors, quantize

from weightsmith.fidelity.weights import weight_error
from weightsmith.io import names


def _torch_tensors(folder: Path) -> dict[str, object]:
    """Every tensor in FOLDER's shards, loaded through torch (for compressed-tensors' decompressor)."""
    pytest.importorskip("torch")
    from safetensors.torch import load_file as load_torch

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_torch(str(f)).items()}


def _decompressed_by_compressed_tensors(tensors: dict[str, object], module: str) -> np.ndarray:
    """The module's dense weight as compressed-tensors' NVFP4 decompressor gives it, from TENSORS
    (the checkpoint as `_torch_tensors` reads it)."""
    pytest.importorskip("torch")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    params = (names.WEIGHT_PACKED, names.WEIGHT_SCALE, names.WEIGHT_GLOBAL_SCALE)
    state = {p: tensors[f"{module}.{p}"] for p in params}
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    return NVFP4PackedCompressor.decompress(state, scheme)["weight"].float().numpy()


def test_nvfp4_error_equals_the_compressed_tensors_decompressor(synthetic: Path, tmp_path: Path) -> None:
    out = quantize(synthetic, tmp_path / "nvfp4", scheme="nvfp4a16", group=None)
    report = weight_error(synthetic, out)
    assert report.unsupported == [] and len(report.layers) == 14
    assert {layer.format for layer in report.layers} == {"nvfp4-pack-quantized"}
    src = load_tensors(synthetic)
    packed = _torch_tensors(out)
    for layer in report.layers:
        w = src[f"{layer.module}.weight"].astype(np.float64)
        q = _decompressed_by_compressed_tensors(packed, layer.module).astype(np.float64)
        assert layer.rel_mse == float(np.sum(np.square(w - q))) / float(np.sum(np.square(w))), layer.module
        assert 1e-3 < layer.rel_mse < 0.05


def test_scale_searches_lower_the_error(synthetic: Path, synthetic_w4: Path, tmp_path: Path) -> None:
    rtn = weight_error(synthetic, synthetic_w4).overall.rel_mse
    searched = weight_error(synthetic, quantize(synthetic, tmp_path / "mse", scale_search="mse")).overall.rel_mse
    assert searched < rtn
    nvfp4 = quantize(synthetic, tmp_path / "nvfp4", scheme="nvfp4a16", group=None)
    nvfp4_search = quantize(synthetic, tmp_path / "nvfp4-mse", scheme="nvfp4a16", group=None, scale_search="mse")
    assert weight_error(synthetic, nvfp4_search).overall.rel_mse < weight_error(synthetic, nvfp4).overall.rel_mse
