"""KL against bits: `quantize --avg-bits` against uniform recipes at the same bits, on two real models.

For SmolLM2-135M (a bf16 copy of the fp32 checkpoint from its Q4_1 GGUF) and Qwen2.5-Coder-1.5B-Instruct
(bf16 from its Q4_K_M GGUF), the sensitivity table is measured once (`weightsmith.quantization.budget`:
every int4-family candidate run for real, the Fisher and activation statistics from 2048 tokens of the
built-in code text), then each arm is quantized and judged by the KL of its next-token distribution
against the source's on the fidelity study's text (2048 tokens of standard-library code the calibration
never reads), its logits from the checkpoint as compressed-tensors decompresses it (`fidelity.logits.served_logits`):

- the budget at the uniform default's bits + 0, 0.25, 0.5, 0.75, 1.0 and 1.5, choosing by the Fisher
  measure, and by the activation and the data-free weight measures at + 0.5 and + 1.0;
- uniform recipes: the default at group 128 (64 on SmolLM2, whose 576-wide inputs 128 does not divide),
  64 and 32; group sizes spread evenly over the groups (every k-th one takes the next finer candidate)
  to each budget's bits; and a hand rule, the first and last decoder layers W8A16.

Every arm's bits are read back from the written checkpoint by `inspect` (bits_with_overhead over the
Linears) and must equal what the choice predicted. Writes docs/budget-study/{results.json,README.md,
kl-vs-bits.png}; tables and outputs are cached in .cache/budget-study.

    python scripts/budget_study.py [--model smollm2|qwen]...   (or: make budget-study)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

from smollm2_fidelity import TOKENS, sample_text  # noqa: E402

from models import qwen25_coder_bf16, smollm2_fp32  # noqa: E402
from weightsmith.audit.inspect import inspect  # noqa: E402
from weightsmith.quantization.budget.candidates import FAMILIES, Candidate  # noqa: E402
from weightsmith.quantization.budget.choose import Choice, Group, groups_of, spend  # noqa: E402
from weightsmith.quantization.budget.plan import BudgetOptions, table_for  # noqa: E402
from weightsmith.quantization.budget.report import write_report  # noqa: E402
from weightsmith.quantization.budget.sensitivity import MEASURES, Table, read_table  # noqa: E402
from weightsmith.quantization.library import quantize  # noqa: E402
from weightsmith.quantization.request import GptqOptions, QuantizeRequest  # noqa: E402

CACHE = REPO / ".cache" / "budget-study"
DOCS = REPO / "docs" / "budget-study"
STEPS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
PROXY_STEPS = (0.5, 1.0)
#: The categories whose Linears the budget counts (inspect's words).
LINEAR_CATEGORIES = ("attention", "attention gate", "dense mlp", "routed experts", "shared expert", "other")


def smollm2_bf16() -> Path:
    """A bf16 copy of the fp32 SmolLM2 checkpoint: a weight kept as stored is then 16 bits, as on Qwen."""
    out = REPO / ".cache" / "models" / "smollm2-135m-bf16"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = smollm2_fp32()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
    tmp.rename(out)
    return out


MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct (bf16 copy of fp32 from Q4_1)", smollm2_bf16),
    "qwen": ("Qwen2.5-Coder-1.5B-Instruct (bf16 from Q4_K_M)", qwen25_coder_bf16),
}


def linear_bits(folder: Path) -> float:
    """inspect's bits_with_overhead over the Linear categories, weighted by their parameters."""
    rows = [r for r in inspect(folder).rows if r.key in LINEAR_CATEGORIES and r.params]
    return sum((r.weight_bytes + r.overhead_bytes) * 8 for r in rows) / sum(r.params for r in rows)


def with_labels(groups: list[Group], labels: list[str]) -> Choice:
    """A choice of `labels[i]` for group i (a group that cannot take it keeps its cheapest option)."""
    for g, label in zip(groups, labels, strict=True):
        g.chosen = g.option(label) or min(g.options, key=lambda o: (o.bits, o.cost))
    return Choice(groups, 0.0, "")


def even(groups: list[Group], ladder: list[str], target: float) -> list[str]:
    """Group sizes spread evenly: between the ladder's two rungs around `target` bits, every k-th group
    (Bresenham over the checkpoint's order) takes the finer rung, with the largest share that fits."""
    params = sum(g.params for g in groups)

    def bits(labels: list[str]) -> float:
        return sum((g.option(lab) or g.chosen).bits for g, lab in zip(groups, labels, strict=True)) / params

    for lo, hi in itertools.pairwise(ladder):
        if bits([hi] * len(groups)) < target:
            continue
        best = [lo] * len(groups)
        low, high = 0.0, 1.0
        for _ in range(40):
            f = (low + high) / 2
            labels = [hi if math.floor((i + 1) * f) > math.floor(i * f) else lo for i in range(len(groups))]
            if bits(labels) <= target:
                best, low = labels, f
            else:
                high = f
        return best
    return [ladder[-1]] * len(groups)


def reference(source: Path, text: str) -> tuple[Any, Any]:
    import torch

    from weightsmith.fidelity.logits import first_tokens, load_model, load_tokenizer, next_token_logits

    tok = load_tokenizer(source)
    ids = torch.tensor([first_tokens(tok, text, TOKENS, special=True)[0]])
    model = load_model(source)
    ref = next_token_logits(model, ids)
    del model
    return ids, ref


