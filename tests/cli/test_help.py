"""Help text reads as prose at any width: the line breaks of the source code are joined, so
the terminal wraps each paragraph at its own width; examples, items and remarks keep their
own lines; a group's listing gives each command's first sentence."""

from __future__ import annotations

import itertools
import re

import pytest

from bmoe.cli import cli_command, main, reflowed, register


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_reflowed_joins_source_lines_and_keeps_structure() -> None:
    text = """First line
    goes on here.

    A paragraph that
    continues (with a parenthesis
    in it) and ends.
    - an item that
    goes on
    - another item

    Example: bmoe x --y
    (a remark on the example)
    Example: bmoe z

    \b
    kept
    as is
    """
    assert reflowed(text) == (
        "First line goes on here.\n\n"
        "A paragraph that continues (with a parenthesis in it) and ends.\n"
        "- an item that goes on\n- another item\n\n"
        "Example: bmoe x --y\n(a remark on the example)\nExample: bmoe z\n\n"
        "\b\nkept\nas is"
    )


def test_no_prose_line_of_any_command_ends_mid_sentence() -> None:
    register()
    broken = []
    for path, cmd in _commands(cli_command()):
        for line in (cmd.help or "").splitlines():
            text = line.strip()
            if not text or text.startswith(("Example:", "- ", "(", "\b")) or line[:1] == " ":
                continue
            if text[-1] not in ".:;)!?":
                broken.append(f"bmoe {' '.join(path)}: ...{text[-50:]}")
        for param in cmd.params:
            assert "\n" not in (getattr(param, "help", None) or ""), (path, param.name)
    assert not broken, broken


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (["--help"], "opens offline in any browser: run parameters, summary tables, stall"),
        (["model", "synth", "-h"], "qwen2moe (a gated shared expert beside the routed ones),"),
        (["analyze", "replay", "-h"], "- layer: each layer gets budget / layers and evicts"),
    ],
)
def test_help_wraps_at_the_terminal_not_at_the_source(
    capsys, monkeypatch, argv, sentence, width
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(argv) == 0
    out = capsys.readouterr().out
    # the text between the panel borders, joined line to line as a reader reads it
    lines = [re.sub(r"^[\s│]*|[\s│]*$", "", line) for line in out.splitlines()]
    assert sentence in " ".join(lines)
    if width == 200:  # room for the sentence: it is on one line, not broken where the
        assert any(sentence in line for line in lines)  # source code broke it
    # no line of a paragraph is cut short with room to spare on it (a hard break): a line
    # followed by more of its paragraph fills the width but for the next word
    body = [line.rstrip() for line in out.splitlines()]
    for line, after in itertools.pairwise(body):
        if "│" in line + after or "─" in line + after:
            continue  # the panels of options and commands: tables with their own wrapping
        text, following = line.strip(), after.strip()
        if not text or not following or following.startswith(("Example:", "- ", "(")):
            continue
        if text.startswith(("Usage:", "Example:")):
            continue
        room = width - 2 - len(text)
        assert len(following.split()[0]) >= room, (line, after)


def test_a_group_lists_the_first_sentence_of_each_command(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if "│ report " in line)
    entry = " ".join(line.strip(" │") for line in lines[at : at + 2])
    assert "cache replay and the caveats the analyses raised." in " ".join(entry.split())
    assert "A metrics CSV brings" not in out  # the rest is in bmoe report --help
