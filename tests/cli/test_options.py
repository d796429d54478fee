"""Option checks shared by the commands: every ``--format`` is checked the same way, first."""

from __future__ import annotations

import pytest
import typer

from bmoe.cli import app, main, register


def _commands(cmd, path: tuple[str, ...] = ()):
    if hasattr(cmd, "commands"):
        for name, sub in sorted(cmd.commands.items()):
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def _with_format() -> list[tuple[str, ...]]:
    register()
    return [
        path
        for path, cmd in _commands(typer.main.get_command(app))
        if any("--format" in p.opts for p in cmd.params)
    ]


def _required_options(command: tuple[str, ...], value: str) -> list[str]:
    """A value for each required option of `command` (so that the parser lets it run)."""
    cmd = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]
    return [
        arg
        for p in cmd.params
        if p.required and p.param_type_name == "option"
        for arg in (p.opts[0], value)
    ]


def test_commands_with_a_format_option_exist() -> None:
    assert ("analyze", "route") in _with_format() and len(_with_format()) >= 10


@pytest.mark.parametrize("command", _with_format(), ids=" ".join)
def test_an_unknown_format_is_refused_before_any_file_is_read(command, tmp_path, capsys) -> None:
    missing = tmp_path / "missing.csv"  # reading it first would fail differently
    required = _required_options(command, str(missing))
    code = main([*command, str(missing), *required, "--format", "yaml"])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown --format 'yaml' (choose from " in err and "table" in err