def kl_of(folder: Path, ids: Any, ref: Any) -> dict[str, float]:
    from weightsmith.fidelity.logits import kl_divergence, served_logits, top1_agreement

    logits = served_logits(folder, ids)
    return {"kl": kl_divergence(ref, logits), "top1": top1_agreement(ref, logits)}


def sensitivity_report(name: str, table: Table, cands: tuple[Candidate, ...], groups: list[Group], base: str) -> None:
    """docs/budget-study/NAME: what `weightsmith sensitivity --avg-bits` writes, for the budget at + 0.5 bits."""
    base_bits = with_labels(groups, [base] * len(groups)).avg_bits
    choice = spend(groups_of(table, "fisher", cands), base_bits + 0.5, "fisher")
    named = dataclasses.replace(table, source=MODELS[name][0])  # the model, not this machine's path
    write_report(DOCS / name, named, cands, "fisher", choice, (), force=True)


def study(name: str, cands: tuple[Candidate, ...]) -> dict[str, Any]:
    title, build = MODELS[name]
    source = build()
    work = CACHE / name
    work.mkdir(parents=True, exist_ok=True)
    table_file = work / "sensitivity.json"
    request = QuantizeRequest(source, None, gptq=GptqOptions(tokens=2048, seq_len=256))
    if table_file.exists():
        table: Table = read_table(table_file)
    else:
        table = table_for(request, BudgetOptions(), cands, measures=MEASURES, say=print)
        table_file.write_text(json.dumps(table.to_json()))
    groups = groups_of(table, "fisher", cands)
    base = next(lab for lab in ("g128", "g64") if all(g.option(lab) for g in groups))
    sensitivity_report(name, table, cands, groups, base)
    ladder = [base, *(["g64"] if base == "g128" else []), "g32", "w8a16", "kept"]
    base_bits = with_labels(groups, [base] * len(groups)).avg_bits
    arms: list[tuple[str, str, float | None, list[str]]] = []  # (arm, kind, step, labels)

    def budget(measure: str, step: float) -> list[str]:
        gs = groups_of(table, measure, cands)
        chosen = spend(gs, base_bits + step, measure)
        return [g.chosen.label for g in chosen.groups]

    for step in STEPS:
        arms.append((f"budget fisher +{step:g}", "budget fisher", step, budget("fisher", step)))
    for measure in ("activation", "weight"):
        for step in PROXY_STEPS:
            arms.append((f"budget {measure} +{step:g}", f"budget {measure}", step, budget(measure, step)))
    for lab in ladder[:3]:
        arms.append((f"uniform {lab}", "uniform", None, [lab] * len(groups)))
    for step in STEPS[1:]:
        arms.append((f"even +{step:g}", "even", step, even(groups, ladder, base_bits + step)))
    layers = sorted({int(g.name.split(".")[2]) for g in groups if g.name.startswith("model.layers.")})
    edge = {layers[0], layers[-1]}
    arms.append(("hand: first and last layers W8A16", "hand", None,
                 ["w8a16" if g.name.startswith("model.layers.") and int(g.name.split(".")[2]) in edge else base
                  for g in groups]))  # fmt: skip

    ids, ref = reference(source, sample_text(work).read_text())
    results = []
    for arm, kind, step, labels in arms:
        choice = with_labels(groups_of(table, "fisher", cands), labels)
        predicted = {m: sum(g.chosen.cost for g in with_labels(groups_of(table, m, cands), labels).groups)
                     for m in MEASURES}  # fmt: skip
        out = work / arm.replace(" ", "_").replace(":", "").replace("+", "p")
        started = time.perf_counter()
        quantize(QuantizeRequest(source, out, recipe=choice.recipe(cands), force=True, hash_sources=False))
        seconds = time.perf_counter() - started
        measured_bits = linear_bits(out)
        fidelity = kl_of(out, ids, ref)
        counts: dict[str, int] = {}
        for g in choice.groups:
            counts[g.chosen.label] = counts.get(g.chosen.label, 0) + len(g.modules)
        row = {
            "arm": arm, "kind": kind, "step": step, "bits": choice.avg_bits, "inspect_bits": measured_bits,
            "kl": fidelity["kl"], "top1": fidelity["top1"], "predicted": predicted, "modules": counts,
            "quantize_seconds": round(seconds, 2),
        }  # fmt: skip
        print(json.dumps(row), flush=True)
        results.append(row)
        shutil.rmtree(out, ignore_errors=True)
    return {"model": title, "source": str(source.relative_to(REPO)), "base": base, "base_bits": base_bits,
            "tokens": TOKENS, "table_seconds": table.seconds, "calibration_tokens": table.tokens,
            "arms": results}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=list(MODELS))
    args = parser.parse_args()
    DOCS.mkdir(parents=True, exist_ok=True)
    out_file = DOCS / "results.json"
    done = json.loads(out_file.read_text()) if out_file.exists() else {}
    for name in args.model or list(MODELS):
        done[name] = study(name, FAMILIES["int4"])
        out_file.write_text(json.dumps(done, indent=1) + "\n")
    if (REPO / "scripts" / "budget_report.py").exists():
        from budget_report import write_report

        write_report(done, DOCS)


if __name__ == "__main__":
    main()
