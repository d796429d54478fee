"""``bmoe info`` on a small metrics CSV takes a path without pandas; it must print exactly what
the full reader's path prints, and fall back to it for anything the full reader would warn
about or refuse."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from bmoe.formats import info, metrics, quickinfo
from bmoe.render import tables

ROOT = Path(__file__).resolve().parents[2]

V1 = (
    "# bmoe_metrics v1\n"
    "# model=m.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2 threads=4\n"
    "# moe_stream=1 cache_mb=512 overlap=0 temp=0\n"
    "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct\n"
    "1,3,10.5,1.0,9.5,100,50.0\n"
    "2,3,11.25,1.0,9.5,200,40\n"
)
SUMMARY = "# summary tokens=2 s/tok=0.0105 tok/s=95 read_MiB=3 cache_hit_pct=50 load_s=2\n"
SESSION = (
    "# bmoe_metrics v2\n# engine=native\n# model=m.gguf n_layer=2\n"
    "step,steps,wall_ms,turn\n1,2,1.0,0\n2,2,1.0,0\n# summary tokens=2 tok/s=9\n"
    "1,4,1.0,1\n# summary tokens=1 tok/s=8\n"
)
V0 = "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,extra\n1,1,2.0,1,1,5,0,x\n"

QUICK = {
    "finished": V1 + SUMMARY,
    "partial": V1,
    "fewer rows than steps": V1.replace(",3,", ",5,") + SUMMARY,
    "session": SESSION,
    "v0": V0,
    "header only": V1.split("1,3,")[0] + SUMMARY,
    "bom": "\ufeff" + V1 + SUMMARY,
}
FULL = {  # the quick path must decline these
    "cut last line": V1 + SUMMARY.rstrip("\n"),
    "cut row": V1.rstrip("\n"),
    "wrong width": V1 + "3,3,1.0\n" + SUMMARY,
    "not a number": V1 + "3,3,abc,1,1,1,1\n",
    "quoted": V1 + '3,3,"1.0",1,1,1,1\n',
    "blank row": V1 + "\n" + SUMMARY,
    "crlf": (V1 + SUMMARY).replace("\n", "\r\n"),
    "no wall_ms": "step,steps\n1,1\n",
    "duplicate column": "step,wall_ms,step\n1,1.0,1\n",
    "route trace": "# route_trace v1\nstep,layer,slot,expert\n0,0,0,1\n",
}


def shown(views: info.Views, fmt: str = "table") -> str:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    text = tables.render(views, fmt, console)
    return text if text is not None else console.file.getvalue()


@pytest.mark.parametrize("name", sorted(QUICK))
def test_quick_path_prints_what_the_full_reader_prints(tmp_path: Path, name: str) -> None:
    path = tmp_path / "run.csv"
    path.write_bytes(QUICK[name].encode("utf-8"))
    quick = quickinfo.describe_small_metrics(path, info._KEY_PARAMS, info._KEY_SUMMARY)
    assert quick is not None, "the quick path declined a well-formed file"
    full = info.describe_fully(path)
    assert quick == full
    assert [type(v) for g in quick.values() for v in g.values()] == [
        type(v) for g in full.values() for v in g.values()
    ]
    for fmt in ("table", "json", "csv", "markdown"):
        assert shown(quick, fmt) == shown(full, fmt)


@pytest.mark.parametrize("name", sorted(FULL))
def test_quick_path_declines_what_it_does_not_handle(tmp_path: Path, name: str) -> None:
    path = tmp_path / "run.csv"
    path.write_bytes(FULL[name].encode("utf-8"))
    assert quickinfo.describe_small_metrics(path, info._KEY_PARAMS, info._KEY_SUMMARY) is None


def test_quick_path_declines_large_files(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "run.csv"
    path.write_text(V1 + SUMMARY, encoding="utf-8")
    monkeypatch.setattr(quickinfo, "QUICK_LIMIT", path.stat().st_size - 1)
    assert quickinfo.describe_small_metrics(path, info._KEY_PARAMS, info._KEY_SUMMARY) is None


def test_every_corpus_file_describes_alike(corpus: Path) -> None:
    seen_quick = 0
    for path in sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix != ".md"):
        try:
            full = info.describe_fully(path)
        except Exception as exc:
            with pytest.raises(type(exc)):
                info.describe(path)
            continue
        quick = quickinfo.describe_small_metrics(path, info._KEY_PARAMS, info._KEY_SUMMARY)
        seen_quick += quick is not None
        views = info.describe(path)
        assert shown(views) == shown(full), path
        assert shown(views, "json") == shown(full, "json"), path
    assert seen_quick >= 3  # the corpus's small metrics CSVs do take the quick path


def test_the_quick_path_knows_the_metrics_types() -> None:
    types = metrics.COLUMN_TYPES
    assert set(metrics.INT_COLUMNS) == quickinfo._INT_COLUMNS
    assert set(types) - set(metrics.INT_COLUMNS) == quickinfo._FLOAT_COLUMNS
    floats = {k for k in info._KEY_SUMMARY if k in metrics.SUMMARY_PRECISION}
    assert floats == quickinfo._SUMMARY_FLOATS


FIGURES = [
    {"a": 1, "b": 2},
    {"a": 1, "b": 2.5, "c": None},
    {"a": 1, "b": None},
    {"a": None},
    {"a": True, "b": False},
    {"a": True, "b": 1},
    {"a": "x", "b": 1, "c": None},
    {"a": float("nan"), "b": 3},
    {"a": 2**53 + 1, "b": 0.5},
    {},
]


@pytest.mark.parametrize("figures", FIGURES, ids=[json.dumps(f) for f in FIGURES])
def test_figure_tables_render_as_through_pandas(figures: dict) -> None:
    fast = tables.rich_tables({"v": figures})
    slow = tables.rich_tables({"v": tables._as_frame(figures)})
    text = []
    for table in (fast, slow):
        console = Console(file=io.StringIO(), width=80, color_system=None)
        console.print(*table)
        text.append(console.file.getvalue())
    assert text[0] == text[1]
    assert [c.justify for c in fast[0].columns] == [c.justify for c in slow[0].columns]


_PROBE = """
import contextlib, io, json, sys
from bmoe.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_info_on_a_small_csv_imports_no_pandas(tmp_path: Path) -> None:
    path = tmp_path / "small.csv"
    path.write_text(V1 + SUMMARY, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, "info", str(path)],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"},
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, None)
    heavy = [m for m in result["modules"] if m.split(".")[0] in ("pandas", "numpy", "pyarrow")]
    assert heavy == []


