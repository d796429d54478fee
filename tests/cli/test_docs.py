"""The generated references stay complete: every command and option in docs/cli.md, every
benchmark in benchmarks/README.md."""

from __future__ import annotations

import re
from pathlib import Path

from bmoe.cli.docs import command_markdown, commands, parameter_names, reference

ROOT = Path(__file__).resolve().parents[2]
CLI_DOC = ROOT / "docs" / "cli.md"
REGENERATE = "docs/cli.md is out of date; regenerate it: python -m bmoe.cli.docs > docs/cli.md"


def _sections() -> dict[str, str]:
    """The committed reference's sections by heading (``bmoe analyze route``)."""
    text = CLI_DOC.read_text(encoding="utf-8")
    parts = re.split(r"^## (bmoe[^\n]*)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_and_option_is_documented() -> None:
    sections = _sections()
    missing = []
    for path, cmd in commands():
        name = " ".join(("bmoe", *path))
        if name not in sections:
            missing.append(f"command {name}")
            continue
        missing += [
            f"{name} {written}"
            for written in parameter_names(cmd)
            if f"| `{written}` |" not in sections[name]
        ]
    assert not missing, f"{REGENERATE}\nundocumented: {', '.join(missing)}"


def test_no_command_is_documented_that_does_not_exist() -> None:
    existing = {" ".join(("bmoe", *path)) for path, _ in commands()}
    stale = sorted(set(_sections()) - existing)
    assert not stale, f"{REGENERATE}\nno such command: {', '.join(stale)}"


def test_the_reference_shows_help_examples_and_defaults() -> None:
    route = dict(commands())[("analyze", "route")]
    section = command_markdown(("analyze", "route"), route)
    assert section.startswith("## bmoe analyze route\n\nViews of a routing trace")
    assert "```bash\nbmoe analyze route trace.csv --view reuse,overlap --phase decode\n" in section
    assert "Usage: `bmoe analyze route [OPTIONS] TRACE`" in section
    assert "| `--format / -f` | One of table, csv, json, markdown; in csv a text cell" in section
    assert "--help" not in section
    assert reference().count("\n## bmoe ") == len(list(commands()))


def test_every_benchmark_is_listed_in_the_benchmarks_readme() -> None:
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if p.name not in readme]
    assert not missing, f"benchmarks/README.md does not mention {', '.join(missing)}"
