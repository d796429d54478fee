"""Expert ids outside the preamble's n_expert: named (file, row, value) by the analyses that
still run on such a trace, as validate names them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_inputs import run_in_process

from bmoe.analyze.ids import experts_beyond_declared
from bmoe.formats.route import read_route_trace


def _with_experts(corpus: Path, tmp_path: Path, values: dict[int, str]) -> Path:
    """The tiny route trace with the expert of data rows `values` (1-based) replaced."""
    lines = (corpus / "native-tiny/run.route.csv").read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    column = lines[header].strip().split(",").index("expert")
    for row, value in values.items():
        fields = lines[header + row].rstrip("\n").split(",")
        fields[column] = value
        lines[header + row] = ",".join(fields) + "\n"
    path = tmp_path / "ids.route.csv"
    path.write_text("".join(lines))
    return path


def test_an_honest_trace_says_nothing(corpus: Path) -> None:
    assert experts_beyond_declared(read_route_trace(corpus / "native-tiny/run.route.csv")) is None


@pytest.mark.parametrize(
    ("values", "first", "count"),
    [({5: "8"}, ("8", 5), None), ({4: "-1", 9: "40"}, ("-1", 4), 2)],
)
def test_ids_outside_n_expert_are_named(corpus, tmp_path, values, first, count) -> None:
    path = _with_experts(corpus, tmp_path, values)
    said = experts_beyond_declared(read_route_trace(path))
    assert said is not None and said.startswith(str(path))
    assert f"expert id {first[0]} (routing row {first[1]}" in said
    assert "n_expert=8" in said
    assert (f"{count} rows" in said) if count else ("rows" not in said)


def test_without_a_declared_n_expert_only_negative_ids_are_named(corpus, tmp_path) -> None:
    trace = read_route_trace(_with_experts(corpus, tmp_path, {2: "40"}))
    del trace.meta["n_expert"]
    assert experts_beyond_declared(trace) is None
    trace = read_route_trace(_with_experts(corpus, tmp_path, {2: "40", 7: "-1"}))
    trace.meta["n_expert"] = float("nan")  # not a count: as if undeclared
    assert "expert id -1 (routing row 7) is negative" in experts_beyond_declared(trace)


def test_route_replay_and_drop_warn(corpus: Path, tmp_path: Path) -> None:
    path = _with_experts(corpus, tmp_path, {3: "12"})
    for args in (
        ["analyze", "route", str(path), "-f", "json"],
        ["analyze", "replay", str(path), "--budgets", "1", "-f", "json"],
        ["analyze", "drop", str(path), "-f", "json"],
    ):
        result = run_in_process(args)
        assert result.code == 0, (args, result.err)
        warned = [line for line in result.err.splitlines() if line.startswith("warning:")]
        assert any(
            str(path) in line and "expert id 12 (routing row 3)" in line for line in warned
        ), (args, result.err)
