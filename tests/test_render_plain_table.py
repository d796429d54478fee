"""The direct table printer writes exactly what rich writes on a console without styles."""

from __future__ import annotations

import io
import random

from rich.console import Console

from bmoe.render import tables
from bmoe.render.tables import MISSING, plain_table, print_table, rich_table

WORDS = ["0", "7", "12.5", "-3", "1000000", MISSING, "ALL", "a b", "x:1 y:22 z:333", "", "nan"]


def _random_columns(rng: random.Random) -> tables.CellColumns:
    n_cols = rng.randint(1, 7)
    n_rows = rng.randint(0, 6) if rng.random() < 0.2 else rng.randint(1, 6)
    columns = []
    for i in range(n_cols):
        numeric = rng.random() < 0.5
        header = rng.choice(["layer", "n", "coverage_pct", "top", f"c{i}", "a long header"])
        cells = []
        for _ in range(n_rows):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
            cells.append(text.strip() if rng.random() < 0.99 else text)
        columns.append((header, numeric, cells))
    return columns


def _rich_text(columns: tables.CellColumns, width: int, title: str | None) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, markup=False)
    console.print(rich_table(columns, title))
    return console.file.getvalue()


def test_same_characters_as_rich() -> None:
    rng = random.Random(18)
    written = 0
    for _ in range(400):
        columns = _random_columns(rng)
        width = rng.randint(30, 200)
        title = rng.choice([None, "view", "a title longer than some of the narrow tables here"])
        text = plain_table(columns, width, title)
        if text is not None:
            assert text == _rich_text(columns, width, title), (columns, width, title)
            written += 1
    assert written > 250  # most tables took the direct path, so the comparison means something


def test_narrow_consoles_wrap_fold_and_cut_as_rich_does() -> None:
    listing = " ".join(f"{e}:{e * 37}" for e in range(12))
    cases = [
        [("figure", False, ["a" * 30]), ("value", True, ["1"])],  # a word folded
        [("layer", True, ["0", "47"]), ("top", False, [listing, listing[:15]])],  # wrapped
        [("layer", False, ["0", "ALL"])]  # numbers never cut: the lines are
        + [(f"s{10**i}", True, [str(7 * 10**i), str(9 * 10**i)]) for i in range(12)],
    ]
    for columns in cases:
        for width in (30, 41, 57, 80) if len(columns) < 5 else (57, 80):
            text = plain_table(columns, width)
            assert text is not None
            assert text == _rich_text(columns, width, None), (columns, width)


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
