"""The `eval` result as one typed object: JSON with a schema version, or tables on a terminal."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

from rich.console import Console, JustifyMethod
from rich.table import Table

from weightsmith.core.jsonable import jsonable
from weightsmith.core.terminal import printable
from weightsmith.core.version import __version__
from weightsmith.fidelity.calibrated_on import CalibrationOverlap
from weightsmith.fidelity.logits import FAILED, OK, LogitsReport
from weightsmith.fidelity.weights import ErrorSummary, LayerError, WeightReport

SCHEMA = "weightsmith.eval"
SCHEMA_VERSION = 1
#: Piped output gets a wide virtual terminal so tables are never cut to 80 columns. Module names and
#: config strings come from the checkpoint: no markup, and every line goes through `printable`.
console = Console(
    highlight=False, soft_wrap=True, markup=False, emoji=False, width=None if sys.stdout.isatty() else 160
)


@dataclass
class EvalReport:
    """Everything `weightsmith eval` measured for one ORIG/QUANT pair."""

    orig: str
    quant: str
    weights: WeightReport
    logits: LogitsReport
    #: The text the models read against each calibration record of QUANT's manifest (`calibrated_on`):
    #: empty when QUANT records no calibration, None when the models read no text.
    calibration_overlap: list[CalibrationOverlap] | None = None
    #: Why the weight error does not measure quantization alone (QUANT's weights were transformed
    #: before quantizing, e.g. by `--pre-pass sinq`), or None.
    weights_caveat: str | None = None
    weightsmith_version: str = __version__
    schema: str = SCHEMA
    schema_version: int = SCHEMA_VERSION


def to_json(report: EvalReport) -> str:
    """The report as JSON, schema and version first so a reader can check them before anything else."""
    doc = jsonable(report)
    head = {key: doc.pop(key) for key in ("schema", "schema_version")}
    return json.dumps(head | doc, indent=2, allow_nan=False)


def fmt_rel(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3e}"


def fmt_db(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def category_table(weights: WeightReport) -> Table:
    table = Table(title="weight error by category", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("category", "left"), ("layers", "right"), ("params", "right"))
    for col, justify in columns:
        table.add_column(col, justify=justify)
    table.add_column("rel MSE", justify="right")
    table.add_column("SQNR dB", justify="right")

    def row(s: ErrorSummary, style: str | None = None) -> None:
        table.add_row(s.name, str(s.layers), f"{s.numel:,}", fmt_rel(s.rel_mse), fmt_db(s.sqnr_db), style=style)

    for summary in weights.categories:
        row(summary)
    row(weights.overall, style="bold")
    return table


def layer_table(layers: list[LayerError], shown: int) -> Table:
    worst = sorted(layers, key=lambda layer: (-layer.rel_mse, layer.module))
    if shown > 0:
        worst = worst[:shown]
    title = "weight error by layer" if len(worst) == len(layers) else f"weight error: worst {len(worst)} layers"
    table = Table(title=title + f" of {len(layers)}", title_justify="left")
    for col in ("layer", "category", "shape"):
        table.add_column(col, overflow="fold")
    table.add_column("rel MSE", justify="right")
    table.add_column("SQNR dB", justify="right")
    for layer in worst:
        shape = "x".join(map(str, layer.shape))
        table.add_row(printable(layer.module), layer.category, shape, fmt_rel(layer.rel_mse), fmt_db(layer.sqnr_db))
    return table


def logits_line(logits: LogitsReport) -> str:
    if logits.status == OK:
        assert logits.kl is not None and logits.top1_agreement is not None
        return (
            f"logits ({logits.tokens} tokens of {logits.text_source}): KL {logits.kl:.4f} nats, "
            f"top-1 agreement {100 * logits.top1_agreement:.1f} %, "
            f"perplexity {logits.ppl_orig:.3f} -> {logits.ppl_quant:.3f} ({logits.seconds:.1f} s)"
        )
    label = "FAILED" if logits.status == FAILED else logits.status
    return f"logits: {label}: {logits.reason}"


def print_report(report: EvalReport, shown_layers: int, out: Console = console) -> None:
    """Category table, worst layers, unsupported formats, then the logits line."""
    w = report.weights
    out.print(
        printable(
            f"{report.quant} against {report.orig} ({w.source_format} original): "
            f"{len(w.layers)} quantized layers measured, {len(w.kept)} 2-D weights kept unquantized; "
            f"{_mb(w.bytes_read)} read in {w.seconds:.2f} s"
        )
    )
    if w.layers:
        out.print(category_table(w))
        out.print(layer_table(w.layers, shown_layers))
    by_format: dict[str, list[str]] = {}
    for u in w.unsupported:
        by_format.setdefault(f"{u.format}: {u.reason}", []).append(u.module)
    for what, modules in by_format.items():
        out.print(printable(f"format not supported yet, {len(modules)} layers not measured ({what})"))
    out.print(printable(logits_line(report.logits)))
