"""The command line imports only what a command needs: ``bmoe --help`` starts without pandas,
numpy, pyarrow or matplotlib, and the lazy command index matches the commands that exist.

Module imports are checked in a fresh interpreter (a subprocess), since this one has long
imported everything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from bmoe import cli

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "numpy", "pyarrow", "matplotlib", "bmoe.analyze", "bmoe.render.tables")

_PROBE = """
import contextlib, io, json, sys
from bmoe.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

_PATHS = """
import importlib, json, sys
import typer
from bmoe import cli
cli.register(None if sys.argv[1] == "all" else [])
startup = importlib.import_module("tests.cli.test_startup")
print(json.dumps(sorted(startup.command_paths(typer.main.get_command(cli.app)))))
"""


def _fresh_json(script: str, *argv: str) -> Any:
    """Run `script` with ARGV in a fresh interpreter: the JSON of its last line of output."""
    out = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100",
             "BMOE_KERNEL_BUILD": "wait"},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_probe(*argv: str) -> tuple[int, set[str]]:
    """Run ``bmoe ARGV`` in a fresh interpreter: (exit code, modules it imported)."""
    result = _fresh_json(_PROBE, *argv)
    return result["code"], set(result["modules"])


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def command_paths(group, prefix: str = "") -> set[str]:
    """Every command path under a click group (``info``, ``analyze route``, ``analyze decode
    io``)."""
    paths = set()
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        paths.add(path)
        if hasattr(command, "commands"):  # a group
            paths |= command_paths(command, path + " ")
    return paths


def test_help_imports_no_heavy_module() -> None:
    code, modules = run_probe("--help")
    assert code == 0
    assert heavy(modules) == []


@pytest.mark.parametrize(
    ("command", "name", "options", "numba"),
    [
        (["info"], "native-tiny/run.csv", [], False),
        (["analyze", "replay"], "native-tiny/pf.route.csv", ["--budgets", "1,2"], True),
        (["analyze", "route"], "native-tiny/run.route.csv", [], False),
    ],
)
def test_commands_without_a_verdict_never_import_scipy_stats(
    corpus: Path, command, name, options, numba
) -> None:
    """scipy.stats (the statistics of verdicts and intervals, 0.3-0.6 s to import) is loaded
    only where a verdict or an interval is computed. A command that runs compiled kernels
    still loads scipy.linalg: numba looks for BLAS there wherever scipy is installed."""
    code, modules = run_probe(*command, str(corpus / name), *options)
    assert code == 0
    assert [m for m in modules if m == "scipy.stats" or m.startswith("scipy.stats.")] == []
    if not numba:
        assert [m for m in modules if m == "scipy" or m.startswith("scipy.")] == []


def test_a_lazy_command_imports_its_module_only() -> None:
    code, modules = run_probe("analyze", "route", "--help")
    assert code == 0
    assert "bmoe.cli.route" in modules
    others = [m for m in cli.COMMAND_MODULES if m != "bmoe.cli.route"]
    assert [m for m in others if m in modules] == []


_ALONE_AND_ALL = """
import contextlib, io, json, sys
from bmoe import cli
outputs = []
for every in (False, True):  # its module alone (a fresh interpreter), then every module
    if every:
        cli.register()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(sys.argv[1:])
    outputs.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(outputs))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "route", "--help"],
        ["analyze", "route", "--bogus"],
        ["analyze", "route", "native-tiny/run.route.csv", "--view", "hot,reuse"],
        ["export", "trace", "--help"],
    ],
)
def test_a_lazy_command_alone_runs_as_with_every_module(corpus: Path, argv: list[str]) -> None:
    """A command line naming a lazy command registers its module alone; the command's help,
    errors and output are those it has with every command module registered."""
    argv = [str(corpus / a) if a.endswith(".csv") else a for a in argv]
    alone, every = _fresh_json(_ALONE_AND_ALL, *argv)
    assert alone == every
    assert alone[1] or alone[2]  # it said something


def test_modules_for_a_command_line() -> None:
    lazy = set(cli.LAZY_COMMANDS.values())
    eager = [m for m in cli.COMMAND_MODULES if m not in lazy]
    assert cli.modules_for(None) == list(cli.COMMAND_MODULES)
    assert cli.modules_for([]) == eager
    assert cli.modules_for(["info", "x.csv"]) == eager
    # a command of a lazy module: that module alone
    assert cli.modules_for(["analyze", "route", "-f", "json", "t.csv"]) == ["bmoe.cli.route"]
    assert cli.modules_for(["export", "trace", "--help"]) == ["bmoe.cli.op_traces"]
    # the group alone, or a command the index does not know: every lazy module of the group
    everything = {*eager, *(m for p, m in cli.LAZY_COMMANDS.items() if p.startswith("analyze "))}
    assert set(cli.modules_for(["analyze", "--help"])) == everything
    assert set(cli.modules_for(["analyze", "rout"])) == everything
    assert set(cli.modules_for(["export"])) == {*eager, "bmoe.cli.op_traces"}


def test_lazy_index_names_exactly_the_lazy_modules_commands() -> None:
    """Every command a lazy module registers is reachable through the index (it would be
    missing when not named otherwise), and every indexed path is a real command."""

    def paths(which: str) -> set[str]:
        return set(_fresh_json(_PATHS, which))

    every, eager = paths("all"), paths("eager")
    assert set(cli.LAZY_COMMANDS) <= every
    only_lazy = every - eager
    for path in only_lazy:
        assert any(path == p or path.startswith(p + " ") for p in cli.LAZY_COMMANDS), path


def test_help_text_names_match_the_library() -> None:
    from bmoe.cli.formats import TARGETS
    from bmoe.formats.convert import TARGETS as CONVERT_TARGETS
    from bmoe.render.outputs import FORMATS
    from bmoe.render.tables import FORMATS as TABLE_FORMATS

    assert TARGETS == CONVERT_TARGETS
    assert FORMATS is TABLE_FORMATS
    cli.register()
    assert {"info", "analyze route", "export trace"} <= command_paths(
        typer.main.get_command(cli.app)
    )


def test_the_route_command_loads_no_masked_arrays_nor_pandas(tmp_path: Path) -> None:
    """``bmoe analyze route`` on a trace with a layer whose reuse distances are unknown (its
    gaps held without numpy's masked arrays) imports neither numpy.ma (~12 ms) nor pandas,
    and still prints the gap."""
    from tests.cli.test_route import write_gaps_trace

    path = write_gaps_trace(tmp_path / "gaps.route.csv")
    code, modules = run_probe("analyze", "route", str(path))
    assert code in (0, None)
    assert "numpy" in modules  # the probe saw the command run
    assert not {"numpy.ma", "pandas"} & modules
