"""The route views against the established tool's printed output on the same traces.

The reference text (``--view all``) is parsed section by section and every figure it prints
is compared with bmoe's DataFrames to the printed precision.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from bmoe.analyze import route
from bmoe.formats.route import read_route_trace

GEMMA = "route-trace/gemma.route.csv"
CELL_WIDTH = 22  # the reference truncates matrix cells to this width


def parse_reference(text: str) -> dict[str, list[str]]:
    """Section title (the words before the first ' - ' or '(') -> its lines; the lines
    before the first section go under 'header'."""
    sections: dict[str, list[str]] = {"header": []}
    current = "header"
    for line in text.splitlines():
        m = re.match(r"=== (.*) ===$", line)
        if m:
            title = m.group(1)
            current = next(
                name
                for key, name in (
                    ("matrix", "matrix"),
                    ("hot experts", "hot"),
                    ("reuse distance", "reuse"),
                    ("overlap", "overlap"),
                    ("working-set", "workset"),
                    ("cache outcome", "cache"),
                    ("entropy", "entropy"),
                    ("bytes read", "bytes"),
                    ("sanity", "sanity"),
                )
                if key in title
            )
            sections[current] = [line]
            continue
        sections[current].append(line)
    return sections


def table_rows(lines: list[str]) -> list[list[str]]:
    """Whitespace-split lines whose first token is a layer number or ALL."""
    return [ln.split() for ln in lines if re.match(r"\s+(\d+|ALL)\s", ln)]


def close(value, printed: str) -> bool:
    """`value` equals the printed figure to its printed precision."""
    printed = printed.rstrip("%")
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(value) - float(printed)) <= 0.5 * 10**-decimals + 1e-9


def check_table(frame: pd.DataFrame, rows: list[list[str]], columns: list[str]) -> None:
    assert len(rows) == len(frame), (len(rows), len(frame))
    by_layer = {
        str(layer): rec for layer, rec in zip(frame["layer"], frame.to_dict("records"), strict=True)
    }
    for row in rows:
        rec = by_layer[row[0]]
        for col, printed in zip(columns, row[1:], strict=True):
            assert close(rec[col], printed), (row[0], col, rec[col], printed)


def check_matrix(grid: pd.DataFrame, lines: list[str]) -> None:
    """Every printed cell (the reference cuts cells at 22 characters)."""
    head = next(i for i, ln in enumerate(lines) if ln.strip().startswith("step |"))
    layers = [c.strip() for c in lines[head].split("|")[1:]]
    assert layers == [c for c in grid.columns if c.startswith("L")]
    body = [ln for ln in lines[head + 1 :] if "|" in ln]
    assert len(body) == len(grid)
    for ln, (_, rec) in zip(body, grid.iterrows(), strict=True):
        parts = [p.strip() for p in ln.split("|")]
        assert int(parts[0]) == rec["step"]
        for name, printed in zip(layers, parts[1:], strict=True):
            assert rec[name][:CELL_WIDTH].strip() == printed, (rec["step"], name)


def check_views(trace, text: str, phase: str) -> None:
    ref = parse_reference(text)
    selected = route.select(trace, phase)
    views = route.route_views(selected, route.VIEWS)
    header = "\n".join(ref["header"])
    assert f"phase   {phase}   rows {len(selected.rows)}" in header

    # matrix: the first 20 steps, every cell
    check_matrix(views["matrix"], ref["matrix"])
    assert len(views["matrix"]) == min(20, selected.rows["step"].nunique())

    # hot: unique, coverage, and the top-8 listing in order (ties: first routed first)
    rows = [ln.split() for ln in ref["hot"] if re.match(r"\s+\d+\s", ln)]
    hot = views["hot"].set_index("layer")
    assert len(rows) == len(hot)
    for row in rows:
        rec = hot.loc[int(row[0])]
        assert rec["unique"] == int(row[1])
        assert close(rec["coverage_pct"], row[2])
        assert rec["top"] == " ".join(row[3:])

    check_table(
        views["reuse"], table_rows(ref["reuse"]), ["n_reuse", "p50", "p90", "max", "never_2nd"]
    )
    check_table(views["overlap"], table_rows(ref["overlap"]), ["lag_1", "lag_2", "lag_4", "lag_8"])

    # workset: the marks chosen, every count, and the union's MiB
    ws_head = next(ln.split() for ln in ref["workset"] if ln.startswith("layer"))
    marks = ws_head[2:]
    ws = views["workset"]
    assert [c for c in ws.columns if c.startswith("s")] == marks
    check_table(ws[ws["layer"] != route.ALL], table_rows(ref["workset"]), ["of", *marks])
    union = re.search(r"At step (\d+) the union .* is ([\d.]+) MiB", "\n".join(ref["workset"]))
    assert marks[-1] == f"s{union.group(1)}"
    assert close(ws.loc[ws["layer"] == route.ALL, "union_mib"].item(), union.group(2))

    cache = views["cache"]
    check_table(
        cache, table_rows(ref["cache"]), ["miss_pct", "hit_pct", "prefetch_pct", "routings"]
    )
    if any("no prefetch hits recorded" in ln for ln in ref["cache"]):
        assert route.prefetch_slots(selected).empty

    ent_max = re.search(r"max = ([\d.]+) at k=(\d+)", ref["entropy"][0])
    assert int(ent_max.group(2)) == trace.n_expert_used
    check_table(views["entropy"], table_rows(ref["entropy"]), ["entropy_bits", "top1_pct"])

    by = views["bytes"]
    check_table(
        by[by["layer"] != route.ALL],
        table_rows(ref["bytes"]),
        ["read_mib", "expert_mib", "dense_mib"],
    )
    text_bytes = "\n".join(ref["bytes"])
    total = re.search(r"total ([\d.]+) MiB over (\d+) steps \(([\d.]+) MiB/step", text_bytes)
    all_row = by[by["layer"] == route.ALL].iloc[0]
    assert close(all_row["read_mib"], total.group(1))
    assert int(total.group(2)) == views["sanity"]["steps"].item()
    assert close(all_row["mib_per_step"], total.group(3))
    dense = re.search(r"dense total ([\d.]+) MiB", text_bytes)
    assert close(all_row["dense_mib"], dense.group(1))

    san = views["sanity"].iloc[0]
    text_sanity = "\n".join(ref["sanity"])
    assert int(re.search(r"rows\s+(\d+)", text_sanity).group(1)) == san["rows"]
    cells = re.search(r"cells \(step,layer\) (\d+) over (\d+) steps x (\d+) MoE", text_sanity)
    assert [int(g) for g in cells.groups()] == [san["cells"], san["steps"], san["layers"]]
    not_k = re.search(r"cells not k=(\d+)\s+(\d+)", text_sanity)
    assert [int(g) for g in not_k.groups()] == [san["k"], san["cells_not_k"]]
    wsum = re.search(r"min ([\d.]+)\s+max ([\d.]+)", text_sanity)
    assert close(san["weight_sum_min"], wsum.group(1))
    assert close(san["weight_sum_max"], wsum.group(2))


@pytest.fixture(scope="module")
def gemma(corpus: Path):
    return read_route_trace(corpus / GEMMA)


@pytest.mark.parametrize("phase", ["decode", "prefill", "all"])
def test_gemma_every_figure(corpus: Path, gemma, phase: str) -> None:
    text = (corpus / f"reference/gemma.route-analyze.{phase}.txt").read_text(encoding="utf-8")
    check_views(gemma, text, phase)


def test_gemma_hit_matrix(corpus: Path, gemma) -> None:
    text = (corpus / "reference/gemma.route-analyze.matrix-hit.txt").read_text(encoding="utf-8")
    lines = parse_reference(text)["matrix"]
    assert "cells: hit" in lines[0]
    steps = [int(ln.split("|")[0]) for ln in lines if re.match(r"\s+\d+ \|", ln)]
    selected = route.select(gemma, "decode", steps=range(steps[0], steps[-1] + 1))
    check_matrix(route.matrix(selected, cells="hit", limit=None), lines)


def test_tiny_trace_recorded_with_dropping(corpus: Path) -> None:
    trace = read_route_trace(corpus / "native-tiny/drop.route.csv")
    text = (corpus / "reference/native-tiny.drop.route-analyze.txt").read_text(encoding="utf-8")
    check_views(trace, text, "decode")
    note = re.search(r"NOTE .* (\d+) of (\d+) routings \(([\d.]+)%\)", text)
    selected = route.select(trace, "decode")
    said = " ".join(route.caveats(trace, selected, "decode"))
    assert f"{note.group(1)} of {note.group(2)} routings ({note.group(3)}%)" in said
    assert "ROUTER" in said
