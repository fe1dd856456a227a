"""docs/budget-study/README.md and kl-vs-bits.png from docs/budget-study/results.json (scripts/budget_study.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from scipy.stats import spearmanr

MARKERS = {"budget fisher": "o-", "budget activation": "s--", "budget weight": "^:", "uniform": "D", "even": "x-",
           "hand": "P"}  # fmt: skip


def _at(arms: list[dict[str, Any]], kind: str, step: float) -> dict[str, Any] | None:
    return next((a for a in arms if a["kind"] == kind and a["step"] == step), None)


def _best_uniform(arms: list[dict[str, Any]], bits: float) -> dict[str, Any] | None:
    """The uniform or evenly spread recipe of lowest KL among those within `bits`."""
    fits = [a for a in arms if a["kind"] in ("uniform", "even") and a["bits"] <= bits + 1e-9]
    return min(fits, key=lambda a: a["kl"], default=None)


def targets(model: dict[str, Any]) -> list[str]:
    """The issue's targets, each with its figures and whether it holds."""
    arms, base = model["arms"], model["base"]
    default = next(a for a in arms if a["arm"] == f"uniform {base}")
    lines = []
    at0, at5 = _at(arms, "budget fisher", 0.0), _at(arms, "budget fisher", 0.5)
    if at0 is not None:
        ok = at0["kl"] <= default["kl"] * (1 + 1e-9)
        lines.append(f"- at the default's bits ({default['bits']:.4f}): budget KL {at0['kl']:.5f} vs the default's "
                     f"{default['kl']:.5f}: {'holds' if ok else 'FAILS'}")  # fmt: skip
    if at5 is not None:
        ratio = at5["kl"] / default["kl"]
        rival = _best_uniform(arms, at5["bits"])
        lines.append(f"- at +0.5 bits ({at5['bits']:.4f}): budget KL {at5['kl']:.5f} = {ratio:.3f}x the default's "
                     f"(target <= 0.8x): {'holds' if ratio <= 0.8 else 'FAILS'}")  # fmt: skip
        if rival is not None:
            ok = at5["kl"] < rival["kl"]
            lines.append(f"- at +0.5 bits: best uniform or evenly spread recipe within the same bits is "
                         f"'{rival['arm']}' ({rival['bits']:.4f} bits, KL {rival['kl']:.5f}): budget "
                         f"{'below it, holds' if ok else 'NOT below it, FAILS'}")  # fmt: skip
    return lines


def plot(done: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(done), figsize=(6.5 * len(done), 4.6), squeeze=False, constrained_layout=True)
    for ax, model in zip(axes[0], done.values(), strict=True):
        arms = model["arms"]
        for kind, style in MARKERS.items():
            mine = sorted((a for a in arms if a["kind"] == kind and a["bits"] < model["base_bits"] + 1.65),
                          key=lambda a: a["bits"])  # fmt: skip
            if not mine:
                continue
            ax.plot([a["bits"] for a in mine], [a["kl"] for a in mine], style, label=kind, ms=5)
            if kind in ("uniform", "hand"):
                for a in mine:
                    ax.annotate(a["arm"].replace("uniform ", "").replace("hand: ", ""), (a["bits"], a["kl"]),
                                fontsize=6, xytext=(3, 3), textcoords="offset points")  # fmt: skip
        ax.set_xlim(model["base_bits"] - 0.1, model["base_bits"] + 1.65)  # uniform W8A16 (8.25 bits) in the table
        ax.set_yscale("log")
        ax.set_xlabel("bits per Linear weight (inspect's bits_with_overhead)")
        ax.set_ylabel("KL per token (nats), vs the source")
        ax.set_title(model["model"], fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(done: dict[str, Any], docs: Path) -> None:
    plot(done, docs / "kl-vs-bits.png")
    out = [
        "# KL against bits: the budget against uniform recipes",
        "",
        "Regenerate with `make budget-study` (scripts/budget_study.py; the tables and checkpoints are cached in",
        ".cache/budget-study). Each arm is quantized by `weightsmith quantize` and judged by the KL of its",
        "next-token distribution against the source's on 2048 tokens of standard-library code (textwrap, argparse,",
        "pathlib) that the calibration (2048 tokens of the built-in code text) never reads; logits from the",
        "checkpoint as compressed-tensors decompresses it. Bits are inspect's bits_with_overhead over the Linears,",
        "read back from each written checkpoint (`inspect_bits` in results.json): on SmolLM2 every arm's equals the",
        "budget's figure to the last bit; on Qwen inspect's is 0.0005 bits higher for every arm, its q/k/v biases",
        "(kept as stored, the same in every candidate), which the budget leaves out and inspect counts.",
        "",
        "At the default's own bits no candidate is cheaper than group 128 on Qwen, so the budget is the default",
        "itself; on SmolLM2 the default is group 64 (128 does not divide its 576-wide inputs) and down_proj can",
        "take group 128, which pays for group 32 elsewhere. The sensitivity tables were measured while the two",
        "cores were shared with other work (the times below are wall times under that load). Each model's",
        "folder holds what `weightsmith sensitivity --avg-bits` writes for the budget at + 0.5 bits.",
        "",
        "Both models reach us already rounded by GGUF: SmolLM2 by Q4_1 (asymmetric groups of 32), Qwen by Q4_K_M",
        "(asymmetric groups of 32 in super-blocks, some tensors Q6_K). Small asymmetric groups can land close to",
        "that grid, so group 32 looks better here than it would on a model trained in BF16; the SINQ pre-pass",
        "rescales the columns first, which moves the weights off that grid again.",
        "",
        "![KL against bits](kl-vs-bits.png)",
        "",
    ]
    for model in done.values():
        arms = model["arms"]
        out += [f"## {model['model']}", "",
                f"Uniform default: `{model['base']}` at {model['base_bits']:.4f} bits; sensitivity table measured "
                f"in {sum(model['table_seconds'].values()):.0f} s ({model['calibration_tokens']:,} calibration "
                f"tokens; per step: {model['table_seconds']}).", "", "Targets:", "", *targets(model), "",
                "| arm | bits | KL | top-1 | predicted KL (fisher) | modules |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for a in sorted(arms, key=lambda a: (a["bits"], a["kl"])):
            spread = ", ".join(f"{k} {v}" for k, v in a["modules"].items())
            out.append(f"| {a['arm']} | {a['bits']:.4f} | {a['kl']:.5f} | {a['top1']:.4f} | "
                       f"{a['predicted']['fisher']:.5f} | {spread} |")  # fmt: skip
        out += ["", "How well each measure's prediction (summed over modules) ranks the measured KL over every arm",
                "(Spearman's rho):", ""]  # fmt: skip
        kl = [a["kl"] for a in arms]
        for measure in ("fisher", "activation", "weight"):
            rho = spearmanr([a["predicted"][measure] for a in arms], kl).statistic
            out.append(f"- {measure}: {rho:.3f}")
        out.append("")
    (docs / "README.md").write_text("\n".join(out))


if __name__ == "__main__":
    docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs" / "budget-study"
    write_report(json.loads((docs / "results.json").read_text()), docs)
