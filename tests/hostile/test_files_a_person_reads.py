"""Files a person reads, and a vLLM preflight cannot read (issue 45, third pass, items 13 and 14).

A model card and a bench report are read with `cat` as often as in a browser: a stranger's escape
sequence copied into one (from a tensor name, `architectures`, `model_type`, an arm name, a server's
message) would set the window title and clear the screen, and a `|`, a backquote, `<script>` or a
line break in a name would rewrite the Markdown around it. Every such string must come out as
visible escapes inside text Markdown shows as it is, and `card --check` must still find every value
it cites. Preflight, for its part, may pass a vLLM only when it read the facts it needed from it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from markdown_it import MarkdownIt

from hostile.harness import TINY_LLAMA, Sandbox, copies, row_cells, run_inprocess, tiny_pair
from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, quantize
from weightsmith.bench.metrics import OK, SpecWindow
from weightsmith.bench.results import ArmInfo, BenchResults, PromptInfo, RequestRecord, VisitResult, to_jsonable
from weightsmith.card.cite import find_cited
from weightsmith.quantization.demo import DEMO_CONFIG, write_demo_checkpoint

#: What a terminal acts on: a window title (OSC ... BEL), a clear screen (CSI), the one-byte C1 CSI,
#: and a right-to-left override that makes the rest of a line read backwards.
ACTS = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
SHOWN = ("\\x1b]0;pwned\\x07", "\\x1b[2J", "\\x9b31m", "\\u202e")
#: What would rewrite the Markdown around a name: a cell break, a code span's end, raw HTML, a line
#: break that opens a heading, and a line that would end the front matter.
MARKUP = "a|b`c<script>alert(1)</script>\n# injected\n---\n"


def acted_on(text: str) -> list[str]:
    """Every character in `text`, line breaks aside, that a terminal would act on or not show."""
    return sorted({repr(ch) for ch in text if not ch.isprintable() and ch != "\n"})


def assert_tables_whole(markdown: str) -> None:
    """Every table row has as many cells as its header."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if re.fullmatch(r"\|(---\|)+", line):
            width = row_cells(lines[i - 1])
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    break
                assert row_cells(row) == width, row


