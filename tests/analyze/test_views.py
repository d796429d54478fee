"""The catalogue of views: slugs are stable identifiers, titles are filled from the analysis's
parameters, and every view an analysis returns is catalogued under the slug it is keyed by."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from bmoe.analyze import history as hist
from bmoe.analyze import route
from bmoe.analyze.sweep import analyze_sweep
from bmoe.analyze.views import GROUPS, HISTORY, ROUTE, SWEEP, Group, View, titles
from bmoe.cli import main
from bmoe.render.tables import render
from bmoe.sweep.archive import write_results


def grid(shift: float = 0.0, day: int = 1) -> pd.DataFrame:
    """A 2x2 sweep, three repeats a cell, the second round reversed."""
    rows = []
    order = 0
    for rnd in (1, 2, 3):
        cells = [(0, 1), (0, 2), (8, 1), (8, 2)]
        for cache, io in cells[::-1] if rnd == 2 else cells:
            rows.append({
                "run": f"c{cache}-{io}/r{rnd}", "cell": f"cache_mb-{cache}-io-{io}",
                "cache_mb": cache, "io_threads": io, "order": order, "round": rnd,
                "reversed": rnd == 2, "status": "ok", "target": "t", "engine": "embedded",
                "tok_s_mean": 10 * (1 + cache / 8) + io + shift + 0.1 * rnd, "ttft_s": 0.5 + io,
                "started": f"2026-12-{day:02d}T10:{order:02d}:00+00:00",
            })  # fmt: skip
            order += 1
    frame = pd.DataFrame(rows)
    frame.attrs.update(axes=["cache_mb", "io_threads"], params=["cache_mb", "io_threads"])
    return frame


def test_slugs_are_identifiers_and_unique_within_their_group() -> None:
    for group in GROUPS.values():
        assert group.slugs, group.name
        for slug in group.slugs:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", slug), (group.name, slug)
    with pytest.raises(ValueError, match="twice"):
        Group("g", (View("a", "A"), View("a", "B")))


def test_titles_are_filled_from_the_parameters() -> None:
    assert SWEEP.title("ranking", outcome="ttft_s") == "cells ranked by ttft_s"
    assert HISTORY.titles(outcome="tok_s_mean", threshold_pct=7.5)["regressions"] == (
        "regressions beyond 7.5 % into the newest sweep"
    )
    # a title whose parameter is not given keeps the slug rather than fail or show braces
    assert titles("sweep")["ranking"] == "ranking"
    with pytest.raises(KeyError, match="no view 'nope'"):
        SWEEP["nope"]


def test_sections_keep_the_catalogue_order() -> None:
    sections = SWEEP.sections()
    assert list(sections)[:2] == ["Verdict", "Ranking"] and list(sections)[-1] == "What ran"
    ranking = [v.slug for v in sections["Ranking"]]
    assert ranking[:3] == ["ranking", "neighbours", "stability"]  # in the group's order
    listed = [v.slug for views in sections.values() for v in views]
    assert listed == [s for s in SWEEP.slugs if s in listed]  # each section's views together
    assert "regressions" not in {v.slug for views in HISTORY.sections().values() for v in views}


def test_every_view_of_a_sweep_and_a_history_is_catalogued() -> None:
    views = analyze_sweep(grid(), "tok_s_mean", predictions=pd.DataFrame(
        {"cell": ["cache_mb-0-io-1"], "tok_s": [11.0]}))  # fmt: skip
    assert {"verdict", "ranking", "predicted", "order_effect"} <= set(views)
    assert set(views) <= set(SWEEP.slugs)
    found = hist.history_of({"old": grid(0.0, 1), "new": grid(-3.0, 2)})
    assert list(found.views()) == list(HISTORY.slugs)
    assert found.titles()["trend"] == "tok_s_mean per cell and sweep"


def test_every_route_view_is_catalogued() -> None:
    from tests.analyze.test_route import cells, make_trace

    trace = make_trace(cells({10: {0: [1, 2]}, 11: {0: [2, 3]}, 12: {0: [1, 2]}}))
    views = route.route_views(trace, route.VIEWS)
    assert list(views) == list(route.VIEWS)  # every view --view names, in the catalogue's order
    assert set(views) | {"prefetch_slots"} == set(ROUTE.slugs)  # (added by the command)


def test_json_keys_are_slugs_and_tables_show_titles(tmp_path: Path, capsys) -> None:
    root = tmp_path / "sweep"
    root.mkdir()
    write_results(root, grid(), ["cache_mb", "io_threads"], "grid")
    assert main(["analyze", "sweep", str(root), "-f", "json", "--outcome", "ttft_s"]) == 0
    keys = list(json.loads(capsys.readouterr().out))
    assert "ranking" in keys and set(keys) <= set(SWEEP.slugs)
    text = render({"ranking": pd.DataFrame({"cell": ["a"]})}, "markdown",
                  titles=SWEEP.titles(outcome="ttft_s"))  # fmt: skip
    assert text.startswith("### cells ranked by ttft_s\n")
    csv = render({"ranking": pd.DataFrame({"cell": ["a"]})}, "csv",
                 titles=SWEEP.titles(outcome="ttft_s"))  # fmt: skip
    assert csv.startswith("# view=ranking\n")


def test_every_drop_view_is_catalogued() -> None:
    from bmoe.analyze.drop import drop_replay
    from bmoe.analyze.views import DROP
    from bmoe.render.replay import drop_views
    from tests.analyze.test_route import cells, make_trace

    spec = {10: {0: [1, 2]}, 11: {0: [2, 3]}, 12: {0: [1, 2]}}
    trace = make_trace(cells(spec) + cells({1: {0: [4, 5]}}, phase=0))
    views = drop_views(drop_replay(trace))
    assert list(views) == list(DROP.slugs)  # decode, then prefill, each summary first
