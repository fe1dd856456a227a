"""llm-compressor's side of the FP8-input comparisons (tests/quantize/test_fp8_inputs.py, the hostile narrow-weight
cases): its ignore list, its FP8 schemes, and tensor-by-tensor equality read by the safetensors library."""

from __future__ import annotations

from pathlib import Path

IGNORE = ["lm_head", "model.embed_tokens"]


def load(folder: Path) -> dict:
    from safetensors.torch import load_file as load_torch

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_torch(str(f)).items()}


def same_tensors(a: Path, b: Path) -> None:
    """Every tensor of two checkpoints equal in dtype, shape and bytes (read by the safetensors library)."""
    import torch

    ta, tb = load(a), load(b)
    assert set(ta) == set(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert torch.equal(ta[k].view(torch.uint8), tb[k].view(torch.uint8)), k


def ct_fp8_scheme(strategy: str):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    block = [128, 128] if strategy == "block" else None
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, block_structure=block)
    return QuantizationScheme(targets=["Linear"], weights=args)
