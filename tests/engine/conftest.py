"""Checkpoints the engine tests share (module- or session-scoped: building them is the slow part)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from models import smollm2_fp32

    try:
        return smollm2_fp32()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_llama(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BF16 Llama with SmolLM2's tokenizer (runs in well under a second)."""
    from fidelity.eval_checkpoints import TINY_LM_CONFIG, TOKENIZER_FILES
    from synth import llama_tensors, write_checkpoint

    folder = write_checkpoint(
        tmp_path_factory.mktemp("engine") / "bf16", llama_tensors(TINY_LM_CONFIG, seed=5), TINY_LM_CONFIG
    )
    for name in TOKENIZER_FILES:
        shutil.copy(smollm2 / name, folder / name)
    return folder