ROUTE_HEAD = (
    "# route_trace v1\n# model=m.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2\n"
    "# layer=0 expert_bytes=100\n# layer=1 expert_bytes=100\n"
)
PLAIN_ROWS = "".join(
    f"0,1,{s},{x},{k},{(s + k) % 8},0.5,1\n" for s in range(9) for x in (0, 1) for k in (0, 1)
)
ROUTES = {
    "plain": "turn,phase,step,layer,slot,expert,weight,residency\n" + PLAIN_ROWS,
    "dropping, nan weights": (
        "step,layer,slot,expert,weight,dropped\n0,0,0,3,nan,1\n1,0,0,4,0.9,0\n"
    ),
    "a row that does not parse": "step,layer,slot,expert\n0,0,0,3\n1,0,x,4\n2,0,0,5\n",
    "CRLF": "step,layer,slot,expert\r\n0,0,0,3\r\n1,0,0,4\r\n",
    "no rows": "step,layer,slot,expert\n",
}


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_a_route_trace_describes_through_its_columns_as_the_full_reader(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "t.route.csv"
    path.write_bytes((ROUTE_HEAD + ROUTES[name]).encode("utf-8"))
    try:
        full = info.describe_fully(path)
    except Exception as exc:
        with pytest.raises(type(exc)):
            quickinfo.describe_route_columns(path, info._KEY_PARAMS)
        return
    quick = quickinfo.describe_route_columns(path, info._KEY_PARAMS)
    assert quick == full
    assert [type(v) for g in quick.values() for v in g.values()] == [
        type(v) for g in full.values() for v in g.values()
    ]
    for fmt in ("table", "json", "csv", "markdown"):
        assert shown(quick, fmt) == shown(full, fmt)


def test_info_on_a_route_trace_imports_no_pandas(tmp_path: Path) -> None:
    path = tmp_path / "t.route.csv"
    path.write_text(ROUTE_HEAD + ROUTES["plain"], encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, "info", str(path)],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"},
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, None)
    assert [m for m in result["modules"] if m.split(".")[0] in ("pandas", "pyarrow")] == []
