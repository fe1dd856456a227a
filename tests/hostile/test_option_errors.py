"""Every usage error of every command is one line, and every count option has a stated range.

- A usage error (an unknown option, a missing argument or option value, a value its type or range
  refuses, an unknown command) was click's usage box of five or six lines; now it is one line
  `error: <what>` naming the option and the refused value, printable and markup-safe, exit 2. It is
  answered in one place, the entry point (`cli.main`), so the table below runs every command and
  every `bench` subcommand.
- Each count (`--workers`, `--group-size`, `--seq-len`, `--layers`, `--k`, `--dampening`, ...) has a
  minimum and a maximum (`--workers -1` and `--workers 10**9` were accepted), said in its help.
- `--help` still prints each command's help on stdout, exit 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hostile.harness import Result, run_inprocess, run_subprocess
from weightsmith import cli
from weightsmith.bench.cli import bench_app

#: Every command line that names one command: the top-level ones and each `bench` subcommand.
COMMANDS = [[name] for name in cli.SUMMARIES if name != "bench"] + [
    ["bench", str(info.name)] for info in bench_app.registered_commands
]
#: A 5,000-digit number: past Python's int conversion limit.
HUGE = "9" * 5000


def _ids(args: list[str]) -> str:
    return " ".join(args)


def _refused(result: Result, *words: str) -> str:
    """The one error line of a usage error (exit 2), holding each of `words`."""
    line = result.error_line
    assert result.code == 2, (result.code, line)
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.mark.parametrize("command", COMMANDS, ids=_ids)
def test_an_unknown_option_is_one_line_for_every_command(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _refused(run_inprocess(capsys, monkeypatch, *command, "--no-such-option"), "--no-such-option")


@pytest.mark.parametrize("command", COMMANDS, ids=_ids)
def test_help_still_prints_the_commands_help(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_inprocess(capsys, monkeypatch, *command, "--help")
    assert result.code == 0, result.err
    assert "Usage" in result.out and "--help" in result.out
    assert result.err == ""


@pytest.mark.parametrize(
    "args, words",
    [
        (["quantize", "only-src"], ["Missing argument", "out"]),
        (["inspect"], ["Missing argument", "checkpoint"]),
        (["bench", "run"], ["Missing argument", "arms"]),
        (["calibrate", "src"], ["Missing option", "--out"]),
        (["quantize", "src", "out", "--seq-len"], ["--seq-len", "requires an argument"]),
        (["no-such-command"], ["no-such-command"]),
        (["bench", "no-such-command"], ["no-such-command"]),
    ],
    ids=_ids,
)
def test_a_missing_argument_or_unknown_command_is_one_line(
    args: list[str], words: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _refused(run_inprocess(capsys, monkeypatch, *args), *words)


#: (command line before the option, option, refused value, what the line must also say)
OUT_OF_RANGE = [
    (["quantize", "src", "out"], "--workers", "-1", "greater than or equal to 0"),
    (["quantize", "src", "out"], "--workers", "1000000000", "less than or equal to 256"),
    (["demo"], "--workers", "-1", "greater than or equal to 0"),
    (["quantize", "src", "out"], "--group-size", "0", "greater than or equal to 1"),
    (["quantize", "src", "out"], "--group-size", "1048577", "less than or equal to 1048576"),
    (["quantize", "src", "out"], "--group-size", HUGE, "exceeded maximum size"),
    (["quantize", "src", "out"], "--seq-len", "0", "greater than or equal to 1"),
    (["quantize", "src", "out"], "--seq-len", "١٢٨", "valid integer"),  # Arabic-Indic digits
    (["quantize", "src", "out"], "--seq-len", "16777217", "less than or equal to 16777216"),
    (["quantize", "src", "out", "--method", "gptq"], "--dampening", "-0.5", "must be in [0, 1)"),
    (["quantize", "src", "out", "--method", "gptq"], "--dampening", "1", "must be in [0, 1)"),
    (["quantize", "src", "out", "--method", "gptq"], "--dampening", "nan", "must be in [0, 1)"),
    (["calibrate", "src", "--out", "stats.safetensors"], "--seq-len", "0", "greater than or equal to 1"),
    (["calibrate", "src", "--out", "stats.safetensors"], "--seq-len", "1" + "0" * 30, "less than or equal to"),
    (["calibrate-kv", "quant"], "--seq-len", "0", "greater than or equal to 1"),
    (["calibrate-kv", "quant"], "--seq-len", "-5", "greater than or equal to 1"),
    (["eval", "orig", "quant"], "--layers", "-1", "greater than or equal to 0"),
    (["eval", "orig", "quant"], "--layers", "1" + "0" * 30, "less than or equal to 100000"),
    (["preflight", "target"], "--k", "0", "greater than or equal to 1"),
    (["preflight", "target"], "--k", "1025", "less than or equal to 1024"),
    (["preflight", "target"], "--k", HUGE, "exceeded maximum size"),
]


@pytest.mark.parametrize(
    "args, option, value, says", OUT_OF_RANGE, ids=[f"{a[0]} {o} {v[:12]}" for a, o, v, _ in OUT_OF_RANGE]
)
def test_a_count_out_of_its_range_is_one_line_naming_option_and_value(
    args: list[str],
    option: str,
    value: str,
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    line = _refused(run_inprocess(capsys, monkeypatch, *args, option, value), option, says, value[:12])
    assert len(line) < 400, line  # a 5,000-digit value is cut, not printed whole
    assert list(tmp_path.iterdir()) == []  # refused while parsing: the command did not start


@pytest.mark.parametrize(
    "command, option, shown",
    [
        (["quantize"], "--workers", "[0<=x<=256]"),
        (["demo"], "--workers", "[0<=x<=256]"),
        (["quantize"], "--group-size", "[1<=x<=1048576]"),
        (["quantize"], "--seq-len", "[1<=x<=16777216]"),
        (["quantize"], "--dampening", "0 to under 1"),
        (["calibrate"], "--seq-len", "[1<=x<=16777216]"),
        (["calibrate-kv"], "--seq-len", "[1<=x<=16777216]"),
        (["eval"], "--layers", "[0<=x<=100000]"),
        (["preflight"], "--k", "[1<=x<=1024]"),
    ],
    ids=lambda v: v if isinstance(v, str) else _ids(v),
)
def test_each_range_is_said_in_the_help(
    command: list[str], option: str, shown: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    out = run_inprocess(capsys, monkeypatch, *command, "--help").out
    help_line = " ".join(" ".join(line.split()) for line in out.splitlines() if f" {option} " in line)
    assert shown in help_line, help_line


@pytest.mark.parametrize(
    "args, shown",
    [
        (["inspect", "x", "--by", "[/]"], "'[/]'"),  # read as markup, rich would raise MarkupError
        (["inspect", "x", "--by", "a\x1b[2Jb"], "\\x1b"),  # a terminal would clear the screen
        (["inspect", "x", "--\u202eevil"], "\\u202e"),  # a bidi override would reorder the line
        (["quantize", "src", "out", "--seq-len", "[bold]1"], "[bold]1"),
        (["inspect", "x", "--by", "\udcff"], "\\udcff"),  # a byte that is not UTF-8, as Python's argv holds it
        (["inspect", "x", "--\udcff"], "\\udcff"),
    ],
    ids=["markup", "escape", "bidi", "markup-in-int", "not-utf8", "not-utf8-option"],
)
def test_the_refused_value_is_printed_as_text(
    args: list[str], shown: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = _refused(run_inprocess(capsys, monkeypatch, *args), shown)
    assert "\x1b" not in line and "\u202e" not in line


def test_a_very_long_unknown_option_is_cut(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    line = _refused(run_inprocess(capsys, monkeypatch, "verify", "x", "--" + "x" * 100_000), "--xxx", "...")
    assert len(line) < 400, len(line)


def test_inspect_by_names_the_refused_view(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _refused(run_inprocess(capsys, monkeypatch, "inspect", "x", "--by", "foo"), "--by", "'foo'", "category")


def test_the_installed_command_answers_the_same(tmp_path: Path) -> None:
    """Through `python -m weightsmith`, where click's own exit would print the usage box."""
    result = run_subprocess("quantize", "src", "out", "--workers", "-1", cwd=tmp_path)
    _refused(result, "--workers", "'-1'")
    assert result.out == ""
