"""Every command that prints a table, printed to a pipe at 80 and at 200 columns: no table
line wider than the console, and every figure and word the command's markdown form holds
(numbers, names, words up to WORD_WIDTH characters) whole on one line of the table output,
so that nothing was cut, folded letter by letter or lost off the right edge."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest

from bmoe.cli import console, main
from bmoe.render.tables import WORD_WIDTH

pytestmark = pytest.mark.slow  # some thirty commands, each three times

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "bench-data" / "2026-11-29-tiny-cache-lanes"
SMALL = ROOT / "bench-data" / "2026-11-29-small-traces"
RUN = SMALL / "cells" / "cache_mb-64_io_threads-1-281579ec" / "r1"
TINY_RUNS = sorted(TINY.glob("cells/*/r1/run.csv"))
BOX = "┏┃┡│└┗━─"

#: (name, argv, markdown words to leave out of the check: shown under another name)
COMMANDS = [
    ("sweep", ["analyze", "sweep", str(TINY)], ()),
    ("traced sweep", ["analyze", "sweep", str(SMALL)], ()),
    ("metrics", ["analyze", "metrics", *map(str, TINY_RUNS), str(RUN / "run.csv")], ("run",)),
    ("stall", ["analyze", "stall", str(RUN / "run.csv")], ()),
    ("compare", ["analyze", "compare", str(TINY_RUNS[0]), str(TINY_RUNS[-1])], ()),
    ("contamination", ["analyze", "contamination", str(TINY)], None),
    ("route", ["analyze", "route", str(RUN / "run.route.csv")], ()),
    ("route matrix", ["analyze", "route", str(RUN / "run.route.csv"), "--view", "matrix"], None),
    ("replay", ["analyze", "replay", str(RUN / "run.route.csv"), "--mrc"], None),
    (
        "replay, every policy",
        [
            "analyze",
            "replay",
            str(RUN / "run.route.csv"),
            "--budgets",
            "60,120,480",
            "--policies",
            "belady,lru,lfu,random,layer,layerlfu,"
            "arc,s3fifo,lfuda,lfu-incache,lfuda-libcachesim,s3fifo-libcachesim",
        ],
        None,
    ),
    (
        "replay prefetch",
        [
            "analyze",
            "replay",
            str(RUN / "run.route.csv"),
            "--budgets",
            "60,480",
            "--policies",
            "lru,lfu",
            "--prefetch",
            "1",
        ],
        None,
    ),
    ("drop", ["analyze", "drop", str(RUN / "run.route.csv")], None),
    ("decode compute", ["analyze", "decode", "compute", str(RUN / "run.compute.csv")], ()),
    ("decode io", ["analyze", "decode", "io", str(RUN / "run.io.csv"), "--adjacent"], ()),
    ("info", ["info", str(RUN / "run.csv"), str(RUN / "run.route.csv"), str(RUN / "run.out")], ()),
]


def _run(argv: list[str], width: int, capsys) -> str:
    old = console._width  # the console reads COLUMNS once; set its width as a pipe would
    console.width = width
    try:
        code = main(argv)
    finally:
        console._width = old
    out = capsys.readouterr().out
    assert code in (0, 1), (argv, out)  # validate says 1 for findings
    return out


def _markdown_words(text: str, leave_out: tuple[str, ...]) -> set[str]:
    """The words of every cell of the markdown tables in `text`, but for the columns named in
    `leave_out`."""
    words: set[str] = set()
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [html.unescape(c.replace("\\|", "|").replace("<br>", " ")).strip()
                 for c in re.split(r"(?<!\\)\|", line)[1:-1]]  # fmt: skip
        if not header:
            header = cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        for name, cell in zip(header, cells, strict=False):
            if name not in leave_out:
                words.update(w for w in cell.split() if len(w) <= WORD_WIDTH)
    return words


@pytest.mark.parametrize(("name", "argv", "leave_out"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_tables_fit_80_and_200_columns_and_lose_nothing(name, argv, leave_out, capsys) -> None:
    _check(name, argv, leave_out, capsys)


def test_history_profile_and_predict_fit(tmp_path: Path, capsys) -> None:
    later = tmp_path / "2026-11-30-tiny-cache-lanes"  # the same sweep again, a day later
    shutil.copytree(TINY, later)
    _check("history", ["history", str(TINY), str(later)], (), capsys)
    profile = tmp_path / "device.json"
    argv = ["profile", str(SMALL), "--allow-traced", "-o", str(profile)]
    _check("profile", argv, (), capsys, rerun=lambda: profile.unlink(missing_ok=True))
    grid = ["-g", "cache_mb=64,256", "-g", "io_threads=1,4", "-g", "prefetch=0,1"]
    argv = ["predict", str(RUN / "run.route.csv"), "-p", str(profile), *grid]
    _check("predict", argv, (), capsys)


def _check(name, argv, leave_out, capsys, rerun=lambda: None) -> None:
    outputs = {}
    for width in (80, 200):
        rerun()
        outputs[width] = _run(argv, width, capsys)
    rerun()
    for width, out in outputs.items():
        for line in out.splitlines():
            if line[:1] in BOX:
                assert len(line) <= width, (name, width, line)
    if leave_out is None:  # a text layout of its own: the width is what it promises
        for width, out in outputs.items():
            assert max(map(len, out.splitlines())) <= width, (name, width)
        return
    words = _markdown_words(_run([*argv, "-f", "markdown"], 80, capsys), leave_out)
    assert words, name
    for width, out in outputs.items():
        lines = out.splitlines()
        missing = sorted(w for w in words if not any(w in line for line in lines))
        assert not missing, (name, width, missing[:20])


def test_a_sweep_at_80_columns_names_cells_by_short_ids(capsys) -> None:
    out = _run(["analyze", "sweep", str(TINY)], 80, capsys)
    legend = out.split("cell ids\n")[1].split("\n\n")[0]
    folders = sorted(p.name for p in (TINY / "cells").iterdir())
    for folder in folders:  # each folder once, in the legend, with its id and axis values
        assert out.count(folder) == 1
        row = next(line for line in legend.splitlines() if folder in line)
        cache_mb, io_threads = re.match(r"cache_mb-(\d+)_io_threads-(\d+)-", folder).groups()
        assert re.match(rf"│ c\d+ +│ +{cache_mb} │ +{io_threads} │ {folder} │", row), row
    ranked = out.split("cells ranked by tok_s_mean\n")[1]
    assert re.search(r"│ +1 │ c\d+ +│ +8 │ +4 │", ranked)  # rank 1: 8 MiB, 4 lanes
