"""The sweep report opens with its answer (the verdict, then the ranking and the plot that
answers; what ran last), near-identical caveats are said once with their counts, and an
empty table says "(none)"."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from bmoe.render.report import Report, collapsed

ROOT = Path(__file__).resolve().parents[2]


def test_near_identical_caveats_collapse_into_one_line_with_counts() -> None:
    lines = [
        "system check (3 of 45 runs): 5 other tasks were running on 2 CPUs before the run",
        "system check (4 of 45 runs): 3 other tasks were running on 2 CPUs before the run",
        "system check (1 of 45 runs): 7 other tasks were running on 2 CPUs before the run",
        "system check (2 of 45 runs): the engine got 41% of a CPU",
        "system check (2 of 45 runs): the engine got 41% of a CPU",  # an exact repeat
        "4 of 4 cells ran once (no spread to judge them by)",
        "contamination: cache_mb-8_io_threads-4-1dd19ea1 entered with 3000 MiB",
        "contamination: cache_mb-4_io_threads-2-29ab4f81 entered with 2000 MiB",
    ]
    assert collapsed(lines) == [
        # 3 + 4 + 1 runs (each run says its count once), the counts as their range
        "system check (8 of 45 runs): 3-7 other tasks were running on 2 CPUs before the run"
        " [3 alike]",
        "system check (2 of 45 runs): the engine got 41% of a CPU",
        "4 of 4 cells ran once (no spread to judge them by)",
        # different cells are different caveats: digits inside names are not figures
        "contamination: cache_mb-8_io_threads-4-1dd19ea1 entered with 3000 MiB",
        "contamination: cache_mb-4_io_threads-2-29ab4f81 entered with 2000 MiB",
    ]
    report = Report("t")
    report.caveats(lines)
    assert report.parts[0].count("<li>") == 5


def test_an_empty_table_says_none() -> None:
    report = Report("t")
    report.table(pd.DataFrame({"tell": [], "cells": [], "evidence": []}), "contamination tells")
    table = report.parts[-1]
    assert "<th>tell</th><th>cells</th><th>evidence</th>" in table
    body = table.split("<tbody>")[1]
    assert re.fullmatch(r'<tr><td class="none" colspan="3">\(none\)</td></tr></tbody>.*', body)


def test_contents_come_after_the_lead() -> None:
    report = Report("t")
    report.heading("Verdict")
    report.text("the answer", cls="verdict")
    report.end_lead()
    report.heading("Ranking")
    report.heading("cells", 3)
    page = report.html()
    assert page.index("the answer") < page.index("<nav>") < page.index('id="ranking"')
    nav = page.split("<nav>")[1].split("</nav>")[0]  # a line per section, sub-sections on it
    assert nav.count("<li>") == 2 and 'href="#cells"' in nav


@pytest.mark.slow
def test_the_sweep_report_opens_with_its_answer(tmp_path: Path) -> None:
    import bmoe
    from bmoe.render.pages import sweep_report

    archive = bmoe.load_archive(ROOT / "bench-data" / "2026-11-29-tiny-cache-lanes")
    page = sweep_report(archive)
    order = [
        page.index('<p class="verdict">Ranking by tok_s_mean'),
        page.index('<div class="caveats'),
        page.index("<nav>"),
        page.index('data-view="ranking"'),
        page.index('<img alt="tok_s_mean against cache_mb by io_threads'),
        page.index('data-view="neighbours"'),
        page.index('data-view="stability"'),
        page.index('id="what-ran"'),
        page.index('data-view="attempts"'),
        page.index("[grid]"),  # the resolved configuration, last
    ]
    assert order == sorted(order)
    # the header holds nothing but the title and two lines before the verdict
    header = page.split("<body>")[1].split('<h2 id="verdict">')[0]
    assert header.count("<p") == 2 and "<table" not in header
