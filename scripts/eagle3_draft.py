"""An EAGLE3 draft for SmolLM2-135M that accepts, trained on this CPU in minutes.

The draft is the one vLLM's `llama_eagle3.py` builds (`LlamaForCausalLMEagle3`), computed here the way
that file computes it: `fc` over three of the target's residual streams (the inputs of layers
`AUX_LAYERS`, what vLLM's Llama collects for EAGLE3), one `midlayer` whose attention reads the token's
embedding (the target's own, not shipped) beside those features, and its own `lm_head` over the
`DRAFT_VOCAB` tokens the target predicts most, mapped back by `d2t` (target id = draft id + d2t).

Training data is the target's own behaviour: Python standard-library source (none of the files the
bench's prompts are cut from, `held_out_files`) and the target's greedy continuations of it, labelled
with the target's greedy next token. At temperature 0 a draft token is accepted exactly when it is
that token. The loss unrolls the draft `DEPTH` steps as vLLM runs it: step 1 reads the target's
features, each later step its own pre-norm output and the token before, attending to step 1's keys of
earlier positions and to its own ("training-time test").

Started from the target's last layer: `fc` picks the latest feature, the midlayer's attention, MLP and
norms are layer 29's (the embedding half of q/k/v zero), `lm_head` the embedding rows, so step 0
already predicts roughly what the target predicts next, one token early.

    .venv/bin/python scripts/eagle3_draft.py OUT [--steps N]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from models import smollm2_fp32  # noqa: E402
from weightsmith.bench.workloads import FALLBACK_CHARS_PER_TOKEN, build_prompts, stdlib_corpus  # noqa: E402

#: The target layers whose inputs the draft reads: vLLM's EAGLE3 default for a 30-layer Llama (2, n/2, n-3).
AUX_LAYERS = (2, 15, 27)
DRAFT_VOCAB = 4096
DEPTH = 3
SEQ = 256
#: The bench's prompts: its seeds (measured, warmups), lengths and counts, whose files training leaves out.
BENCH_SEED, BENCH_LENGTHS, BENCH_PROMPTS = 0, (64,), 6
SEED = 0


def held_out_files(extra: int = 2) -> set[str]:
    """Every file a bench prompt of this sample can be cut from (its measured and warm-up seeds), and the
    `extra` files after each, which a long prompt runs on into."""
    corpus = stdlib_corpus()
    names = [rel for rel, _ in corpus]
    out = set()
    for seed, count in ((BENCH_SEED, BENCH_PROMPTS), (BENCH_SEED + 1000, 1), (BENCH_SEED + 2000, 1)):
        for prompt in build_prompts(list(BENCH_LENGTHS), count, FALLBACK_CHARS_PER_TOKEN, seed):
            first = names.index(prompt.source.split(" (+")[0])
            out.update(names[(first + j) % len(names)] for j in range(extra + 1))
    return out


def training_text(windows: int, held_out: set[str]) -> list[list[int]]:
    """`windows` SEQ-token windows of the standard library, two at most from a file, held-out files skipped."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_fp32())
    rng = random.Random(SEED)
    files = [(rel, text) for rel, text in stdlib_corpus() if rel not in held_out]
    rng.shuffle(files)
    out: list[list[int]] = []
    for _, text in files:
        ids = tok(text)["input_ids"]
        out += [ids[start : start + SEQ] for start in range(0, len(ids) - SEQ, len(ids) // 2)][:2]
        if len(out) >= windows:
            return out[:windows]
    return out


def continuations(target, windows: list[list[int]], prompt: int = 96, new: int = SEQ - 96) -> list[list[int]]:
    """The target's greedy continuation of each window's first `prompt` tokens: the text it drafts for."""
    out = []
    with torch.no_grad():
        for i in range(0, len(windows), 32):
            batch = torch.tensor([w[:prompt] for w in windows[i : i + 32]])
            done = target.generate(batch, max_new_tokens=new, do_sample=False, min_new_tokens=new, pad_token_id=2)
            out += done.tolist()
    return out


def features(target, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: the three aux residual streams [N, T, 3H] (BF16) and the target's greedy next token [N, T]."""
    aux, nxt = [], []
    with torch.no_grad():
        for i in range(0, len(seqs), 8):
            ids = torch.tensor(seqs[i : i + 8])
            out = target(ids, output_hidden_states=True)
            aux.append(torch.cat([out.hidden_states[layer] for layer in AUX_LAYERS], -1).to(torch.bfloat16))
            nxt.append(out.logits.argmax(-1))
    return torch.cat(aux), torch.cat(nxt)


class Rms(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(weight.clone().float()), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Draft(nn.Module):
    """`llama_eagle3.py`'s LlamaModel with one layer (norm after residual), as vLLM runs it."""

    def __init__(self, target, vocab: torch.Tensor) -> None:
        super().__init__()
        c = target.config
        self.h, self.heads, self.kv, self.hd = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        last = target.model.layers[c.num_hidden_layers - 1]
        eps = c.rms_norm_eps
        h = self.h
        self.fc = nn.Linear(3 * h, h, bias=False)
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, 2 * h :] = torch.eye(h)
        self.input_layernorm = Rms(last.input_layernorm.weight, eps)
        self.hidden_norm = Rms(last.input_layernorm.weight, eps)
        self.post_attention_layernorm = Rms(last.post_attention_layernorm.weight, eps)
        self.norm = Rms(target.model.norm.weight, eps)
        attn, mlp = last.self_attn, last.mlp

        def linear(src: torch.Tensor, doubled: bool = False) -> nn.Linear:
            out, inp = src.shape
            layer = nn.Linear(2 * inp if doubled else inp, out, bias=False)
            with torch.no_grad():
                layer.weight.zero_()
                layer.weight[:, -inp:] = src
            return layer

        self.q_proj, self.k_proj, self.v_proj = (
            linear(p.weight, True) for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        self.o_proj = linear(attn.o_proj.weight)
        self.gate_proj, self.up_proj, self.down_proj = (
            linear(p.weight) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        self.lm_head = nn.Linear(h, len(vocab), bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(target.model.embed_tokens.weight[vocab])
        theta = c.rope_parameters["rope_theta"]
        self.register_buffer(
            "inv_freq", 1.0 / theta ** (torch.arange(0, self.hd, 2).float() / self.hd), persistent=False
        )

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Llama's rotary embedding (neox style: halves), x [B, heads, T, hd], pos [T]."""
        freqs = pos[:, None].float() * self.inv_freq[None]
        cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def step(self, emb: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, past: list, depth: int):
        """Step `depth` of every chain at once (chain j starts after target position j): the post-norm and
        pre-norm outputs; this step's keys and values are appended to `past`."""
        b, t, _ = emb.shape
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1)
        residual = hidden
        q = self.q_proj(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = self.rope(q, pos), self.rope(k, pos)
        past.append((k, v))
        keys = torch.cat([kk for kk, _ in past], 2).repeat_interleave(self.heads // self.kv, 1)
        values = torch.cat([vv for _, vv in past], 2).repeat_interleave(self.heads // self.kv, 1)
        # every step's entries are indexed by the chain's start j: the query of step `depth` at j sees step
        # 0's entries at starts <= j (the context, positions <= j) and its own chain's later steps
        idx = torch.arange(t)
        blocks = [idx[None, :] <= idx[:, None]] + [idx[None, :] == idx[:, None]] * depth
        mask = torch.cat(blocks, 1)
        att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        att = self.o_proj(att.transpose(1, 2).reshape(b, t, -1))
        residual = att + residual
        x = self.post_attention_layernorm(residual)
        x = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        pre = x + residual
        return self.norm(pre), pre


def train(out: Path, windows: int, generated_windows: int, steps: int, batch: int = 8) -> dict:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    started = time.monotonic()
    target = AutoModelForCausalLM.from_pretrained(smollm2_fp32(), dtype=torch.float32).eval()
    held = held_out_files()
    text = training_text(windows + generated_windows, held)
    generated = continuations(target, text[windows:])
    seqs = text[:windows] + generated
    aux, nxt = features(target, seqs)
    # one sequence in ten is kept out of training and scored at the end, as the draft meets new text
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(SEED))
    scored, trained_on = order[: len(seqs) // 10], order[len(seqs) // 10 :]
    counts = torch.bincount(nxt.flatten(), minlength=target.config.vocab_size)
    vocab = counts.argsort(descending=True)[:DRAFT_VOCAB].sort().values
    to_draft = torch.full((target.config.vocab_size,), -100, dtype=torch.long)
    to_draft[vocab] = torch.arange(len(vocab))
    covered = float(counts[vocab].sum() / counts.sum())
    prepared = time.monotonic() - started
    draft = Draft(target, vocab)
    embed = target.model.embed_tokens
    ids = torch.tensor(seqs)
    opt = torch.optim.AdamW(draft.parameters(), lr=5e-4, weight_decay=0.0)
    accs = []
    for it in range(steps):
        for group in opt.param_groups:
            group["lr"] = 5e-4 * 0.5 * (1 + math.cos(math.pi * it / steps))
        rows = trained_on[torch.randint(0, len(trained_on), (batch,))]
        loss, acc = unrolled(draft, embed, ids[rows], aux[rows], nxt[rows], to_draft)
        opt.zero_grad()
        loss.backward()
        opt.step()
        accs.append(acc)
        if it % 50 == 0 or it == steps - 1:
            print(f"step {it}: loss {loss.item():.3f}, top-1 by depth {[round(a, 3) for a in acc]}", flush=True)
    with torch.no_grad():
        _, held_acc = unrolled(draft, embed, ids[scored], aux[scored], nxt[scored], to_draft)
    trained = time.monotonic() - started - prepared
    save(draft, vocab, target.config, out)
    last = accs[-20:]
    return {
        "target": "SmolLM2-135M", "aux_layers": list(AUX_LAYERS), "draft_vocab": DRAFT_VOCAB, "depth": DEPTH,
        "sequences": len(seqs), "sequence_tokens": SEQ, "generated_sequences": len(generated),
        "held_out_files": sorted(held), "vocab_coverage": round(covered, 4), "steps": steps, "batch": batch,
        "prepare_s": round(prepared, 1), "train_s": round(trained, 1),
        "final_train_top1_by_depth": [round(sum(a[d] for a in last) / len(last), 3) for d in range(DEPTH)],
        "held_out_sequences": len(scored), "held_out_top1_by_depth": [round(a, 3) for a in held_acc],
    }  # fmt: skip


def unrolled(
    draft: Draft, embed: nn.Module, ids: torch.Tensor, aux: torch.Tensor, nxt: torch.Tensor, to_draft: torch.Tensor
):
    """The draft run DEPTH steps from every position of `ids` [B, T]: the loss (step d weighted 1/(d+1))
    and top-1 agreement with the target's greedy token per step."""
    tt = ids.shape[1] - 1 - DEPTH
    pos = torch.arange(tt)
    hidden = draft.fc(aux[:, :tt].float())
    past: list = []
    loss = torch.zeros(())
    acc = []
    for d in range(DEPTH):
        # chain j at step d reads token j + 1 + d (the text's, then the target's greedy ones) and predicts
        # the target's greedy token after it
        tokens_in = nxt[:, d : tt + d] if d else ids[:, 1 : tt + 1]
        with torch.no_grad():
            emb = embed(tokens_in)
        normed, pre = draft.step(emb, hidden, pos + d, past, d)
        logits = draft.lm_head(normed)
        labels = to_draft[nxt[:, 1 + d : tt + 1 + d]]
        flat = logits.reshape(-1, logits.shape[-1])
        loss = loss + F.cross_entropy(flat, labels.reshape(-1), ignore_index=-100) / (d + 1)
        acc.append(float((logits.argmax(-1) == labels).float().mean()))
        hidden = pre
    return loss, acc


def save(draft: Draft, vocab: torch.Tensor, c, out: Path) -> None:
    """The draft as EAGLE3 drafts are stored (`midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`), BF16."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {"fc.weight": draft.fc.weight, "norm.weight": draft.norm.weight, "lm_head.weight": draft.lm_head.weight}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        tensors[f"midlayer.{name}.weight"] = getattr(draft, name).weight
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensors[f"midlayer.self_attn.{name}.weight"] = getattr(draft, name).weight
    for name in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"midlayer.mlp.{name}.weight"] = getattr(draft, name).weight
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    tensors["d2t"] = (vocab - torch.arange(len(vocab))).to(torch.int64)
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[vocab] = True
    tensors["t2d"] = t2d
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": dict(c.rope_parameters), "vocab_size": c.vocab_size, "draft_vocab_size": len(vocab),
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS)},
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--windows", type=int, default=160, help=f"{SEQ}-token windows of text")
    ap.add_argument("--generated", type=int, default=32, help="windows continued by the target's greedy decoding")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    report = train(args.out, args.windows, args.generated, args.steps)
    (args.out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "held_out_files"}, indent=1))


if __name__ == "__main__":
    main()