def rendered(markdown: str) -> str:
    """The card as HTML, raw HTML passed through as a Markdown viewer that allows it would."""
    body = markdown.split("\n---\n", 1)[1]  # the front matter is the Hub's, not shown
    return MarkdownIt("commonmark").enable("table").render(body)


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quantized one-layer Llama whose names carry escape sequences and markup: `architectures`,
    `model_type`, a tensor name and an ignore-list entry."""
    root = tmp_path_factory.mktemp("named")
    config = dict(TINY_LLAMA, architectures=[f"LlamaForCausalLM{ACTS}{MARKUP}"], model_type=f"llama{ACTS}")
    tensors = llama_tensors(TINY_LLAMA)
    tensors[f"model.extra{ACTS}|x`y.weight"] = np.zeros((4, 64), ml_dtypes.bfloat16)
    src = write_checkpoint(root / "src", tensors, config)
    out = root / "quant"
    quantize(
        QuantizeRequest(
            src,
            out,
            scheme="w4a16",
            group_size=32,
            ignore=[f"re:.*extra{re.escape(ACTS)}"],
            workers=1,
            hash_sources=False,
            pre_pass=None,
        )
    )
    return out


def bench_results(arms: tuple[str, str], failure: str) -> BenchResults:
    """Two arms named `arms`, two repeats, two prompts, the second arm drafting; one request failed with `failure`."""
    infos = [
        ArmInfo(arms[0], "llama.cpp", command=["llama-server", "-m", f"m{ACTS}.gguf"], model=f"m{ACTS}.gguf"),
        ArmInfo(arms[1], "llama.cpp", command=["llama-server", "-m", "m.gguf", "-md", "d.gguf"], model="m.gguf",
                env={"LLAMA_ARG": f"x{ACTS}"}),
    ]  # fmt: skip
    prompts = [PromptInfo(f"p{i}", 32, i, "stdlib", 120) for i in range(2)]
    visits = []
    for repeat in range(2):
        for pos, arm in enumerate(infos):
            requests = [
                RequestRecord(p.key, 32, p.index, ttft_s=0.02 + 0.001 * p.index, decode_tok_s=100.0 + 30 * pos + p.index
                              + repeat, e2e_s=0.3, prompt_tokens=33, completion_tokens=16, token_chunks=16)
                for p in prompts
            ]  # fmt: skip
            requests[0].error = failure if (repeat, pos) == (0, 0) else None
            spec = SpecWindow(OK, flavour="llama.cpp", drafts=10, draft_tokens=30, accepted=21,
                              accepted_per_pos=[9, 7, 5], acceptance_rate=0.7) if pos else None  # fmt: skip
            visits.append(VisitResult(arm.name, repeat, 2 * repeat + pos, requests=requests, spec=spec,
                                      log_tail=f"server says {failure}" if pos else None))  # fmt: skip
    return BenchResults(
        created="2026-01-01T00:00:00Z", weightsmith_version="0.1.0", host={"cpu": f"test{ACTS}"},
        config={"repeats": 2, "warmups": 1}, baseline=arms[0], prefill_min_tokens=256, alpha=0.05,
        chars_per_token=3.5, chars_per_token_source="fixed", prompts=prompts, order=[[0, 1], [1, 0]],
        arms=infos, visits=visits,
    )  # fmt: skip


def eval_file(path: Path, category: str) -> Path:
    """`weightsmith eval --json` output whose one category is named `category`."""
    summary = {"layers": 8, "numel": 655360, "sq_error": 1.0, "sq_norm": 90.0, "rel_mse": 0.0111, "sqnr_db": 19.5}
    doc = {
        "schema": "weightsmith.eval", "schema_version": 1, "orig": "src", "quant": "quant",
        "weights": {"source_format": "dense", "layers": [], "unsupported": [], "kept": [], "bytes_read": 0,
                    "seconds": 0.1, "categories": [{"name": category, **summary}],
                    "overall": {"name": "overall", **summary}},
        "logits": {"status": "ok", "reason": None, "text_source": f"text{ACTS}", "tokens": 128, "kl": 0.0123,
                   "top1_agreement": 0.953, "ppl_orig": 7.25, "ppl_quant": 7.5, "seconds": 1.0},
        "weightsmith_version": "0.1.0",
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


# --- 13. card and bench write a stranger's names as visible escapes, inside Markdown that stays whole ---


def test_card_writes_escape_sequences_from_names_and_config_visibly(
    sandbox: Sandbox, named: Path, capsys, monkeypatch
) -> None:
    folder = sandbox.root / f"quant{ACTS}"
    shutil.copytree(named, folder)
    result = run_inprocess(capsys, monkeypatch, "card", folder)
    assert result.code == 0, result.err
    card = (folder / "README.md").read_text()
    assert acted_on(card) == []
    for shown in SHOWN:
        assert shown in card
    check = run_inprocess(capsys, monkeypatch, "card", folder, "--check")
    assert check.code == 0, check.out
    assert acted_on(check.out + check.err) == []


def test_card_names_cannot_rewrite_its_markdown(sandbox: Sandbox, named: Path, capsys, monkeypatch) -> None:
    """A name holding `|`, a backquote, `<script>` and line breaks stays text: every table keeps its
    cells, no HTML and no heading of the stranger's comes through, and every cited value is found."""
    folder = sandbox.root / "quant"
    shutil.copytree(named, folder)
    bench = sandbox.root / "results.json"
    bench.write_text(json.dumps(to_jsonable(bench_results((f"plain{ACTS}\\|<b>x</b>", f"draft`{MARKUP}"), ACTS))))
    evaluated = eval_file(sandbox.root / "eval.json", f"attention{MARKUP}")
    result = run_inprocess(capsys, monkeypatch, "card", folder, "--bench", bench, "--eval", evaluated,
                           "--repo", "org/quant")  # fmt: skip
    assert result.code == 0, result.err
    card = (folder / "README.md").read_text()
    assert acted_on(card) == []
    assert card.count("\n---\n") == 1  # the front matter's end, and no other
    assert_tables_whole(card)
    html = rendered(card)
    assert "<script" not in html and "<b>" not in html
    assert "injected</h1>" not in html and html.count("<h1>") == 1
    distinct = int(re.search(r"(\d+) distinct cited sources", result.out).group(1))
    sources = {c.source for c in find_cited(card)}
    assert len(sources) == distinct  # an anchor naming an arm, a shard or a category is still found
    check = run_inprocess(capsys, monkeypatch, "card", folder, "--check")
    assert check.code == 0, check.out


