"""The card's measured sections: where the bytes are (inspect), verified (verify), fidelity (eval)."""

from __future__ import annotations

from typing import Any

from weightsmith.card.cite import Citations
from weightsmith.card.sources import EVAL_FILE, INSPECT_FILE, VERIFY_FILE, CardSources
from weightsmith.core.terminal import markdown_text
from weightsmith.io.manifest import MANIFEST_FILE

M, INS, V, E = MANIFEST_FILE, INSPECT_FILE, VERIFY_FILE, EVAL_FILE


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (a cell holds no `|` but an escaped one: `markdown_code(..., cell=True)`)."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def mb(n: float) -> str:
    return f"{n / 1e6:,.2f}"


def _bits(c: Citations, value: float | None, field: str) -> str:
    return "no parameters" if value is None else c.num(f"{value:.3f}", INS, field)


def where_bytes(src: CardSources, c: Citations) -> list[str]:
    """The inspect table by category, the manifest's before column, and the headline bits per parameter."""
    r, sizes = src.inspect, src.manifest.sizes
    before = sizes.by_category
    rows = []
    for row in r["rows"]:
        k = row["key"]
        f = f"rows[{k}]"
        was = before.get(k)
        rows.append(
            [
                k,
                c.num(f"{row['tensors']:,}", INS, f + ".tensors"),
                c.num(mb(was.bytes_before), M, f"sizes.by_category[{k}].bytes_before") if was else "not in source",
                c.num(mb(row["bytes"]), INS, f + ".bytes"),
                c.num(f"{row['share']:.1%}", INS, f + ".share"),
                c.num(f"{row['params'] / 1e6:,.2f}", INS, f + ".params") if row["params"] else "no parameters",
                _bits(c, row["bits_per_param"], f + ".bits_per_param"),
                _bits(c, row["bits_with_overhead"], f + ".bits_with_overhead"),
            ]
        )
    rows.append(
        [
            "**total**",
            c.num(f"{r['tensors']:,}", INS, "tensors"),
            c.num(mb(sizes.bytes_before), M, "sizes.bytes_before"),
            c.num(mb(r["tensor_bytes"]), INS, "tensor_bytes"),
            "100%",
            c.num(f"{r['params'] / 1e6:,.2f}", INS, "params"),
            _bits(c, r["bits_per_param"], "bits_per_param"),
            "",
        ]
    )
    header = ["category", "tensors", "MB before", "MB after", "share", "params (M)", "bits/param", "incl. scales"]
    before_bits, after_bits = sizes.bits_per_parameter_before, sizes.bits_per_parameter_after
    lines = [
        "From `weightsmith inspect` on this folder (headers only; packed weights counted as the values they "
        f"hold; scales folded into *incl. scales*), kept in `{INS}`; the *before* column is the source checkpoint, "
        f"from `{M}`.",
        "",
        *table(header, rows),
        "",
        f"Tensor data {c.num(mb(sizes.bytes_before), M, 'sizes.bytes_before')} MB before, "
        f"{c.num(mb(sizes.bytes_after), M, 'sizes.bytes_after')} MB after "
        f"({c.num(format(sizes.gib_saved, '.4f'), M, 'sizes.gib_saved')} GiB saved); on disk "
        f"{c.num(mb(r['file_bytes']), INS, 'file_bytes')} MB in {c.num(str(r['shards']), INS, 'shards')} shard(s).",
    ]
    if before_bits is not None and after_bits is not None:
        lines[-1] += (
            f" Bits per parameter {c.num(format(before_bits, '.4f'), M, 'sizes.bits_per_parameter_before')} before, "
            f"{c.num(format(after_bits, '.4f'), M, 'sizes.bits_per_parameter_after')} after, over "
            f"{c.num(format(sizes.parameters, ','), M, 'sizes.parameters')} parameters."
        )
    return lines


def _status(check: dict[str, Any]) -> str:
    if not check["ran"]:
        return "skipped"
    return "FAIL" if check["errors"] else ("warnings" if check["warnings"] else "ok")


def verified(src: CardSources, c: Citations) -> list[str]:
    """The verify summary, family by family, with what each family looked at."""
    v = src.verify
    verdict = "clean" if v["clean"] else "**not clean**"
    lines = [
        f"`weightsmith verify` when this card was written (kept in `{V}`): {verdict}, "
        f"{c.num(format(v['errors'], ','), V, 'errors')} error(s), "
        f"{c.num(format(v['warnings'], ','), V, 'warnings')} warning(s).",
        "",
    ]
    rows = [
        [
            ch["title"],
            _status(ch),
            c.num(str(ch["errors"]), V, f"checks[{ch['id']}].errors"),
            c.num(str(ch["warnings"]), V, f"checks[{ch['id']}].warnings"),
            c.text(ch["scope"], V, f"checks[{ch['id']}].scope", cell=True),
        ]
        for ch in v["checks"]
    ]
    lines += table(["check family", "result", "errors", "warnings", "covered"], rows)
    for i, finding in enumerate(v["findings"][:10]):
        lines.append(f"- {finding['severity']}: {c.text(finding['message'], V, f'findings[{i}].message')}")
    return lines


def _error_row(c: Citations, s: dict[str, Any], field: str) -> list[str]:
    rel = "not measured" if s["rel_mse"] is None else c.num(f"{s['rel_mse']:.3e}", E, field + ".rel_mse")
    db = "not measured" if s["sqnr_db"] is None else c.num(f"{s['sqnr_db']:.2f}", E, field + ".sqnr_db")
    return [
        markdown_text(s["name"], cell=True),
        c.num(str(s["layers"]), E, field + ".layers"),
        c.num(f"{s['numel'] / 1e6:,.2f}", E, field + ".numel"),
        rel,
        db,
    ]


def fidelity(src: CardSources, c: Citations) -> list[str]:
    """The eval tables: weight error by category and overall, then the logits comparison."""
    ev = src.eval
    assert ev is not None
    w, lg = ev["weights"], ev["logits"]
    rows = [_error_row(c, s, f"weights.categories[{s['name']}]") for s in w["categories"]]
    rows.append(_error_row(c, w["overall"], "weights.overall"))
    lines = [
        f"`weightsmith eval` of this checkpoint against its original (`{E}`): weight error of every quantized "
        "Linear weight against the original, as the compressed-tensors decompressor rebuilds it.",
        "",
        *table(["category", "layers", "params (M)", "relative MSE", "SQNR dB"], rows),
        "",
    ]
    if lg["status"] == "ok":
        lines.append(
            f"Both models run in transformers on {c.num(str(lg['tokens']), E, 'logits.tokens')} tokens of "
            f"{c.text(lg['text_source'], E, 'logits.text_source')}: KL(original ‖ quantized) "
            f"{c.num(format(lg['kl'], '.4f'), E, 'logits.kl')} nats per token, top-1 agreement "
            f"{c.num(format(100 * lg['top1_agreement'], '.1f'), E, 'logits.top1_agreement')} %, perplexity "
            f"{c.num(format(lg['ppl_orig'], '.3f'), E, 'logits.ppl_orig')} (original) and "
            f"{c.num(format(lg['ppl_quant'], '.3f'), E, 'logits.ppl_quant')} (quantized)."
        )
    else:
        lines.append(
            f"Logits were not compared ({c.text(lg['status'], E, 'logits.status')}: "
            f"{c.text(lg.get('reason') or 'no reason given', E, 'logits.reason')})."
        )
    return lines
