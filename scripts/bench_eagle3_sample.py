"""docs/bench-eagle3-sample/: a draft that accepts, quantized, served through vLLM's own EAGLE3 method.

The target is SmolLM2-135M served in BF16 by vLLM's CPU build. The draft is an EAGLE3 head trained
here for it in minutes (`scripts/eagle3_draft.py`: the target's own greedy tokens on standard-library
code, never the files the bench's prompts are cut from), then written by `weightsmith quantize`:
BF16 as trained; `--preset eagle3-draft` (W4A16 asymmetric, groups of 64: embeddings shared, q/k/v
quantized, since `llama_eagle3.py` reads no weight directly); the same with q/k/v kept BF16 (the layout
DFlash drafts need, to see what keeping them buys); W8A8. Each is proposed with `method = "eagle3"` at
num_speculative_tokens 1, 3 and 5, plus the target alone as the speed baseline, by `weightsmith bench
run` (acceptance from vLLM's own counters over each window, two counterbalanced visits per arm).

    make bench-eagle3-sample     # or: .venv/bin/python scripts/bench_eagle3_sample.py [--keep DIR]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

from bench_vllm_sample import (  # noqa: E402
    KS,
    SERVER,
    _arm,
    acceptance_cells,
    bench_env,
    decode_table,
    draft_arms,
    noise_line,
    run,
    run_bench,
    sample_arguments,
    workload_lines,
)
from eagle3_draft import BENCH_PROMPTS, BENCH_SEED, held_out_files  # noqa: E402

import vllm_cpu  # noqa: E402
from models import smollm2_fp32  # noqa: E402
from weightsmith.bench.analysis import analyse  # noqa: E402
from weightsmith.bench.config import WorkloadSpec  # noqa: E402
from weightsmith.bench.results import BenchResults, load_results  # noqa: E402

OUT = REPO / "docs" / "bench-eagle3-sample"
WS = [sys.executable, "-m", "weightsmith"]
G64 = ["--group-size", "64"]  # the midlayer's 576- and fc's 1728-column Linears: groups of 128 do not divide them
#: draft name -> `weightsmith quantize` flags over the trained BF16 draft (None: the draft as trained)
DRAFTS: dict[str, list[str] | None] = {
    "bf16": None,
    "w4a16": ["--preset", "eagle3-draft", *G64],
    # `qkv` too: vLLM builds a draft's quant config without the model's packed_modules_mapping, so it tests
    # the fused name against `ignore` (preflight's `draft.fused-ignore`)
    "w4a16-qkv-bf16": ["--preset", "eagle3-draft", *G64, "--ignore", "re:.*\\.(q|k|v|qkv)_proj$"],
    "w8a8": ["--preset", "eagle3-draft", "--scheme", "w8a8"],
}


def arms_file() -> str:
    lines = [
        "# docs/bench-eagle3-sample: SmolLM2-135M (BF16) in vLLM CPU, drafted for by an EAGLE3 head trained",
        "# for it and by its quantizations (scripts/bench_eagle3_sample.py writes this file and sets the variables).",
        "",
        "repeats = 2          # visits per arm, counterbalanced: the noise floor",
        "warmups = 1          # requests per visit, discarded",
        'baseline = "plain"',
        'acceptance_baseline = "bf16-draft"   # each quantized draft against the BF16 one, per k',
        "",
        *workload_lines(BENCH_PROMPTS, 32, "  # 6 matched prompts: a sign test can reach p < 0.05"),
        "",
        "[[arms]]",
        'name = "plain"',
        f'command = """{SERVER}"""',
        'env = { VLLM_CPU_KVCACHE_SPACE = "1" }',
    ]
    return "\n".join(lines + draft_arms(DRAFTS, "eagle3")) + "\n"


def build_drafts(work: Path) -> dict[str, Path]:
    trained = work / "drafts" / "bf16"
    if not (trained / "config.json").exists():
        print("train the EAGLE3 draft", flush=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "eagle3_draft.py"), str(trained)], check=True)
    paths = {}
    for draft, flags in DRAFTS.items():
        if flags is None:
            paths[draft] = trained
            continue
        out = work / "drafts" / draft
        if not (out / "config.json").exists():
            print(f"quantize {draft}", flush=True)
            run([*WS, "quantize", str(trained), str(out), *flags])
        paths[draft] = out
    return paths


def summary(results: BenchResults, training: dict) -> str:
    """Acceptance per draft and k (with verdicts against the BF16 draft, and per position), decode rate
    against the target alone, the noise floor, and what the prompts were held out from."""
    analysis = analyse(results)
    acc = {a.arm: a for a in analysis.acceptance}
    lines = [
        "| draft | " + " | ".join(f"k={k}: mean acceptance length (accepted/drafted)" for k in KS) + " |",
        "|---|" + "---|" * len(KS),
    ]
    lines += [f"| {draft} | " + " | ".join(acceptance_cells(analysis, draft)) + " |" for draft in DRAFTS]
    lines += ["", f"| draft | k={KS[-1]}: acceptance rate by position |", "|---|---|"]
    for draft in DRAFTS:
        a = acc.get(_arm(draft, KS[-1]))
        rates = ", ".join(f"{r:.2f}" for r in a.per_position_rate) if a and a.per_position_rate else "–"
        lines.append(f"| {draft} | {rates} |")
    lines += ["", noise_line(analysis), "", *decode_table(analysis, DRAFTS)]
    held = set(training["held_out_files"])
    sources = sorted({p.source.split(" (+")[0] for p in results.prompts})
    outside = [s for s in sources if s not in held]
    lines += [
        "",
        f"Prompts cut from {', '.join(sources)}: "
        + ("none of them in the draft's training text." if not outside else f"NOT held out: {', '.join(outside)}."),
        f"The draft: trained {training['steps']} steps on {training['sequences']} sequences of "
        f"{training['sequence_tokens']} tokens ({training['generated_sequences']} of them the target's greedy "
        f"continuations) in {training['prepare_s'] + training['train_s']:.0f} s; top-1 agreement with the "
        f"target's greedy token on held-out sequences by draft step: {training['held_out_top1_by_depth']}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = sample_arguments(__doc__ or "", "bench-eagle3-sample")
    if args.summary_only:
        training = json.loads((OUT / "training.json").read_text())
        (OUT / "summary.md").write_text(summary(load_results(OUT / "results.json"), training))
        return
    vllm_cpu.require()
    target = smollm2_fp32()
    work: Path = args.keep
    work.mkdir(parents=True, exist_ok=True)
    drafts = build_drafts(work)
    OUT.mkdir(parents=True, exist_ok=True)
    training = json.loads((drafts["bf16"] / "training.json").read_text())
    assert set(training["held_out_files"]) == held_out_files(), "the draft was trained for other prompts"
    assert WorkloadSpec().seed == BENCH_SEED, "the bench cuts its prompts with another seed than training left out"
    shutil.copy(drafts["bf16"] / "training.json", OUT / "training.json")
    (OUT / "arms.toml").write_text(arms_file())
    run_bench(OUT, work, bench_env(target, drafts))
    (OUT / "summary.md").write_text(summary(load_results(OUT / "results.json"), training))
    print((OUT / "summary.md").read_text())


if __name__ == "__main__":
    main()
