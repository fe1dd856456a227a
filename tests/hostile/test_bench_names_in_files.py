"""Names from a results file or an arm, written into the files bench makes: report.md, the plots, a server's log.

A results file is anyone's, and `bench report` renders it: its arm names, sweep parameters, quality
scenarios and server lines reach report.md, every plot's labels and (for `bench run`) each server log's
`$ command` line. An escape sequence there must not act on a terminal (in `cat report.md`, in a warning
matplotlib prints while drawing a glyph it lacks, in `less server.log`), a backquote or `|` must not end
a code span or split a table row, `$...$` must not be read as matplotlib's mathtext (which renders it as
a formula, or raises on one it cannot parse), and a log's command line must paste as exactly what ran.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import httpx
import pytest
from markdown_it import MarkdownIt
from matplotlib.mathtext import MathTextParser

from hostile.harness import Sandbox, row_cells, run_inprocess, run_subprocess
from weightsmith.bench.config import ArmSpec
from weightsmith.bench.metrics import OK, SpecWindow
from weightsmith.bench.results import (
    ArmInfo,
    BenchResults,
    DeterminismRun,
    Evidence,
    PromptInfo,
    QualityRun,
    Replicate,
    RequestRecord,
    ScenarioOutcome,
    VisitResult,
    to_jsonable,
)
from weightsmith.bench.servers import ServerError, start_server
from weightsmith.core.terminal import printable, shell_line

#: Everything at once: a terminal escape (clear screen), a code span's end, a cell break, a formula
#: mathtext would draw, and a line break that would start a heading.
NAME = "a\x1b[2J`b|c$\\frac{1}{0}$\n# d"
#: A sweep of that name over a parameter mathtext cannot parse (`\notacommand` raises there).
BASE = f"s{NAME}"
PARAM = "k$\\notacommand$"
SWEPT = [f"{BASE}@{PARAM}={v}" for v in (1, 2)]
SCENARIO = f"t`{NAME}"
CATEGORY = f"cat|{NAME}"
#: A server's log line that would end the fenced block around the log's end and start a heading.
LOG_TAIL = "loading\n```\n# injected \x1b[2J\nready"


def acted_on(text: str) -> list[str]:
    """Every character in `text`, line breaks aside, that a terminal would act on or not show."""
    return sorted({repr(ch) for ch in text if not ch.isprintable() and ch != "\n"})


def _requests(prompts: list[PromptInfo], rate: float) -> list[RequestRecord]:
    """One measured request per prompt, decoding at about `rate` tokens/s (arms differ, so verdicts are drawn)."""
    return [
        RequestRecord(p.key, p.target_tokens, p.index, ttft_s=0.02 + 0.001 * p.index, decode_tok_s=rate + p.index,
                      e2e_s=0.3, prompt_tokens=33, completion_tokens=16, token_chunks=16)
        for p in prompts
    ]  # fmt: skip


def hostile_results() -> BenchResults:
    """A run whose every section of the report (verdicts, cells, acceptance, sweeps, determinism,
    quality, log check, setup, a failed request and a log's end) holds the hostile names."""
    names = [NAME, *SWEPT]
    arms = [
        ArmInfo(NAME, "llama.cpp", command=["llama-server", "-m", f"m{NAME}.gguf"], model=f"m{NAME}.gguf",
                evidence=[Evidence("n-gpu-layers", "offload", "info", 1, f"line {NAME}", "0")],
                log_paths=["a.log"]),
        *(ArmInfo(name, "llama.cpp", command=["llama-server", "-md", "d.gguf"], model="m.gguf", sweep_param=PARAM,
                  sweep_value=v) for v, name in enumerate(SWEPT, 1)),
    ]  # fmt: skip
    prompts = [PromptInfo(f"p{i}", 32, i, "stdlib", 120) for i in range(3)]
    visits = []
    for repeat in range(2):
        for pos, name in enumerate(names):
            requests = _requests(prompts, 100.0 + 40 * pos + 3 * repeat)
            if (repeat, pos) == (0, 0):
                requests[0].error = f"died {NAME}"
            spec = SpecWindow(OK, flavour="llama.cpp", drafts=10, draft_tokens=30, accepted=21,
                              accepted_per_pos=[9, 7, 5], acceptance_rate=0.7) if pos else None  # fmt: skip
            visits.append(VisitResult(name, repeat, len(names) * repeat + pos, requests=requests, spec=spec,
                                      log_tail=LOG_TAIL if (repeat, pos) == (0, 1) else None))  # fmt: skip
    quality = [
        QualityRun(name, run, f"suite{NAME}", [ScenarioOutcome(SCENARIO, CATEGORY, bool((run + pos) % 2)),
                                               ScenarioOutcome("plain", "words", True)])
        for pos, name in enumerate(names[:2]) for run in range(2)
    ]  # fmt: skip
    determinism = [DeterminismRun(name, "p0", [Replicate("x"), Replicate("y")]) for name in names[:2]]
    return BenchResults(
        created="2026-01-01T00:00:00Z", weightsmith_version="0.1.0", host={"cpu": "test"},
        config={"repeats": 2, "warmups": 1, "workload": {"endpoint": f"e`{NAME}"}}, baseline=NAME,
        prefill_min_tokens=256, alpha=0.05, chars_per_token=3.5, chars_per_token_source="fixed", prompts=prompts,
        order=[[0, 1, 2], [2, 1, 0]], arms=arms, visits=visits, determinism=determinism, quality=quality,
    )  # fmt: skip


@pytest.fixture
def results_file(sandbox: Sandbox) -> Path:
    path = sandbox.root / "results.json"
    path.write_text(json.dumps(to_jsonable(hostile_results())))
    return path


def tables(markdown: str) -> list[tuple[str, list[str]]]:
    """Each table in `markdown`: its header row and its body rows."""
    lines = markdown.splitlines()
    found = []
    for i, line in enumerate(lines):
        if re.fullmatch(r"\|(---\|)+", line):
            body = []
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    break
                body.append(row)
            found.append((lines[i - 1], body))
    return found


def code_spans(markdown: str) -> list[str]:
    """What every code span in `markdown` shows, tables' cells included, as a GitHub-like parser reads it."""
    spans = []
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        spans += [child.content for child in token.children or [] if child.type == "code_inline"]
    return spans


def test_report_keeps_hostile_names_whole_in_code_spans_and_rows(
    sandbox: Sandbox, results_file: Path, capsys, monkeypatch
) -> None:
    out = sandbox.root / "report"
    result = run_inprocess(capsys, monkeypatch, "bench", "report", results_file, "--out", out)
    assert result.code == 0, result.err
    report = (out / "report.md").read_text()
    assert acted_on(report) == []
    for header, body in tables(report):
        for row in body:
            assert row_cells(row) == row_cells(header), row
    spans = code_spans(report)
    command = shell_line(["llama-server", "-m", f"m{NAME}.gguf"])
    named = (NAME, *SWEPT, BASE, PARAM, f"{PARAM}=2", SCENARIO, CATEGORY, f"line {NAME}", f"suite{NAME}", f"e`{NAME}")
    shown = {printable(s) for s in (*named, command)}
    assert shown <= set(spans), sorted(shown - set(spans))
    torn = [s for s in spans if "\\x1b" in s and s not in shown]
    assert torn == [], torn  # no span ended early at a backquote, a `|` or a line break
    html = MarkdownIt("commonmark").enable("table").render(report)
    assert "injected" not in "".join(re.findall(r"<h\d>.*?</h\d>", html))  # the log's lines stay in their block
    assert '<pre><code class="language-text">loading\n```\n# injected \\x1b[2J\nready\n</code></pre>' in html


def test_plots_draw_hostile_names_as_text(sandbox: Sandbox, results_file: Path, capsys, monkeypatch) -> None:
    """No label is read as mathtext (so none renders as a formula, or raises), and no warning matplotlib
    gives while drawing carries a character a terminal would act on."""
    parsed: list[str] = []
    parse = MathTextParser.parse

    def watched(self: MathTextParser, s: str, *args: object, **kwargs: object) -> object:
        parsed.append(s)
        return parse(self, s, *args, **kwargs)

    monkeypatch.setattr(MathTextParser, "parse", watched)
    out = sandbox.root / "report"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_inprocess(capsys, monkeypatch, "bench", "report", results_file, "--out", out)
    assert result.code == 0, result.err
    plots = {p.name for p in out.glob("*.png")}
    assert {"ttft.png", "decode.png", "acceptance.png", "quality.png"} <= plots and len(plots) == 5, plots
    assert [s for s in parsed if "frac" in s or "notacommand" in s] == []
    assert [str(w.message) for w in caught if acted_on(str(w.message))] == []


def test_bench_report_prints_no_raw_escape(sandbox: Sandbox, results_file: Path) -> None:
    """As a person runs it: whatever matplotlib or bench print while drawing reaches the terminal escaped."""
    result = run_subprocess("bench", "report", results_file, "--out", sandbox.root / "report")
    assert result.code == 0, result.err
    assert acted_on(result.out + result.err) == []


def test_server_log_header_pastes_as_the_command_that_ran(sandbox: Sandbox) -> None:
    """The log's first line is `$ ` and `shell_line` of the command: one line, no raw escape, and bash
    given it runs exactly that argv."""
    command = [sys.executable, "-c", "import sys; sys.exit(3)", f"x{NAME}", "$(touch pwned) 'q'", ""]
    arm = ArmSpec("a", command=command, startup_timeout_s=30.0)
    with httpx.Client() as client, pytest.raises(ServerError, match="exited with status 3"):
        start_server(arm, client, sandbox.root, "server.log", None)
    header, *rest = (sandbox.root / "server.log").read_text().split("\n")
    assert header == "$ " + shell_line(command) and rest == [""]
    assert acted_on(header) == []
    pasted = subprocess.run(["bash", "-c", "printf '%s\\0' " + header[2:]], capture_output=True, text=True,
                            check=True, cwd=sandbox.root)  # fmt: skip
    assert pasted.stdout.split("\0")[:-1] == command
    assert not (sandbox.root / "pwned").exists()
