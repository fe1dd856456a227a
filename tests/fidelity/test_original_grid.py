"""The already-rounded check: trained weights are off any 4-bit grid, weights dequantized from Q4 are on it."""

from __future__ import annotations

import numpy as np

from weightsmith.fidelity.weights import GRID_BLOCK, GRID_ROWS, grid_blocks


def _q4_1(weight: np.ndarray) -> np.ndarray:
    """GGUF Q4_1 round trip: per block of 32, 16 levels between the block's minimum and maximum."""
    blocks = weight.reshape(-1, GRID_BLOCK)
    low, high = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
    step = (high - low) / 15
    return (low + np.round((blocks - low) / step) * step).reshape(weight.shape).astype(np.float32)


def test_trained_weights_are_off_the_grid_and_q4_weights_on_it() -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(0, 0.02, size=(96, 200)).astype(np.float32)  # 200 columns: 6 whole blocks per row
    blocks, on = grid_blocks(weight)
    assert blocks == GRID_ROWS * 6 and on == 0
    rounded = _q4_1(weight[:, :192])
    assert grid_blocks(rounded) == (GRID_ROWS * 6, GRID_ROWS * 6)
    assert grid_blocks(rounded.astype(np.float16)) == (GRID_ROWS * 6, GRID_ROWS * 6)


def test_narrow_or_one_dimensional_weights_are_not_sampled() -> None:
    assert grid_blocks(np.zeros((4, 16), np.float32)) == (0, 0)
    assert grid_blocks(np.zeros(64, np.float32)) == (0, 0)