def test_front_matter_refuses_what_a_reader_would_not_see(sandbox: Sandbox, capsys, monkeypatch) -> None:
    """YAML reads a right-to-left override back unchanged, so the round trip alone lets it through."""
    _, quant = copies(sandbox, tiny_pair(sandbox.root / "pair"))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant, "--license", "mit\u202e")
    assert result.code == 2
    assert "license" in result.error_line and "\\u202e" in result.error_line
    sandbox.assert_untouched()


def test_bench_report_writes_server_messages_and_names_visibly(sandbox: Sandbox, capsys, monkeypatch) -> None:
    results = sandbox.root / "results.json"
    results.write_text(json.dumps(to_jsonable(bench_results((f"plain{ACTS}", f"draft{MARKUP}"), f"died{ACTS}"))))
    out = sandbox.root / "report"
    result = run_inprocess(capsys, monkeypatch, "bench", "report", results, "--out", out)
    assert result.code == 0, result.err
    report = (out / "report.md").read_text()
    assert acted_on(report) == []
    for shown in SHOWN:
        assert shown in report
    assert "\n# injected" not in report and "\n---\n" not in report


# --- 14. preflight passes a vLLM only when it read what it needed from it ---


SMALL = {**DEMO_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip


def bare_vllm(root: Path) -> Path:
    """A site-packages folder whose `vllm` package is `__init__.py` alone."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    return root


@pytest.mark.parametrize("side", ["quantized target", "dense target", "draft"])
def test_preflight_fails_on_a_vllm_it_cannot_read(sandbox: Sandbox, capsys, monkeypatch, side: str) -> None:
    orig, quant = copies(sandbox, tiny_pair(sandbox.root / "pair"))
    vllm = bare_vllm(sandbox.root / "site-packages")
    args: list[object] = [quant if side == "quantized target" else orig]
    if side == "draft":
        args += ["--draft", write_demo_checkpoint(sandbox.root / "draft", config=SMALL)]
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(sandbox.root / "no-cache"))
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "preflight", *args, "--vllm", vllm, "--json")
    doc = json.loads(result.out)
    assert result.code == 1 and doc["passed"] is False, doc
    unread = [f for f in doc["findings"] if f["impact"] == "could not check"]
    assert unread and all(f["message"].startswith("could not check ") for f in unread)
    assert all(f["severity"] != "info" for f in unread) and doc["counts"]["could not check"] == len(unread)
    assert any(f["check"] == "vllm.version" for f in unread)  # every run needs to know which vLLM it read
    if side == "quantized target":  # the kernel tables and the build's platform are what it needed
        assert any(f["check"] == "serve.linear-kernel" and "not found" in f["message"] for f in unread)
    if side == "draft":
        assert any("vllm/model_executor/models/registry.py not found" in f["message"] for f in unread)
    text = run_inprocess(capsys, monkeypatch, "preflight", *args, "--vllm", vllm)
    assert text.code == 1 and "could not check" in text.out.lower() and "\nOK\n" not in text.out
    sandbox.assert_untouched()
