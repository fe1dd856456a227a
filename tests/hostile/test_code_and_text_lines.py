"""Every command line we print pastes as exactly the argv it names.

preflight's and the card's `vllm serve` line and the server column of bench's report are built by
one helper (`terminal.shell_line`): whatever a target, a draft or a command word holds (`$(...)`,
quotes, backquotes, `;`, escape sequences), `shlex.split` (or bash, for words a terminal would act
on) gives back exactly those words, and a JSON value such as `--speculative-config` survives.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from hostile.harness import Sandbox, run_inprocess, tiny_pair
from weightsmith.bench.config import parse_config
from weightsmith.bench.report import write_results_file
from weightsmith.bench.results import RequestRecord, VisitResult
from weightsmith.bench.runner import new_results
from weightsmith.card.cite import find_cited
from weightsmith.core.terminal import shell_line
from weightsmith.io.serving import serve_command
from weightsmith.quantization.demo import DEMO_CONFIG, write_demo_checkpoint

#: Names a stranger can give a folder, a config field or a command word.
HOSTILE = ["$(touch pwned)", "`touch pwned`", "it's", 'say "hi"', "a b;rm -rf c", "*", "~", "", "-x", "a|b&c>d"]
#: The same, with characters a terminal acts on; bash's `$'...'` carries them.
UNPRINTABLE = ["line\nbreak", "esc\x1b[2Jape", "tab\there", "bidi\u202eevil", "byte\udcff"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tiny_pair(tmp_path_factory.mktemp("tiny"))


# ---- command lines we print -----------------------------------------------------------------------


def _bash_argv(line: str) -> list[bytes]:
    """The argv bash gives a command line: the line is run with `printf '%s\\0'` in front."""
    out = subprocess.run(["bash", "-c", shell_line(["printf", "%s\\0"]) + " " + line], capture_output=True, check=True)
    return out.stdout.split(b"\0")[:-1]


def test_shell_line_pastes_as_exactly_its_words() -> None:
    assert shlex.split(shell_line(HOSTILE)) == HOSTILE
    words = HOSTILE + UNPRINTABLE
    line = shell_line(words)
    assert line.isprintable()
    assert _bash_argv(line) == [os.fsencode(w) for w in words]


def test_shell_line_leaves_only_the_named_variables_to_the_shell() -> None:
    """bench's `$MODEL` is for the reader to set; every other `$` stays text."""
    words = ["$MODEL", '{"model": "$DRAFT/x", "y": "$(touch pwned)"}', "$MODELS", "$HOME", "a$MODEL"]
    line = shell_line(words, ["MODEL", "DRAFT"])
    assert shlex.split(line) == words
    script = "MODEL=m DRAFT=d; " + shell_line(["printf", "%s\\0"]) + " " + line
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout.split(b"\0")[:-1]
    assert out == [b"m", b'{"model": "d/x", "y": "$(touch pwned)"}', b"$MODELS", b"$HOME", b"am"]


