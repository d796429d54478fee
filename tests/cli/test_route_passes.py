"""``bmoe analyze route --stream``: the views computed in passes over the file print what the
whole-trace command prints, from CSV or Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bmoe.cli import main, route_passes
from bmoe.formats.parquet import write_table
from bmoe.formats.route import read_route_trace

GEMMA = "route-trace/gemma.route.csv"


def same(streamed: str, whole: str) -> None:
    """The same text, or for JSON the same views to the last bits of a float (pooled means
    add in another order)."""
    if not whole.startswith("{"):
        assert streamed == whole
        return
    a, b = json.loads(streamed), json.loads(whole)
    assert list(a) == list(b)
    for name in b:
        pd.testing.assert_frame_equal(pd.DataFrame(a[name]), pd.DataFrame(b[name]), rtol=1e-12)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["analyze", "route", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("extra", [[], ["--phase", "all", "-f", "json"]])
def test_passes_print_the_whole_command_s_views(corpus: Path, capsys, tmp_path, extra) -> None:
    path = corpus / GEMMA
    code, whole, _ = run(capsys, path, *extra)
    assert code == 0
    code, streamed, _ = run(capsys, path, "--stream", *extra)
    assert code == 0
    same(streamed, whole)
    pq_path = write_table(read_route_trace(path), "route", tmp_path / "g.route.parquet")
    code, streamed, _ = run(capsys, pq_path, "--stream", *extra)
    assert code == 0
    same(streamed, whole)


def test_small_passes_give_the_same_views(corpus: Path, capsys, monkeypatch) -> None:
    """Passes of two layers at a time (30 layers: 15 passes) join to the whole views."""
    path = corpus / GEMMA
    code, whole, _ = run(capsys, path, "-f", "json")
    monkeypatch.setattr(route_passes, "PASS_ROWS", 2 * 768)
    code, streamed, _ = run(capsys, path, "--stream", "-f", "json")
    assert code == 0
    same(streamed, whole)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--view", "matrix"], "every view but matrix"),
        (["--max-steps", "3"], "--stream does not go with --max-steps"),
        (["--plot", "x.png"], "--stream does not go with --max-steps or --plot"),
    ],
)
def test_passes_refuse_what_needs_every_row(corpus: Path, capsys, extra, said) -> None:
    code, _, err = run(capsys, corpus / GEMMA, "--stream", *extra)
    assert code == 2 and said in err
