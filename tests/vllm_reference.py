"""What vLLM should compute for a checkpoint, computed without vLLM: the reference its tokens are checked against.

transformers loads the checkpoint (compressed-tensors dequantizes it at load, `fidelity.logits.load_model`),
its weights rounded to BF16 as vLLM (`--dtype bfloat16`) holds them, and computes in float32. A scheme
that quantizes activations at run time gets the same quantization on each quantized Linear's input:
a stored static scale as `weightsmith eval` applies it (`fidelity.activations`), a dynamic per-token
scale (FP8 E4M3 or int8, symmetric, `amax / qmax` per token) here. vLLM's tokens are then scored
teacher-forced: one forward pass over prompt plus vLLM's tokens gives, at each generated position,
the reference's greedy token and its logprob of vLLM's token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightsmith.fidelity.activations import input_quantizers, quantized_inputs
from weightsmith.fidelity.logits import load_model
from weightsmith.formats.declaration import quantized_modules
from weightsmith.io.checkpoint import Checkpoint


@dataclass
class Scored:
    """vLLM's completion seen by the reference."""

    agree: int  #: leading generated tokens equal to the reference's greedy tokens
    total: int
    max_gap: float  #: largest |vLLM logprob - reference logprob| of vLLM's token, over the agreeing prefix
    margin_at_split: float | None  #: reference's logprob(its token) - logprob(vLLM's token) where they part
    rank_at_split: int | None = None  #: 1 + how many tokens the reference prefers to vLLM's, where they part


def _per_token(args: dict[str, Any]) -> Any:
    """Dynamic symmetric per-token input quantization, as vLLM's kernels compute it."""
    import torch

    if args.get("type") == "float" and args.get("num_bits") == 8:
        qmax = 448.0

        def cast(y: Any) -> Any:
            return y.to(torch.float8_e4m3fn).to(torch.float32)
    elif args.get("type") == "int" and args.get("num_bits") == 8 and args.get("symmetric", True):
        qmax = 127.0

        def cast(y: Any) -> Any:
            return torch.round(y).clamp(-128, 127)
    else:
        raise NotImplementedError(f"no reference for dynamic input activations {args}")

    def quantize(x: Any) -> Any:
        scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / qmax
        return (cast(x.float() / scale) * scale).to(x.dtype)

    return quantize


def dynamic_quantizers(ckpt: Checkpoint) -> dict[str, Any]:
    """Per quantized module whose config group quantizes its input per token at run time, that quantization."""
    qc = ckpt.quantization_config
    if not isinstance(qc, dict):
        return {}
    out = {}
    for qm in quantized_modules(ckpt):
        args = (qc["config_groups"][qm.group] or {}).get("input_activations")
        if isinstance(args, dict) and args.get("dynamic") is True and args.get("strategy") == "token":
            out[qm.module] = _per_token(args)
    return out


class Reference:
    """A checkpoint loaded once, scoring completions."""

    def __init__(self, folder: Path) -> None:
        ckpt = Checkpoint.open(folder)
        import torch

        self.model = load_model(folder).to(torch.bfloat16).to(torch.float32)
        self.quantizers = {**input_quantizers(ckpt), **dynamic_quantizers(ckpt)}

    def logprobs(self, ids: list[int]) -> Any:
        """Log-softmax [T, V] of the next token at every position of `ids`, activations quantized as served."""
        import torch

        with torch.no_grad(), quantized_inputs(self.model, self.quantizers):
            logits = self.model(torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def score(self, prompt: list[int], generated: list[int], served_logprobs: list[float]) -> Scored:
        lp = self.logprobs(prompt + generated)[len(prompt) - 1 : -1]
        agree, gap, margin, rank = 0, 0.0, None, None
        for i, tok in enumerate(generated):
            best = int(lp[i].argmax())
            if best != tok:
                margin = float(lp[i, best] - lp[i, tok])
                rank = 1 + int((lp[i] > lp[i, tok]).sum())
                break
            agree += 1
            gap = max(gap, abs(float(lp[i, tok]) - served_logprobs[i]))
        return Scored(agree, len(generated), gap, margin, rank)
