"""The command line loads only the module of the command it runs; each table entry must hold."""

from __future__ import annotations

import typer.main

from weightsmith.cli import COMMAND_MODULES, build_app


def _commands(app: typer.Typer) -> set[str]:
    return set(typer.main.get_command(app).commands)


def test_each_command_is_added_by_the_module_the_table_names() -> None:
    everything = _commands(build_app([]))
    assert everything == set(COMMAND_MODULES)
    for name in COMMAND_MODULES:
        assert name in _commands(build_app([name, "--help"])), name


def test_an_unknown_name_loads_every_command_so_click_can_say_so() -> None:
    assert _commands(build_app(["nosuch"])) == set(COMMAND_MODULES)
