"""The command line loads only the module of the command it runs; each table entry must hold."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.core
import typer.main

from weightsmith.cli import COMMAND_MODULES, SUMMARIES, build_app

SRC = Path(__file__).resolve().parents[1] / "src"
#: What `weightsmith --help`, every command's `--help` and `inspect` (headers only) must start without:
#: each takes a tenth of a second or more to import, and only a command's work needs it.
HEAVY = ("numpy", "scipy", "numba", "httpx", "ml_dtypes", "matplotlib", "torch", "transformers", "safetensors")
#: typer's own validators: they coerce the value of an option a command line gives, which a `--help`
#: gives none of (the root declares its own help flag, whose unset value typer would coerce: `cli._root`).
VALIDATORS = ("pydantic",)
LOADED = """
import sys
sys.argv = ["weightsmith", *sys.argv[1:]]
from weightsmith.cli import main
try:
    main()
except SystemExit:
    pass
print(" ".join(sorted({m.split(".")[0] for m in sys.modules})), file=sys.stderr)
"""


def _group(app: typer.Typer) -> typer.core.TyperGroup:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return group


def _commands(app: typer.Typer) -> set[str]:
    return set(_group(app).commands)


def _run(*args: str) -> tuple[str, set[str]]:
    """What `weightsmith ARGS` printed in a fresh process, and the top-level modules it then held."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", LOADED, *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout, set(done.stderr.strip().splitlines()[-1].split())


def _loaded(*args: str) -> set[str]:
    """The top-level modules a fresh process holds after running `weightsmith ARGS`."""
    return _run(*args)[1]


def test_each_command_is_added_by_the_module_the_table_names() -> None:
    everything = _commands(build_app([]))
    assert everything == set(COMMAND_MODULES)
    for name in COMMAND_MODULES:
        assert name in _commands(build_app([name, "--help"])), name


def test_an_unknown_name_lists_every_command_so_click_can_say_so() -> None:
    assert _commands(build_app(["nosuch"])) == set(COMMAND_MODULES)


@pytest.mark.parametrize("name", list(COMMAND_MODULES))
def test_the_listed_summary_is_the_first_paragraph_of_the_commands_own_help(name: str) -> None:
    assert list(SUMMARIES) == list(COMMAND_MODULES)
    command = _group(build_app([name])).commands[name]
    first = inspect.cleandoc(command.help or "").split("\n\n")[0].replace("\n", " ")
    assert SUMMARIES[name] == first


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("nosuch",)])
def test_the_command_list_starts_without_the_heavy_libraries(args: tuple[str, ...]) -> None:
    assert not _loaded(*args) & set(HEAVY)


@pytest.mark.parametrize("name", COMMAND_MODULES)
def test_every_commands_help_starts_without_the_heavy_libraries_or_typers_validators(name: str) -> None:
    out, loaded = _run(name, "--help")
    assert "Usage" in out
    assert not loaded & {*HEAVY, *VALIDATORS}, f"{name} --help loaded {loaded & {*HEAVY, *VALIDATORS}}"


def test_inspect_reads_headers_without_the_heavy_libraries(tmp_path: Path) -> None:
    """`inspect` parses its options (typer's validators load) but reads no value: no numpy."""
    from synth import llama_tensors, write_checkpoint

    write_checkpoint(tmp_path / "ckpt", llama_tensors(), shards=2)
    out, loaded = _run("inspect", str(tmp_path / "ckpt"))
    assert "attention" in out  # the table of categories
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
