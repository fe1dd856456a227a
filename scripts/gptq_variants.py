"""GPTQ variants measured end to end and not kept (docs/engine.md).

`width` and `hdiag` run the fidelity study's default GPTQ row (scripts/fidelity_study.py: W4A16, `wmse` grid,
dampening 0.1, 8,192 tokens of `--builtin code` in sequences of 256) with one change, then `weightsmith eval`
on the study's 2,048 tokens, and print the quantize time and KL / top-1 agreement / perplexity:
- `width`: dampening 0.01 (llm-compressor's) where the calibration has at least four tokens per Hessian
  column, the default 0.1 elsewhere (on Qwen2.5-Coder-1.5B only down_proj's 8,960 columns keep 0.1);
- `hdiag`: each group's clip factor (the `wmse` search's candidates) chosen to minimise
  sum_j H_jj (w_j - dq_j)^2, the calibration Hessian's diagonal in place of the weights' magnitude
  (symmetric W4A16 only).
The change is made in the child process that quantizes, around `engine.gptq`; nothing else differs.

    python scripts/gptq_variants.py {width,hdiag} [--model smollm2|qwen]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
TOKENS = 8192  # the study's GPTQ calibration (fidelity_study.GPTQ)


def hdiag_shrink(x: np.ndarray, diag: np.ndarray, group: int) -> np.ndarray:
    """Per group of `x` [rows, cols] (float32), the `wmse` candidate factor minimising
    sum_j diag_j (w_j - dq_j)^2 on the symmetric int4 grid; float32 [rows, cols / group]."""
    from weightsmith.quant import int4_search

    w = x.reshape(x.shape[0], -1, group)
    d = diag.astype(np.float32).reshape(1, -1, group)
    amax = np.abs(w).max(-1, keepdims=True)
    best = np.full(w.shape[:2], np.inf, np.float32)
    shrink = np.ones(w.shape[:2], np.float32)
    for f in int4_search.WIDE:
        step = np.maximum(amax * f / np.float32(7.5), np.float32(1e-12))
        cost = ((np.clip(np.rint(w / step), -8, 7) * step - w) ** 2 * d).sum(-1)
        better = cost < best
        best[better], shrink[better] = cost[better], f
    return shrink


def patch(variant: str) -> None:
    """Change `engine.gptq` in this process as `variant` says."""
    from weightsmith.engine import gptq
    from weightsmith.quantization.recipe import GPTQ_DAMPENING, LLM_COMPRESSOR_DAMPENING

    if variant == "width":
        quantize_weight = gptq.quantize_weight

        def by_width(weight, hessian, grid, dampening, block_size, actorder):
            wide = 4 * hessian.shape[0] > TOKENS
            return quantize_weight(weight, hessian, grid, GPTQ_DAMPENING if wide else LLM_COMPRESSOR_DAMPENING,
                                   block_size, actorder)  # fmt: skip

        gptq.quantize_weight = by_width
        return
    from weightsmith.quant.int4 import MODE_DTYPES
    from weightsmith.schemes.int4 import Int4

    group_diag = threading.local()  # groups are quantized on several threads at once
    quantize_group, search = gptq._quantize_group, Int4._search

    def with_diag(members, hessian, **kwargs):
        group_diag.value = np.diagonal(hessian.numpy()).copy()
        try:
            quantize_group(members, hessian, **kwargs)
        finally:
            group_diag.value = None

    def hdiag_search(self, xin, mode, shrink):
        diag = getattr(group_diag, "value", None)
        if diag is None or not self.symmetric:
            return search(self, xin, mode, shrink)
        shrink[...] = hdiag_shrink(xin.view(MODE_DTYPES[mode]).astype(np.float32), diag, self.group_size)
        return -1

    gptq._quantize_group = with_diag
    Int4._search = hdiag_search


def measure(variant: str, model: str) -> None:
    """Quantize with `variant` in a child process, then evaluate as the study does."""
    from fidelity_study import CACHE, GPTQ, MODELS
    from smollm2_fidelity import TOKENS as EVAL_TOKENS
    from smollm2_fidelity import sample_text, weightsmith

    _, build, group = MODELS[model]
    orig = build()
    CACHE.mkdir(parents=True, exist_ok=True)
    text = sample_text(CACHE)
    args = ["--scheme", "w4a16", "--group-size", str(group), "--scale-search", "wmse", *GPTQ, "--dampening", "0.1"]
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        out = Path(tmp) / "quant"
        started = time.perf_counter()
        child = [sys.executable, __file__, "quantize-child", variant, "quantize", str(orig), str(out), "--no-hash"]
        subprocess.run([*child, *args], check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - started
        evaluate = ["eval", str(orig), str(out), "--json", "--tokens", str(EVAL_TOKENS), "--text", str(text)]
        lg = json.loads(weightsmith(*evaluate))["logits"]
    print(f"{model} {variant}: quantize {seconds:.0f} s; KL {lg['kl']:.4f} / top-1 {lg['top1_agreement']:.3f} / "
          f"perplexity {lg['ppl_quant']:.3f}")  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["quantize-child"]:
        patch(sys.argv[2])
        from weightsmith.cli import main as cli

        sys.argv = ["weightsmith", *sys.argv[3:]]
        cli()
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["width", "hdiag"])
    ap.add_argument("--model", choices=["smollm2", "qwen"], default="smollm2")
    args = ap.parse_args()
    measure(args.what, args.model)


if __name__ == "__main__":
    main()
