"""Tables fit the console: the direct printer writes exactly what rich writes on a console
without styles, no line is wider than the console, numbers and short words are never cut,
headers break only after ``_`` and the like, and a table too wide is split by columns with
its leading name columns repeated."""

from __future__ import annotations

import io
import random
import re

from rich.console import Console
from rich.text import Text

from bmoe.render import tables
from bmoe.render.tables import MISSING, layout, plain_table, print_table, rich_table, wrap_text

WORDS = ["0", "7", "12.5", "-3", "1000000", MISSING, "ALL", "a b", "x:1 y:22 z:333", "", "nan"]


def _random_columns(rng: random.Random) -> tables.CellColumns:
    n_cols = rng.randint(1, 12)
    n_rows = rng.randint(0, 6) if rng.random() < 0.2 else rng.randint(1, 6)
    columns = []
    for i in range(n_cols):
        numeric = rng.random() < 0.5
        header = rng.choice(
            ["layer", "n", "coverage_pct", "top", f"c{i}", "a long header", "read_mib_per_token"]
        )
        cells = []
        for _ in range(n_rows):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
            cells.append(text.strip() if rng.random() < 0.99 else text)
        columns.append((header, numeric, cells))
    return columns


def _rich_text(columns: tables.CellColumns, width: int, title: str | None) -> str:
    """What print_table's rich path draws, on a console without styles."""
    console = Console(file=io.StringIO(), width=width, color_system=None, markup=False)
    for part in layout(columns, width, title):
        if part.title is not None:
            console.print(Text(part.title), soft_wrap=True)
        console.print(rich_table(part.columns, None, part.widths))
    return console.file.getvalue()


def _words_kept(columns: tables.CellColumns, text: str, width: int) -> None:
    """Every cell's words (numbers whole; text up to WORD_WIDTH characters) are on one line
    of `text`, so none was cut (unless a number alone is wider than the console)."""
    lines = text.splitlines()
    for _h, numeric, cells in columns:
        for cell in cells:
            words = [cell] if numeric else cell.split()
            for word in words:
                if len(word) <= (width - 4 if numeric else tables.WORD_WIDTH):
                    assert any(word in line for line in lines), (word, text)


def test_same_characters_as_rich_and_nothing_cut() -> None:
    rng = random.Random(18)
    written = split = 0
    for _ in range(400):
        columns = _random_columns(rng)
        width = rng.randint(30, 200)
        title = rng.choice([None, "view", "a title longer than some of the narrow tables here"])
        text = plain_table(columns, width, title)
        if text is None:
            continue
        assert text == _rich_text(columns, width, title), (columns, width, title)
        written += 1
        split += text.count(", continued") > 0
        title_lines = {title, f"{title}, continued"}
        for line in text.splitlines():
            assert len(line) <= width or line in title_lines, (line, width)
        _words_kept(columns, text, width)
    assert written > 250  # most tables took the direct path, so the comparison means something
    assert split > 30  # and many were split


def test_a_wide_table_is_split_with_its_names_repeated() -> None:
    names = [f"cache_mb-{i}_io_threads-2-{i:08x}" for i in range(3)]
    columns = [("rank", True, ["1", "2", "3"]), ("cell", False, names)] + [
        (f"figure_{k}", True, [f"{k}{i}.125" for i in range(3)]) for k in range(12)
    ]
    text = plain_table(columns, 80, "cells")
    assert text is not None
    parts = [p for p in re.split(r"^cells(?:, continued)?$", text, flags=re.M) if p.strip()]
    assert len(parts) >= 2
    for part in parts:  # each part names its rows: rank and cell
        assert "rank" in part and "cell" in part and all(n[:14] in part for n in names)
    headers = [h for part in parts for h in _headers(part)]
    for k in range(12):  # every column is in some part, its values whole
        assert f"figure_{k}" in headers
        assert all(f"{k}{i}.125" in text for i in range(3))
    assert headers.count("rank") == headers.count("cell") == len(parts)
    assert max(map(len, text.splitlines())) <= 80


def _headers(part: str) -> list[str]:
    """The column headers of one printed table, their pieces joined down the lines."""
    lines = [line.strip("┃").split("┃") for line in part.splitlines() if line.startswith("┃")]
    return ["".join(cell.strip() for cell in column) for column in zip(*lines, strict=True)]