def _serve_argv(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[:2] == ["vllm", "serve"], line
    return words


@pytest.mark.parametrize("name", HOSTILE[:6])
def test_preflight_serve_line_quotes_target_and_draft(sandbox: Sandbox, tiny, capsys, monkeypatch, name) -> None:
    target = sandbox.root / f"target {name}"
    shutil.copytree(tiny[1], target)
    draft = write_demo_checkpoint(sandbox.root / f"draft {name}", config={
        **DEMO_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 32})  # fmt: skip
    vllm = sandbox.root / "site"
    (vllm / "vllm").mkdir(parents=True)
    (vllm / "vllm" / "__init__.py").write_text("")
    sandbox.freeze()
    args = ["preflight", target, "--draft", draft, "--method", "dflash", "--k", 3, "--vllm", vllm]
    result = run_inprocess(capsys, monkeypatch, *args, "--json")
    assert result.code in (0, 1), result.err
    serve = json.loads(result.out)["serve"]
    command = serve[serve.index("vllm serve") :]
    spec = {"method": "dflash", "model": str(draft), "num_speculative_tokens": 3}
    assert _serve_argv(command)[:5] == ["vllm", "serve", str(target), "--speculative-config", json.dumps(spec)]
    printed = run_inprocess(capsys, monkeypatch, *args).out.splitlines()
    assert printed[printed.index("Suggested command") + 1] == serve  # the text output prints the same line
    sandbox.assert_untouched()


@pytest.mark.parametrize("name", HOSTILE)
def test_card_serve_line_quotes_the_target_and_the_draft(name: str) -> None:
    """The card's `vllm serve` (the one `serve_command`): a target name from a draft's config is text."""
    spec = {"method": "eagle3", "model": f"./{name}", "num_speculative_tokens": 4}
    line = serve_command(name, spec, ["--kv-cache-dtype", "fp8"])
    assert _serve_argv(line) == ["vllm", "serve", name, "--speculative-config", json.dumps(spec),
                                 "--kv-cache-dtype", "fp8"]  # fmt: skip
    assert serve_command(None, spec).startswith("vllm serve $TARGET --speculative-config ")  # the reader's variable


def test_bench_report_quotes_each_arm_command(sandbox: Sandbox, capsys, monkeypatch) -> None:
    spec = json.dumps({"method": "dflash", "model": "./draft `x` $(touch pwned)", "num_speculative_tokens": 2})
    command = ["vllm", "serve", "./model it's", "--port", "{port}", "--speculative-config", spec, *HOSTILE]
    config = parse_config({"repeats": 1, "arms": [{"name": "a", "command": command, "env": {"V": "$(x) y"}}]})
    results = new_results(config)
    record = RequestRecord("p80.0", 80, 0, ttft_s=0.1, decode_tok_s=50.0, e2e_s=0.5, completion_tokens=16)
    results.visits.append(VisitResult(arm="a", repeat=0, position=0, requests=[record]))
    path = write_results_file(results, None, sandbox.root / "run")
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "bench", "report", path)
    assert result.code == 0, result.err
    report = (sandbox.root / "run" / "report.md").read_text()
    row = next(ln for ln in report.splitlines() if ln.startswith("| `a` | vllm |"))  # the arms table
    cell = row.replace("\\|", "\0").split("|")[4].replace("\0", "|").strip()  # the server column
    spans = re.findall(r"(`+) ?(.*?) ?\1(?!`)", cell)
    assert shlex.split(spans[0][1]) == command
    assert shlex.split(spans[1][1]) == ["V=$(x) y"]
    sandbox.assert_untouched("run")


def test_card_bench_section_quotes_each_arm_command(sandbox: Sandbox, tiny, capsys, monkeypatch) -> None:
    """The card's serving benchmark lists each arm's command as bench ran it: pasted, the same argv,
    backquotes included (the code span is fenced by enough backquotes to hold them)."""
    command = ["vllm", "serve", "./model it's", "--port", "{port}", *HOSTILE]
    config = parse_config({"repeats": 1, "arms": [{"name": "a", "command": command, "env": {"V": "$(x) y"}}]})
    results = new_results(config)
    record = RequestRecord("p80.0", 80, 0, ttft_s=0.1, decode_tok_s=50.0, e2e_s=0.5, completion_tokens=16)
    results.visits.append(VisitResult(arm="a", repeat=0, position=0, requests=[record]))
    bench = write_results_file(results, None, sandbox.root / "run")
    quant = sandbox.root / "quant"
    shutil.copytree(tiny[1], quant)
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "card", quant, "--bench", bench)
    assert result.code == 0, result.err
    card = (quant / "README.md").read_text()
    spans = {c.field: re.fullmatch(r"(`+) ?(.*?) ?\1", c.value) for c in find_cited(card)}
    shown = {key: span[2] for key in ("command", "env") if (span := spans[f"arms[a].{key}"])}
    assert shlex.split(shown["command"]) == command
    assert shlex.split(shown["env"]) == ["V=$(x) y"]
    sandbox.assert_untouched("quant")
