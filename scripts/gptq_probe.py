"""Where GPTQ's gain on held-out text comes from: calibration tokens, sequence length, dampening, grid.

For a few decoder layers, the Linear input Hessians of the ORIGINAL model are gathered on the
calibration text (`--builtin code`: 8,192 tokens in sequences of 256, and 16,384 in sequences of
2,048, whose first half is the same 8,192 tokens) and on the evaluation text of
scripts/fidelity_study.py (2,048 tokens of textwrap/argparse/pathlib). Each module (q, o, gate,
down) is quantized W4A16 g128 by round-to-nearest on three grids (RTN's; the `wmse` search's; a
clip search weighted by the calibration Hessian's diagonal) and by GPTQ (`engine.gptq.quantize_weight`)
on each grid with each calibration Hessian and dampening. Printed per module: the held-out output
error of RTN, tr(E H_eval E^T) / tr(W H_eval W^T), then every other variant's as a fraction of it.
A probe of single layers on the original model's inputs, minutes instead of a full GPTQ run.

    python scripts/gptq_probe.py MODEL_DIR LAYERS      e.g. .cache/models/qwen2.5-coder-1.5b-bf16 2,12
"""

import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gptq_variants import hdiag_shrink
from transformers import AutoModelForCausalLM, AutoTokenizer

from weightsmith.engine.gptq import quantize_weight
from weightsmith.io.texts import builtin_text

MODEL = Path(sys.argv[1])
LAYERS = [int(x) for x in sys.argv[2].split(",")]
torch.set_num_threads(2)

tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
layers = model.model.layers
STOP = max(LAYERS) + 1


class Stop(Exception):
    pass


def stop_hook(*_):
    raise Stop


MODS = ["self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"]
sums: dict = {}
current = [None]


def hook_for(key):
    def hook(_m, args):
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        k = (current[0], key)
        if k not in sums:
            sums[k] = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
        sums[k].addmm_(x.t(), x)

    return hook


for li in LAYERS:
    for m in MODS:
        layers[li].get_submodule(m).register_forward_pre_hook(hook_for((li, m)))
if len(layers) > STOP:
    layers[STOP].register_forward_pre_hook(stop_hook)


def run(label, seqs):
    current[0] = label
    t = time.time()
    for s in seqs:
        with torch.no_grad(), contextlib.suppress(Stop):
            model(torch.tensor([s]))
    print(f"{label}: {len(seqs)} seqs, {time.time() - t:.0f} s", flush=True)


stdlib = Path(__import__("sysconfig").get_paths()["stdlib"])
eval_text = "".join((stdlib / n).read_text()[:20000] for n in ("textwrap.py", "argparse.py", "pathlib.py"))
eval_ids = tok(eval_text)["input_ids"][:2048]
cal_ids = tok(builtin_text("code", 16384).text)["input_ids"][:16384]
run("eval", [eval_ids])
run("c256", [cal_ids[i : i + 256] for i in range(0, 8192, 256)])
# cumulative snapshots of the 2048-long sequences: 8k, then 16k
seq2048 = [cal_ids[i : i + 2048] for i in range(0, 16384, 2048)]
run("c2048_8k", seq2048[:4])
run("c2048_8k_b", seq2048[4:])
for k in [k for k in sums if k[0] == "c2048_8k"]:
    sums[("c2048_16k", k[1])] = sums[k] + sums[("c2048_8k_b", k[1])]

from weightsmith.quant import int4, int4_search  # noqa: E402
from weightsmith.schemes.base import Grid  # noqa: E402

G = 128


def grid_from_shrink(W, shrink):
    x = np.ascontiguousarray(W.numpy())
    n, cols = x.shape
    mode = int4.mode_of(x.dtype)
    scale = np.empty((n, cols // G), np.float32)
    zp = np.zeros((n, cols // G), np.int8)
    packed = np.empty((n, cols // int4.PACK), np.uint32)
    assert int4.quantize_rows(int4.kernel_input(x), mode, G, True, shrink, packed, scale, zp) < 0
    return Grid(int4.scale_storage(scale, mode), None, G, int4.Q_MIN, int4.Q_MAX)


def shrink_wmse(W):
    x = np.ascontiguousarray(W.numpy())
    shrink = np.ones((x.shape[0], x.shape[1] // G), np.float32)
    int4_search.search_mse(int4.kernel_input(x), int4.mode_of(x.dtype), G, shrink, True, int4_search.MAGNITUDE)
    return shrink


for li in LAYERS:
    for m in MODS:
        W = layers[li].get_submodule(m).weight.detach().float()
        He = sums[("eval", (li, m))]
        norm = torch.einsum("ij,jk,ik->", W.double(), He, W.double()).item()

        def cost(Q, H, W=W):
            E = (W - Q).double()
            return torch.einsum("ij,jk,ik->", E, H, E).item()

        base = None
        line = [f"L{li:2d} {m:17s}"]
        Hc256 = (2 * sums[("c256", (li, m))] / 32).float()
        Hc16 = (2 * sums[("c2048_16k", (li, m))] / 8).float()
        grids = {
            "rtn": grid_from_shrink(W, np.ones((W.shape[0], W.shape[1] // G), np.float32)),
            "wmse": grid_from_shrink(W, shrink_wmse(W)),
            "hdiag": grid_from_shrink(W, hdiag_shrink(W.numpy(), torch.diagonal(Hc16).numpy(), G)),
        }
        for gname, grid in grids.items():
            _, Wr, _ = quantize_weight(W, torch.eye(W.shape[1]), grid, 0.0, 128, "none")
            c = cost(Wr, He)
            if base is None:
                base = c
                line.append(f"rtn {c / norm:.3e}")
            else:
                line.append(f"{gname}: {c / base:.3f}")
            variants = [("c256", Hc256, 0.01), ("c2048_16k", Hc16, 0.01)]
            if gname == "rtn":
                variants += [
                    ("c256", Hc256, 0.1),
                    ("c2048_8k", (2 * sums[("c2048_8k", (li, m))] / 4).float(), 0.01),
                    ("c2048_16k", Hc16, 0.1),
                ]
            for cal, H, damp in variants:
                _, Wg, sing = quantize_weight(W, H.clone(), grid, damp, 128, "static")
                line.append(f"{gname}+g[{cal}/{damp}]: {cost(Wg, He) / base:.3f}" + ("!" if sing else ""))
        print("  ".join(line), flush=True)
