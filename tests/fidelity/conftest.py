"""Checkpoints the eval tests share: synthetic Llama weights quantized by `weightsmith.quantize`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from eval_checkpoints import TINY_LM_CONFIG, TOKENIZER_FILES, quantize

from synth import llama_tensors, write_checkpoint


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BF16 Llama-shaped checkpoint in two shards (no tokenizer: weight error only)."""
    return write_checkpoint(tmp_path_factory.mktemp("eval") / "bf16", llama_tensors(), shards=2)


@pytest.fixture(scope="session")
def synthetic_w4(synthetic: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`synthetic` as symmetric W4A16, group 64."""
    return quantize(synthetic, tmp_path_factory.mktemp("eval") / "w4a16-g64")


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(ORIG, QUANT): a tiny BF16 Llama with SmolLM2's tokenizer, and its W4A16 g32 copy."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    from models import smollm2_fp32

    try:
        tokenizer_dir = smollm2_fp32()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("tiny-lm")
    orig = write_checkpoint(root / "bf16", llama_tensors(TINY_LM_CONFIG, seed=3), TINY_LM_CONFIG)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, orig / name)
    return orig, quantize(orig, root / "w4a16-g32", group=32)
