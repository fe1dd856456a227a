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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import vllm_cpu  # noqa: E402
from models import smollm2_fp32  # noqa: E402
from weightsmith.bench.analysis import analyse  # noqa: E402
from weightsmith.bench.results import load_results  # noqa: E402

OUT = REPO / "docs" / "bench-vllm-sample"
WS = [sys.executable, "-m", "weightsmith"]
G64 = ["--group-size", "64"]  # SmolLM2's 576 columns: group 128 would leave every 576-wide Linear in BF16
#: draft name -> `weightsmith quantize` flags (none: the target's own weights)
DRAFTS: dict[str, list[str]] = {
    "bf16": [],
    "w4a16-rtn": ["--scheme", "w4a16", *G64, "--scale-search", "none"],
    "w4a16": ["--scheme", "w4a16", *G64],
    "w4a16-asym": ["--scheme", "w4a16-asym", *G64],
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
        "[workload]",
        "prompt_tokens = [64]",
        "prompts_per_length = 6  # 6 matched prompts: the fewest with which a sign test can reach p < 0.05",
        "max_tokens = 32",
        "concurrency = 1",
        'endpoint = "completions"',
        "",
        "[determinism]",
        "replicates = 0",
        "",
        "[[arms]]",
        'name = "plain"',
        f'command = """{SERVER}"""',
        'env = { VLLM_CPU_KVCACHE_SPACE = "1" }',
    ]
    for draft in DRAFTS:
        spec = f'{{"method": "draft_model", "model": "${env_name(draft)}", "num_speculative_tokens": 3}}'
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
    return "\n".join(lines) + "\n"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, default=REPO / ".cache" / "bench-vllm-sample", help="drafts and the run")
    args = ap.parse_args()
    vllm_cpu.require()
    target = smollm2_fp32()
    work: Path = args.keep
    work.mkdir(parents=True, exist_ok=True)
    drafts = build_drafts(target, work)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fidelity.json").write_text(json.dumps(fidelity(target, drafts), indent=1) + "\n")
    (OUT / "arms.toml").write_text(arms_file())
    env = {**os.environ, "VLLM_PY": str(vllm_cpu.PYTHON), "TARGET": str(target)}
    env.update({env_name(d): str(p) for d, p in drafts.items()})
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.monotonic()
    subprocess.run([*WS, "bench", "run", str(OUT / "arms.toml"), "--out", str(run_dir)], check=True, env=env)
    minutes = (time.monotonic() - start) / 60
    for f in run_dir.iterdir():
        if f.suffix in (".json", ".md", ".png"):
            shutil.copy(f, OUT / f.name)
    (OUT / "run.json").write_text(json.dumps({"minutes": round(minutes, 1), "isa": vllm_cpu.isa()}) + "\n")
    analysis = analyse(load_results(OUT / "results.json"))
    print(json.dumps([a.__dict__ for a in analysis.acceptance], indent=1, default=str))


if __name__ == "__main__":
    main()
