"""docs/bench-vllm-sample/: quantized drafts against their BF16 self in real vLLM speculative decoding.

The target is SmolLM2-135M served in BF16 by vLLM's CPU build; each draft is the same model, as it is
(BF16) or written by `weightsmith quantize` (W4A16 round-to-nearest, W4A16 with the default scale
search, W4A16 asymmetric, W4A16 GPTQ, W8A8), proposed with `method = "draft_model"` at
num_speculative_tokens 1, 3 and 5, plus the target alone as the speed baseline. `weightsmith bench run`
measures every arm (acceptance from vLLM's own counters); `weightsmith eval` measures each draft's
offline fidelity against the target (KL and top-1 agreement), and the sample's README says where
the two orders agree.

    make bench-vllm-sample     # or: .venv/bin/python scripts/bench_vllm_sample.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from scipy.stats import spearmanr  # noqa: E402

import vllm_cpu  # noqa: E402
from models import smollm2_fp32  # noqa: E402
from weightsmith.bench import stats  # noqa: E402
from weightsmith.bench.analysis import Analysis, analyse, per_prompt_acceptance  # noqa: E402
from weightsmith.bench.results import BenchResults, load_results  # noqa: E402

OUT = REPO / "docs" / "bench-vllm-sample"
WS = [sys.executable, "-m", "weightsmith"]
G64 = ["--group-size", "64"]  # SmolLM2's 576 columns: group 128 would leave every 576-wide Linear in BF16
#: draft name -> `weightsmith quantize` flags (none: the target's own weights)
DRAFTS: dict[str, list[str]] = {
    "bf16": [],
    "w4a16-rtn": ["--scheme", "w4a16", *G64, "--scale-search", "none"],
    "w4a16": ["--scheme", "w4a16", *G64, "--pre-pass", "none"],
    "w4a16-asym": ["--scheme", "w4a16-asym", *G64, "--pre-pass", "none"],
    "w4a16-gptq": ["--scheme", "w4a16", *G64, "--method", "gptq", "--builtin", "prose", "--tokens", "512"],
    "w8a8": ["--scheme", "w8a8"],
}
KS = (1, 3, 5)
SERVER = (
    "$VLLM_PY -m vllm.entrypoints.openai.api_server --model $TARGET --port {port}\n"
    "             --max-model-len 1024 --dtype bfloat16 --enforce-eager --seed 0 --distributed-executor-backend uni"
)


def env_name(draft: str) -> str:
    return "DRAFT_" + draft.upper().replace("-", "_")


def workload_lines(prompts_per_length: int, max_tokens: int, note: str = "") -> list[str]:
    """The arms file's `[workload]` and `[determinism]` tables of both vLLM samples: 64-token prompts
    sent one at a time (so each request carries its own acceptance counts), no determinism study."""
    return [
        "[workload]",
        "prompt_tokens = [64]",
        f"prompts_per_length = {prompts_per_length}{note}",
        f"max_tokens = {max_tokens}",
        "concurrency = 1",
        'endpoint = "completions"',
        "",
        "[determinism]",
        "replicates = 0",
    ]


def arms_file() -> str:
    """The arms file the sample runs, with the paths as environment variables (the README's command)."""
    lines = [
        "# docs/bench-vllm-sample: SmolLM2-135M (BF16) in vLLM CPU, drafted for by itself and by its",
        "# quantizations (scripts/bench_vllm_sample.py writes this file and sets the variables).",
        "",
        "repeats = 2          # visits per arm, counterbalanced: the noise floor",
        "warmups = 1          # requests per visit, discarded",
        'baseline = "plain"',
        'acceptance_baseline = "bf16-draft"   # each draft against the target drafting for itself, per k',
        "",
        *workload_lines(6, 32, "  # 6 matched prompts: the fewest with which a sign test can reach p < 0.05"),
        "",
        "[[arms]]",
        'name = "plain"',
        f'command = """{SERVER}"""',
        'env = { VLLM_CPU_KVCACHE_SPACE = "1" }',
    ]
    return "\n".join(lines + draft_arms(DRAFTS, "draft_model")) + "\n"


def draft_arms(drafts: Iterable[str], method: str) -> list[str]:
    """One arm per draft, proposing through vLLM's `method`, swept over KS; its path in `$DRAFT_<NAME>`."""
    lines: list[str] = []
    for draft in drafts:
        spec = f'{{"method": "{method}", "model": "${env_name(draft)}", "num_speculative_tokens": 3}}'
        lines += [
            "",
            "[[arms]]",
            f'name = "{draft}-draft"',
            f'command = """{SERVER}\n             --speculative-config \'{spec}\'"""',
            'env = { VLLM_CPU_KVCACHE_SPACE = "1" }',
            "[arms.sweep]",
            'flag = "--speculative-config"',
            'key = "num_speculative_tokens"',
            f"values = {list(KS)}",
        ]
    return lines


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def build_drafts(target: Path, work: Path) -> dict[str, Path]:
    paths = {}
    for draft, flags in DRAFTS.items():
        if not flags:
            paths[draft] = target
            continue
        out = work / "drafts" / draft
        if not (out / "config.json").exists():
            print(f"quantize {draft}", flush=True)
            run([*WS, "quantize", str(target), str(out), *flags])
        paths[draft] = out
    return paths


def fidelity(target: Path, drafts: dict[str, Path]) -> dict[str, dict[str, float]]:
    """KL and top-1 agreement of each quantized draft against the target (`weightsmith eval`)."""
    found = {}
    for draft, path in drafts.items():
        if path == target:
            continue
        print(f"eval {draft}", flush=True)
        report = json.loads(run([*WS, "eval", str(target), str(path), "--json"]).stdout)
        logits = report["logits"]
        found[draft] = {"kl": logits["kl"], "top1_agreement": logits["top1_agreement"]}
    return found


def _arm(draft: str, k: int) -> str:
    return f"{draft}-draft@num_speculative_tokens={k}"


def _verdict(c: stats.PairedComparison | None) -> str:
    if c is None:
        return "–"
    if c.verdict == stats.SHOWN:
        return f"**{'higher' if c.arm_better else 'lower'}** ({c.effect:+.1%}, p={c.sign_p:.2g})"
    return f"not shown ({c.effect:+.1%})" if c.effect is not None else "not shown"


def acceptance_cells(analysis: Analysis, draft: str) -> list[str]:
    """Per k: the draft's mean acceptance length (accepted/drafted), and against the BF16 draft's."""
    acc = {a.arm: a for a in analysis.acceptance}
    against_bf16 = {c.arm: c for c in analysis.acceptance_comparisons}
    cells = []
    for k in KS:
        a = acc.get(_arm(draft, k))
        if a is None or a.mean_acceptance_length is None:
            cells.append(f"{a.status if a else 'missing'}")
            continue
        text = f"{a.mean_acceptance_length:.2f} ({a.accepted:.0f}/{a.draft_tokens:.0f})"
        if draft != "bf16":
            text += f", vs BF16: {_verdict(against_bf16.get(_arm(draft, k)))}"
        cells.append(text)
    return cells


def noise_line(analysis: Analysis) -> str:
    floor = analysis.acceptance_noise
    return "Noise floor of per-prompt acceptance (largest gap between an arm's two repeats): " + (
        f"{floor.value:.1%} (in `{floor.arm}`)" if floor and floor.value is not None else "none"
    )


def decode_table(analysis: Analysis, drafts: Iterable[str]) -> list[str]:
    """Each draft's decode rate against the target alone, per k, with its verdict."""
    decode = {c.arm: c for c in analysis.comparisons if c.metric == "decode_tok_s"}
    lines = ["| draft | " + " | ".join(f"k={k}: decode vs target alone" for k in KS) + " |", "|---|" + "---|" * len(KS)]
    for draft in drafts:
        cells = []
        for k in KS:
            c = decode.get(_arm(draft, k))
            cells.append("–" if c is None or c.effect is None else f"{c.effect:+.0%} ({c.verdict})")
        lines.append(f"| {draft} | " + " | ".join(cells) + " |")
    return lines


def run_bench(out: Path, work: Path, env: dict[str, str]) -> None:
    """`weightsmith bench run` on `out`/arms.toml into `work`/run, its results copied into `out` with run.json."""
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.monotonic()
    subprocess.run([*WS, "bench", "run", str(out / "arms.toml"), "--out", str(run_dir)], check=True, env=env)
    minutes = (time.monotonic() - start) / 60
    for f in run_dir.iterdir():
        if f.suffix in (".json", ".md", ".png"):
            shutil.copy(f, out / f.name)
    (out / "run.json").write_text(json.dumps({"minutes": round(minutes, 1), "isa": vllm_cpu.isa()}) + "\n")


def sample_arguments(doc: str, keep: str) -> argparse.Namespace:
    """A sample script's command line: where its drafts and run are kept, or only its summary rewritten."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--keep", type=Path, default=REPO / ".cache" / keep, help="drafts and the run")
    ap.add_argument("--summary-only", action="store_true", help="rewrite summary.md from the committed results")
    return ap.parse_args()


def bench_env(target: Path, drafts: dict[str, Path]) -> dict[str, str]:
    """The arms file's variables: vLLM's interpreter, the target, each draft's `$DRAFT_<NAME>`."""
    env = {**os.environ, "VLLM_PY": str(vllm_cpu.PYTHON), "TARGET": str(target)}
    env.update({env_name(d): str(p) for d, p in drafts.items()})
    return env


def summary(results: BenchResults, fid: dict[str, dict[str, float]]) -> str:
    """The sample's tables: acceptance per draft and k with verdicts against the BF16 draft, decode rate
    against the target alone, and how acceptance orders the drafts against offline KL and top-1."""
    analysis = analyse(results)
    acc = {a.arm: a for a in analysis.acceptance}
    floor = analysis.acceptance_noise
    lines = [
        "| draft | KL (nats) | top-1 | " + " | ".join(f"k={k}: mean acceptance length" for k in KS) + " |",
        "|---|---|---|" + "---|" * len(KS),
    ]
    for draft in DRAFTS:
        f = fid.get(draft, {"kl": 0.0, "top1_agreement": 1.0})
        cells = acceptance_cells(analysis, draft)
        lines.append(f"| {draft} | {f['kl']:.3f} | {f['top1_agreement']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", noise_line(analysis), "", *decode_table(analysis, DRAFTS)]
    per_prompt, _ = per_prompt_acceptance(results)
    lines += [
        "",
        "| k | Spearman (acceptance, -KL) | Spearman (acceptance, top-1) | pairs ordered apart |",
        "|---|---|---|---|",
    ]
    quantized = [d for d in DRAFTS if d in fid]
    for k in KS:
        length = {d: acc[_arm(d, k)].mean_acceptance_length for d in quantized if _arm(d, k) in acc}
        ds = [d for d in quantized if length.get(d) is not None]
        rho_kl = spearmanr([length[d] for d in ds], [-fid[d]["kl"] for d in ds]).statistic
        rho_top1 = spearmanr([length[d] for d in ds], [fid[d]["top1_agreement"] for d in ds]).statistic
        apart = []
        for i, x in enumerate(ds):
            for y in ds[i + 1 :]:
                by_kl = fid[x]["kl"] < fid[y]["kl"]
                by_acc = length[x] > length[y]  # type: ignore[operator]
                if by_kl != by_acc:
                    c = stats.compare_paired(
                        "acceptance_length",
                        _arm(x, k),
                        _arm(y, k),
                        per_prompt[_arm(x, k)],
                        per_prompt[_arm(y, k)],
                        noise=floor.value if floor else None,
                    )
                    apart.append(f"{x}/{y} ({c.verdict}, {c.effect:+.1%})" if c.effect is not None else f"{x}/{y}")
        lines.append(f"| {k} | {rho_kl:.2f} | {rho_top1:.2f} | {'; '.join(apart) or 'none'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = sample_arguments(__doc__ or "", "bench-vllm-sample")
    if args.summary_only:
        fid = json.loads((OUT / "fidelity.json").read_text())
        (OUT / "summary.md").write_text(summary(load_results(OUT / "results.json"), fid))
        return
    vllm_cpu.require()
    target = smollm2_fp32()
    work: Path = args.keep
    work.mkdir(parents=True, exist_ok=True)
    drafts = build_drafts(target, work)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fidelity.json").write_text(json.dumps(fidelity(target, drafts), indent=1) + "\n")
    (OUT / "arms.toml").write_text(arms_file())
    run_bench(OUT, work, bench_env(target, drafts))
    fid = json.loads((OUT / "fidelity.json").read_text())
    (OUT / "summary.md").write_text(summary(load_results(OUT / "results.json"), fid))
    print((OUT / "summary.md").read_text())


if __name__ == "__main__":
    main()
