"""Live progress on the terminal while a benchmark runs (rich), one summary line per visit.

Benchmarks take long enough that a silent terminal gets killed; a running line per visit also lets
a person see drift or a misbehaving arm before the run ends.
"""

from __future__ import annotations

import statistics
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from weightsmith.bench.results import VISIT_OK, RequestRecord, VisitResult
from weightsmith.bench.schedule import Visit
from weightsmith.core.terminal import markup_safe


class RichProgress:
    """A `runner.Observer` that draws two bars (visits, requests) and logs each visit."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._visits: TaskID | None = None
        self._requests: TaskID | None = None
        self._arm = ""

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def run_started(self, visits: int, requests_per_visit: int) -> None:
        """Create the bars."""
        self._visits = self.progress.add_task("visits", total=visits)
        self._requests = self.progress.add_task("requests", total=requests_per_visit)

    def visit_started(self, visit: Visit, index: int) -> None:
        """Name the visit and reset the request bar."""
        self._arm = visit.arm
        if self._visits is not None:
            description = f"[bold]{markup_safe(visit.arm)}[/] repeat {visit.repeat + 1}"
            self.progress.update(self._visits, description=description)
        if self._requests is not None:
            self.progress.reset(self._requests, description="starting")

    def phase(self, text: str) -> None:
        """Show what the visit is doing now."""
        if self._requests is not None:
            self.progress.update(self._requests, description=markup_safe(text))

    def request_done(self, record: RequestRecord) -> None:
        """Advance, showing the latest request's numbers."""
        if self._requests is None:
            return
        if record.ok:
            rate = f"{record.decode_tok_s:.1f} tok/s" if record.decode_tok_s else "–"
            ttft = f"{record.ttft_s * 1000:.0f} ms" if record.ttft_s is not None else "–"
            text = f"measuring · last {record.target_tokens}-token prompt: TTFT {ttft}, {rate}"
        else:
            text = f"measuring · last request failed: {markup_safe(record.error)}"
        self.progress.update(self._requests, advance=1, description=text)

    def visit_finished(self, result: VisitResult) -> None:
        """One line per visit: status, median decode rate and TTFT, acceptance."""
        if self._visits is not None:
            self.progress.advance(self._visits)
        ok = [r for r in result.requests if r.ok]
        parts = [f"{markup_safe(result.arm)} repeat {result.repeat + 1}:"]
        if result.status != VISIT_OK:
            parts.append(f"[red]{result.status}[/]" + (f" ({markup_safe(result.failure)})" if result.failure else ""))
        decode = [r.decode_tok_s for r in ok if r.decode_tok_s]
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        if decode:
            parts.append(f"decode median {statistics.median(decode):.1f} tok/s")
        if ttft:
            parts.append(f"TTFT median {statistics.median(ttft) * 1000:.0f} ms")
        if result.spec is not None:
            if result.spec.mean_acceptance_length is not None:
                parts.append(f"mean acceptance length {result.spec.mean_acceptance_length:.2f}")
            else:
                parts.append(f"acceptance {result.spec.status}")
        parts.append(f"({len(ok)}/{len(result.requests)} requests ok)")
        self.console.print(" ".join(parts), highlight=False)

    def message(self, text: str) -> None:
        """A warning line above the bars."""
        self.console.print(f"[yellow]{markup_safe(text)}[/]", highlight=False, soft_wrap=True)
