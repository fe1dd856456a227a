"""Hostile inputs to `weightsmith bench`: arms files, results files and output folders.

Every bad arms file or results file must be one line naming the file and the key (or field), exit
2, and leave the sandbox as it was; an output folder that bench did not write is refused, `--force`
or not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hostile.harness import Sandbox, run_inprocess, run_subprocess
from weightsmith.bench.config import parse_config
from weightsmith.bench.outdir import claim, own
from weightsmith.bench.report import write_results_file
from weightsmith.bench.results import RequestRecord, VisitResult
from weightsmith.bench.runner import new_results

ARM = '[[arms]]\nname = "a"\nurl = "http://127.0.0.1:9"\n'
#: An arm whose server is never there: a run with it fails at once, but runs.
ABSENT_ARM = "repeats = 1\n[determinism]\nreplicates = 0\n" + ARM


def _arms(sandbox: Sandbox, text: str | bytes) -> Path:
    path = sandbox.root / "arms.toml"
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


def _refused(capsys, monkeypatch, sandbox: Sandbox, *args: object) -> str:
    sandbox.freeze()
    result = run_inprocess(capsys, monkeypatch, "bench", *args)
    line = result.error_line
    assert result.code == 2, result
    sandbox.assert_untouched()
    return line


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("repeats = 1000000000\n" + ARM, "repeats", "<= 100"),
        ("repeats = 1e9\n" + ARM, "repeats", "must be int"),
        ("repeats = true\n" + ARM, "repeats", "must be int"),
        ("repeats = 99999999999999999999999999\n" + ARM, "repeats", "beyond 2**64"),
        ("warmups = -1\n" + ARM, "warmups", ">= 0 and <= 100"),
        ("alpha = nan\n" + ARM, "alpha", "> 0 and < 0.5"),
        ("prefill_min_tokens = -5\n" + ARM, "prefill_min_tokens", ">= 0"),
        ("[workload]\nprompt_tokens = [1e12]\n" + ARM, "prompt_tokens[0]", "must be int"),
        ("[workload]\nprompt_tokens = [80, 1000000000000]\n" + ARM, "prompt_tokens[1]", "<= 1048576"),
        ("[workload]\nprompt_tokens = 80\n" + ARM, "prompt_tokens", "must be list"),
        ("[workload]\nprompt_tokens = []\n" + ARM, "prompt_tokens", "1 to 64 lengths"),
        ("[workload]\nprompts_per_length = 1e9\n" + ARM, "prompts_per_length", "must be int"),
        ("[workload]\nprompts_per_length = 1000000000\n" + ARM, "prompts_per_length", "<= 1000"),
        ("[workload]\nmax_tokens = 0\n" + ARM, "max_tokens", "> 0 and <= 1048576"),
        ("[workload]\nconcurrency = 100000\n" + ARM, "concurrency", "<= 256"),
        ("[workload]\ntemperature = -inf\n" + ARM, "temperature", ">= 0 and <= 2"),
        ("[workload]\nseed = -1\n" + ARM, "seed", ">= 0"),
        ("[workload]\nchars_per_token = nan\n" + ARM, "chars_per_token", "> 0 and <= 100"),
        ("[workload]\nrequest_timeout_s = inf\n" + ARM, "request_timeout_s", "<= 86400"),
        ("[workload]\nendpoint = 3\n" + ARM, "endpoint", "must be str"),
        ("[determinism]\nreplicates = 1000\n" + ARM, "replicates", "<= 100"),
        ("[determinism]\ntop_logprobs = 1e3\n" + ARM, "top_logprobs", "must be int"),
        (ARM + "startup_timeout_s = inf\n", "startup_timeout_s", "> 0 and <= 86400"),
        (ARM + "startup_timeout_s = nan\n", "startup_timeout_s", "got nan"),
        (ARM + "startup_timeout_s = -1\n", "startup_timeout_s", "> 0"),
        (ARM + "startup_timeout_s = '600'\n", "startup_timeout_s", "must be float"),
        (ARM + "env = { X = nan }\n", "env 'X'", "got nan"),
        (ARM + "env = { X = [1] }\n", "env 'X'", "a string or a number"),
        (ARM + 'env = { "A=B" = "1" }\n', "env name", "not a usable variable name"),
        (ARM + "extra_body = { x = { y = inf } }\n", "extra_body", "inf"),
        (ARM + "model = 7\n", "model", "must be str"),
        (ARM + 'url2 = "x"\n', "url2", "unknown key"),
        ('[[arms]]\nname = "a"\nurl = "http://h:1\\nx"\n', "url", "is not an http(s)"),
        ('[[arms]]\nname = "a"\nurl = "http://h:99999"\n', "url", "is not an http(s)"),
        ('[[arms]]\nname = "a"\ncommand = "srv --port {port} \'unclosed"\n', "command", "cannot be split"),
        ('[[arms]]\nname = "a"\ncommand = ["srv\\u0000", "{port}"]\n', "command", "NUL"),
        ('[[arms]]\nname = "a"\ncommand = ["srv", 5]\n', "command", "list of strings"),
        ('[[arms]]\nname = "' + "n" * 300 + '"\nurl = "http://h:1"\n', "name", "at most 128"),
        (
            '[[arms]]\nname = "a"\ncommand = ["s", "{port}"]\n[arms.sweep]\nflag = "--k"\nvalues = [1, nan]\n',
            "values[1]",
            "got nan",
        ),
        (
            '[[arms]]\nname = "a"\ncommand = ["s", "{port}"]\n[arms.sweep]\nflag = "--k"\nvalues = [{ a = 1 }]\n',
            "values[0]",
            "a string or a number",
        ),
        (  # a sweep's JSON flag value nested past the parser's recursion limit
            '[[arms]]\nname = "a"\ncommand = ["s", "{port}", "--c", "' + "[" * 100_000 + '"]\n'
            '[arms.sweep]\nflag = "--c"\nkey = "k"\nvalues = [1]\n',
            "--c",
            "is not JSON",
        ),
        (  # ... or holding an integer beyond Python's conversion limit (a ValueError, not a JSONDecodeError)
            '[[arms]]\nname = "a"\ncommand = ["s", "{port}", "--c", "{\\"a\\": ' + "9" * 5000 + '}"]\n'
            '[arms.sweep]\nflag = "--c"\nkey = "k"\nvalues = [1]\n',
            "--c",
            "is not JSON",
        ),
        ('arms = "x"\n', "arms", "must be list"),
        ('"[/]\\n" = 1\n' + ARM, "unknown key", "'[/]\\n'"),  # markup and a newline, shown inert
    ],
)
def test_bad_arms_file_is_one_line_naming_the_key(
    capsys, monkeypatch, sandbox: Sandbox, text: str, key: str, says: str
) -> None:
    arms = _arms(sandbox, text)
    line = _refused(capsys, monkeypatch, sandbox, "run", arms, "--out", sandbox.root / "out")
    assert str(arms) in line and key in line and says in line, line


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"a = " + b"[" * 100_000, "nested too deeply"),
        (b"a = " + b"{b=" * 100_000, "nested too deeply"),
        (b"repeats = " + b"9" * 5000 + b"\n", "not valid TOML"),
        (b'\xff\xfe[[arms]]\nname = "a"\n', "not UTF-8"),
        (b"x" * ((1 << 20) + 1), "larger than 1048576 bytes"),
    ],
)
def test_unreadable_arms_file_is_one_line(capsys, monkeypatch, sandbox: Sandbox, content: bytes, says: str) -> None:
    arms = _arms(sandbox, content)
    line = _refused(capsys, monkeypatch, sandbox, "run", arms, "--out", sandbox.root / "out")
    assert str(arms) in line and says in line, line


def _results(sandbox: Sandbox) -> tuple[Path, dict]:
    """A small results.json as `bench run` writes it: two arms, one visit each."""
    config = parse_config(
        {"repeats": 1, "arms": [{"name": "a", "url": "http://h:1"}, {"name": "b", "url": "http://h:2"}]}
    )
    results = new_results(config)
    for position, arm in enumerate("ab"):
        record = RequestRecord("p80.0", 80, 0, ttft_s=0.1, decode_tok_s=50.0, e2e_s=0.5, completion_tokens=16)
        results.visits.append(VisitResult(arm=arm, repeat=0, position=position, requests=[record]))
    folder = sandbox.root / "run"
    path = write_results_file(results, None, folder)
    return path, json.loads(path.read_text())


def _mutate(data: dict, where: list, value: object) -> None:
    *parents, last = where
    for step in parents:
        data = data[step]
    if value is KeyError:
        del data[last]
    else:
        data[last] = value


def test_a_valid_results_file_renders(capsys, monkeypatch, sandbox: Sandbox) -> None:
    path, _ = _results(sandbox)
    result = run_inprocess(capsys, monkeypatch, "bench", "report", path, "--out", sandbox.root / "again")
    assert result.code == 0, result.err
    assert (sandbox.root / "again" / "report.md").is_file()


@pytest.mark.parametrize(
    ("where", "value", "field", "says"),
    [
        (["visits", 0, "requests", 0, "ttft_s"], "fast", "visits[0].requests[0].ttft_s", "must be a number"),
        (["visits", 0, "requests", 0, "target_tokens"], 8.5, "visits[0].requests[0].target_tokens", "an integer"),
        (["visits", 1, "requests"], {"a": 1}, "visits[1].requests", "must be an array"),
        (["visits", 1, "arm"], KeyError, "visits[1].arm", "missing"),
        (["visits", 1, "arm"], "z", "visits[1].arm", "not one of the arms"),
        (["visits", 0, "status"], "fine", "visits[0].status", "must be one of"),
        (["visits"], None, "visits", "must be an array, got null"),
        (["arms", 0], [], "arms[0]", "must be an object"),
        (["arms", 0, "name"], KeyError, "arms[0].name", "missing"),
        (["baseline"], "nobody", "baseline", "not one of the arms"),
        (["host"], "x", "host", "must be an object"),
        (["interrupted"], 1, "interrupted", "must be a boolean"),
        (["alpha"], KeyError, "alpha", "missing"),
        (["alpha"], 7, "alpha", "must be > 0 and < 0.5"),
        (["config", "workload"], 3, "config.workload", "must be an object"),
    ],
)
def test_results_file_of_the_wrong_shape_names_the_field(
    capsys, monkeypatch, sandbox: Sandbox, where: list, value: object, field: str, says: str
) -> None:
    path, data = _results(sandbox)
    _mutate(data, where, value)
    path.write_text(json.dumps(data))
    line = _refused(capsys, monkeypatch, sandbox, "report", path, "--out", sandbox.root / "out")
    assert str(path) in line and f"field {field}:" in line and says in line, line


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[" * 100_000, "nested deeper than 64 levels"),
        ('{"a":' * 100_000, "nested deeper than 64 levels"),
        ('{"schema": "weightsmith.bench.results", "x": ' + "[" * 100 + "]" * 100 + "}", "nested deeper than 64"),
        ('{"schema": "weightsmith.bench.results", "alpha": NaN}', "NaN is not a JSON number"),
        ('{"schema": "weightsmith.bench.results", "chars_per_token": 1e400}', "1e400 is beyond a float's range"),
        ('{"schema": "weightsmith.bench.results", "schema_version": [1]}', "schema version an array"),
        ("[1, 2]", "not a weightsmith bench results file"),
        ("{", "not JSON"),
    ],
)
def test_hostile_json_is_one_line(capsys, monkeypatch, sandbox: Sandbox, text: str, says: str) -> None:
    path = sandbox.root / "results.json"
    path.write_text(text)
    line = _refused(capsys, monkeypatch, sandbox, "report", path, "--out", sandbox.root / "out")
    assert str(path) in line and says in line, line


def _users_folder(sandbox: Sandbox) -> Path:
    out = sandbox.root / "out"
    (out / "cache").mkdir(parents=True)
    (out / "logs").mkdir()
    (out / "report.md").write_text("my own report\n")
    (out / "cache" / "x").write_text("my cache\n")
    (out / "logs" / "y").write_text("my log\n")
    return out


@pytest.mark.parametrize("force", [(), ("--force",)])
def test_run_refuses_a_folder_bench_did_not_write(capsys, monkeypatch, sandbox: Sandbox, force: tuple) -> None:
    out = _users_folder(sandbox)
    arms = _arms(sandbox, ABSENT_ARM)
    line = _refused(capsys, monkeypatch, sandbox, "run", arms, "--out", out, "--quiet", *force)
    assert str(out) in line and "bench did not write" in line, line


def test_run_with_force_replaces_the_results_bench_wrote(capsys, monkeypatch, sandbox: Sandbox) -> None:
    out = sandbox.root / "out"
    arms = _arms(sandbox, ABSENT_ARM)
    assert run_inprocess(capsys, monkeypatch, "bench", "run", arms, "--out", out, "--quiet").code == 1
    line = _refused(capsys, monkeypatch, sandbox, "run", arms, "--out", out, "--quiet")
    assert "results.json exists" in line and "--force" in line, line
    result = run_inprocess(capsys, monkeypatch, "bench", "run", arms, "--out", out, "--quiet", "--force")
    assert result.code == 1 and "arm 'a' failed" in result.err  # it ran: the absent server failed
    assert json.loads((out / "results.json").read_text())["arms"][0]["status"] == "failed"


def test_a_folder_bench_wrote_is_used_again_without_force(capsys, monkeypatch, sandbox: Sandbox) -> None:
    out = sandbox.root / "out"
    claim(out)  # a run interrupted before its first visit ended: no results.json yet, its log recorded
    (out / "logs").mkdir(parents=True)
    own(out, "logs/a.r1.log").write_text("$ srv\n")
    arms = _arms(sandbox, ABSENT_ARM)
    result = run_inprocess(capsys, monkeypatch, "bench", "run", arms, "--out", out, "--quiet")
    assert result.code == 1 and (out / "results.json").is_file(), result.err


def test_run_refuses_an_out_that_is_a_file(capsys, monkeypatch, sandbox: Sandbox) -> None:
    out = sandbox.root / "out"
    out.write_text("not a folder\n")
    arms = _arms(sandbox, ABSENT_ARM)
    line = _refused(capsys, monkeypatch, sandbox, "run", arms, "--out", out, "--force")
    assert str(out) in line and "not a folder" in line, line


def test_report_refuses_a_folder_bench_did_not_write(capsys, monkeypatch, sandbox: Sandbox) -> None:
    path, _ = _results(sandbox)
    out = _users_folder(sandbox)
    line = _refused(capsys, monkeypatch, sandbox, "report", path, "--out", out)
    assert str(out) in line and "bench did not write" in line, line


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_fifo_as_arms_or_results_file_is_refused_unopened(sandbox: Sandbox, command: str) -> None:
    fifo = sandbox.root / ("arms.toml" if command == "run" else "results.json")
    os.mkfifo(fifo)
    sandbox.freeze()
    result = run_subprocess("bench", command, fifo, "--out", sandbox.root / "out", timeout=60)
    assert result.code == 2, result
    assert str(fifo) in result.error_line and "FIFO" in result.error_line
    sandbox.assert_untouched()