def test_headers_break_after_underscores_not_letters() -> None:
    columns = [("axis", False, ["cache_mb", "io_threads"])] + [
        (name, True, ["0.5", "12.25"])
        for name in ("cache_hit_pct", "peak_rss_gb", "read_mib_per_token", "tok_s_mean", "ttft_s")
    ]
    text = plain_table(columns, 60)
    assert text is not None and ", continued" not in text
    header = [line for line in text.splitlines() if line.startswith("┃")]
    pieces = {p.strip() for line in header for p in line.strip("┃").split("┃")} - {""}
    allowed = {"axis", "cache_", "hit_pct", "hit_", "pct", "cache_hit_pct", "peak_", "rss_gb"}
    allowed |= {"rss_", "gb", "peak_rss_gb", "read_", "mib_", "per_", "token", "mib_per_"}
    allowed |= {"per_token", "read_mib_", "tok_s_mean", "tok_", "s_mean", "s_", "mean", "ttft_s"}
    allowed |= {"read_mib_per_token", "tok_s_", "ttft_", "s"}
    assert pieces <= allowed, pieces - allowed


def test_wrap_text() -> None:
    assert wrap_text("a bb ccc", 4) == ["a bb", "ccc"]
    assert wrap_text("read_mib_per_token", 9) == ["read_mib_", "per_token"]
    path = "bench-data/2026-11-29-small-traces/cells/x/r1/run.csv"
    lines = wrap_text(path, 20)
    assert "".join(lines) == path and all(len(line) <= 20 for line in lines)
    assert lines[0].endswith("/") and lines[0] == "bench-data/"
    assert wrap_text("x" * 10, 4) == ["xxxx", "xxxx", "xx"]  # nothing to break at: cut


def test_narrow_consoles() -> None:
    listing = " ".join(f"{e}:{e * 37}" for e in range(12))
    cases = [
        [("figure", False, ["a" * 30]), ("value", True, ["1"])],  # a word folded
        [("layer", True, ["0", "47"]), ("top", False, [listing, listing[:15]])],  # wrapped
        [("layer", False, ["0", "ALL"])]  # numbers never cut: the table is split
        + [(f"s{10**i}", True, [str(7 * 10**i), str(9 * 10**i)]) for i in range(12)],
    ]
    for columns in cases:
        for width in (30, 41, 57, 80):
            text = plain_table(columns, width)
            assert text is not None
            assert text == _rich_text(columns, width, None), (columns, width)
            assert max(map(len, text.splitlines())) <= width
            _words_kept(columns, text, width)


def test_empty_and_unusual_tables_are_left_to_rich() -> None:
    assert plain_table([("figure", False, [])], 80) is None  # the "(none)" caption
    assert plain_table([("figure", False, ["tab\there"])], 80) is None
    assert plain_table([("figure", False, ["wide 表"])], 80) is None
    assert plain_table([("figure", False, ["x "])], 80) is None


def test_print_table_uses_rich_for_styled_consoles() -> None:
    columns = [("layer", True, ["1", "22"]), ("top", False, ["a:1", "b:2"])]
    plain = Console(file=io.StringIO(), width=80, color_system=None, markup=False)
    styled = Console(file=io.StringIO(), width=80, force_terminal=True, color_system="truecolor")
    print_table(plain, columns, "t")
    print_table(styled, columns, "t")
    assert plain.file.getvalue() == _rich_text(columns, 80, "t")
    assert "\x1b[" in styled.file.getvalue()  # bold header, italic title: rich drew it
    unstyled = re.sub(r"\x1b\[[0-9;]*m", "", styled.file.getvalue())
    assert unstyled == plain.file.getvalue()


def test_print_line_writes_what_rich_prints() -> None:
    """A line written straight (plain text that fits) reads as rich prints it; one that does
    not fit, is not plain or goes to a recording console is printed by rich itself."""
    from bmoe.render.messages import guarded, literal
    from bmoe.render.tables import print_line

    lines = ["", "=== sanity ===", "x" * 40, "y" * 41, "a b " * 12 + "end", " lead", "trail ",
             "tab\there", "wide 表", "esc \x1b[31m", f"{MISSING} missing"]  # fmt: skip
    for width in (40, 80):
        direct = guarded(Console(file=io.StringIO(), width=width, color_system=None))
        by_rich = guarded(Console(file=io.StringIO(), width=width, color_system=None))
        for line in lines:
            print_line(direct, line, "dim")
            by_rich.print(literal(line, "dim"), highlight=False)
        assert direct.file.getvalue() == by_rich.file.getvalue()
        assert "y" * 40 + "\n" in direct.file.getvalue()  # the 41 characters wrapped, by rich
    recording = Console(file=io.StringIO(), width=80, color_system=None, record=True)
    print_line(recording, "kept")
    assert recording.export_text() == "kept\n"


def test_json_values_from_times_are_plain_text_and_seconds() -> None:
    import json

    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(
        {"start": [pd.Timestamp("2026-12-02 10:00:01")], "took": [pd.Timedelta(seconds=3)]}
    )
    text = json.dumps(tables.records(frame))
    assert json.loads(text) == [{"start": "2026-12-02T10:00:01", "took": 3.0}]
    assert tables.plain(np.datetime64("2026-01-01T00:00:00")) == "2026-01-01T00:00:00"
