"""Try a data-free int4 scale rule on a real model in minutes: next-token KL of a fake-quantized model.

`make fidelity-study` judges a recipe the way a user meets it (quantize to disk, load through
compressed-tensors, compare), which runs the original model once per recipe. This script is for
searching: it runs the original once, then for each candidate replaces every Linear but `lm_head`
by its int4 round trip computed here in torch (compressed-tensors' formula, intermediates rounded to
the weight dtype) and runs the model again. On SmolLM2-135M it reproduces `weightsmith eval` on our
RTN and asymmetric RTN checkpoints to the 4 printed decimals (KL 0.3994 / 0.3210, top-1 0.709 / 0.754).

    python scripts/scale_search_kl.py smollm2|qwen CANDIDATE[,CANDIDATE...]

Candidates (GROUP: 64 on SmolLM2, 128 on Qwen, as the study):
  rtn, rtn-asym          plain round to nearest, symmetric / asymmetric
  noclip                 symmetric scale max(max/7, -min/8): both ends on the grid (`--scale-search noclip`)
  hqq                    asymmetric, alternating least-squares scale and best integer zero point (10 rounds)
  search:OBJ[:wide]      symmetric clipping search over factors 1.00..0.80 (wide: also 1.02..1.08)
  asearch:OBJ[:wide]     the same, asymmetric
  asym2d:OBJ             asymmetric, min and max clipped apart (6 x 6 factors 1.00..0.80; integer zero point)
  dir:PATH               a quantized checkpoint written by `weightsmith quantize` (e.g. with a numba search,
                         much faster than these torch searches on a 1.5B model), loaded through
                         compressed-tensors as `weightsmith eval` loads it; needs the cached reference.
                         On a 24 GB machine give Qwen one or two `dir:` per run: four in one process
                         were killed for memory.
OBJ, the error a group's factor minimises: l25 (|e|^2.5, as `mse`), l2, wl2 (|w| e^2, as `wmse` with
:wide), gl2 ((gamma e)^2, gamma the RMSNorm weight feeding the Linear, where one does; else e^2).
Prints one JSON line per candidate: KL (mean KL(p_orig || p_quant), nats), top-1, perplexity and
relative weight MSE, on the study's 2048 tokens.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable

import torch
import transformers
from fidelity_study import CACHE, MODELS
from smollm2_fidelity import TOKENS, sample_text

Objective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
OBJECTIVES: dict[str, Objective] = {
    "l25": lambda e, w, gamma: (e.abs() ** 2.5).sum(-1),
    "l2": lambda e, w, gamma: (e * e).sum(-1),
    "wl2": lambda e, w, gamma: (w.abs() * e * e).sum(-1),
    "gl2": lambda e, w, gamma: ((gamma * e) ** 2).sum(-1),
}
NORM_BEFORE = dict.fromkeys(("q_proj", "k_proj", "v_proj"), "input_layernorm") | dict.fromkeys(
    ("gate_proj", "up_proj"), "post_attention_layernorm"
)
CLIP = [1.0 - 0.02 * k for k in range(11)]
WIDE = CLIP + [1.0 + 0.02 * k for k in range(1, 5)]


class FakeQuant:
    """Group-wise int4 round trips in torch, with every intermediate rounded to the weight dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.eps = torch.finfo(dtype).eps

    def rd(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype).float()

    def nonzero(self, s: torch.Tensor) -> torch.Tensor:
        return torch.where(s == 0, torch.full_like(s, self.eps), s)

    def sym(self, g: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.clamp(torch.round(self.rd(g / s)), -8, 7) * s

    def asym(self, g: torch.Tensor, s: torch.Tensor, zp: torch.Tensor) -> torch.Tensor:
        return (torch.clamp(torch.round(self.rd(self.rd(g / s) + zp)), -8, 7) - zp) * s

    def asym_params(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.nonzero(self.rd((hi - lo) / 15))
        return s, torch.clamp(torch.round(self.rd(-8 - self.rd(lo / s))), -8, 7)

    def clipped(self, g: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, p: float, symmetric: bool) -> torch.Tensor:
        lo, hi = self.rd(lo * p), self.rd(hi * p)
        if symmetric:
            return self.sym(g, self.nonzero(self.rd(torch.maximum(-lo, hi) / 7.5)))
        return self.asym(g, *self.asym_params(lo, hi))

    @staticmethod
    def best(tries: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The round trip of lowest error per group; the first wins ties, as the numba searches."""
        best, out = tries[0]
        for err, dq in tries[1:]:
            better = (err < best).unsqueeze(-1)
            best, out = torch.minimum(err, best), torch.where(better, dq, out)
        return out

    def __call__(self, w: torch.Tensor, group: int, cand: str, gamma: torch.Tensor) -> torch.Tensor:
        rows, cols = w.shape
        g = w.float().reshape(rows, cols // group, group)
        gamma = gamma.reshape(cols // group, group)
        lo = torch.clamp(g.amin(-1), max=0).unsqueeze(-1)
        hi = torch.clamp(g.amax(-1), min=0).unsqueeze(-1)
        kind, *opts = cand.split(":")
        if kind in ("rtn", "rtn-asym"):
            dq = self.clipped(g, lo, hi, 1.0, kind == "rtn")
        elif kind == "noclip":
            dq = self.sym(g, self.nonzero(self.rd(torch.maximum(hi / 7, -lo / 8))))
        elif kind in ("search", "asearch"):
            obj, grid = OBJECTIVES[opts[0]], WIDE if opts[1:] == ["wide"] else CLIP
            tries = [self.clipped(g, lo, hi, p, kind == "search") for p in grid]
            dq = self.best([(obj(d - g, g, gamma), d) for d in tries])
        elif kind == "asym2d":
            obj, tries = OBJECTIVES[opts[0]], []
            for a in [1.0 - 0.04 * k for k in range(6)]:
                for b in [1.0 - 0.04 * k for k in range(6)]:
                    d = self.asym(g, *self.asym_params(self.rd(lo * a), self.rd(hi * b)))
                    tries.append((obj(d - g, g, gamma), d))
            dq = self.best(tries)
        elif kind == "hqq":
            s, zp = self.asym_params(lo, hi)
            for _ in range(10):
                u = torch.clamp(torch.round(g / s + zp), -8, 7) - zp
                s_ls = (u * g).sum(-1, keepdim=True) / (u * u).sum(-1, keepdim=True).clamp_min(1e-12)
                s = torch.where(s_ls > 0, self.rd(s_ls), s)
                q = torch.clamp(torch.round(g / s + zp), -8, 7)
                zp = torch.clamp(torch.round((q - g / s).mean(-1, keepdim=True)), -8, 7)
            dq = self.asym(g, s, zp)
        else:
            raise SystemExit(f"unknown candidate {cand!r}")
        return self.rd(dq).reshape(rows, cols)


def norm_gammas(model: torch.nn.Module, linears: dict[str, torch.nn.Linear]) -> dict[str, torch.Tensor]:
    """The RMSNorm weight that scales each q/k/v and gate/up projection's input (a Llama-family layout)."""
    modules = dict(model.named_modules())
    out = {}
    for name in linears:
        layer = name.rsplit(".", 2)[0]
        which = NORM_BEFORE.get(name.rsplit(".", 1)[1])
        if which is not None:
            out[name] = modules[f"{layer}.{which}"].weight.detach().float().clone()
    return out


def compare(ref: torch.Tensor, out: torch.Tensor, ids: torch.Tensor) -> dict:
    kl = float((ref.exp() * (ref - out)).sum(-1).mean())
    top1 = float((ref.argmax(-1) == out.argmax(-1)).float().mean())
    ppl = float(torch.exp(-out[:-1].gather(1, ids[0, 1:, None]).mean()))
    return {"kl": round(kl, 4), "top1": round(top1, 3), "ppl": round(ppl, 3)}


def checkpoints(model_key: str, ids: torch.Tensor, cands: list[str]) -> None:
    """Each `dir:PATH` candidate: our checkpoint as transformers loads it, against the cached reference."""
    from weightsmith.fidelity.logits import load_model

    ref = torch.load(CACHE / model_key / "reference-logprobs.pt")
    for cand in cands:
        started = time.perf_counter()
        model = load_model(cand.removeprefix("dir:"))
        with torch.no_grad():
            out = torch.log_softmax(model(ids).logits[0].float(), -1)
        del model
        gc.collect()  # a 1.5B model in float32 is 7 GB: never two at once
        row = {"model": model_key, "candidate": cand, **compare(ref, out, ids)}
        print(json.dumps(row | {"seconds": round(time.perf_counter() - started)}), flush=True)


def main() -> None:
    model_key, cands = sys.argv[1], sys.argv[2].split(",")
    _, build, group = MODELS[model_key]
    folder = build()
    CACHE.mkdir(parents=True, exist_ok=True)
    text = sample_text(CACHE).read_text()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt").input_ids[:, :TOKENS]
    if all(c.startswith("dir:") for c in cands):
        return checkpoints(model_key, ids, cands)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    config = json.loads((folder / "config.json").read_text())
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.get("dtype") or config["torch_dtype"]]
    ref_file = CACHE / model_key / "reference-logprobs.pt"
    with torch.no_grad():
        if ref_file.exists():
            ref = torch.load(ref_file)
        else:
            ref = torch.log_softmax(model(ids).logits[0].float(), -1)
            ref_file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(ref, ref_file)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    weights = {n: m.weight.detach().to(dtype).clone() for n, m in linears.items()}
    gammas = norm_gammas(model, linears)
    fake = FakeQuant(dtype)
    for cand in cands:
        started, num, den = time.perf_counter(), 0.0, 0.0
        with torch.no_grad():
            for name, module in linears.items():
                w = weights[name]
                dq = fake(w, group, cand, gammas.get(name, torch.ones(w.shape[1])))
                num += float(((dq - w.float()) ** 2).sum())
                den += float((w.float() ** 2).sum())
                module.weight.data = dq
            out = torch.log_softmax(model(ids).logits[0].float(), -1)
        row = {"model": model_key, "candidate": cand, **compare(ref, out, ids)}
        row |= {"rel_mse": float(f"{num / den:.3e}"), "seconds": round(time.perf_counter() - started)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
