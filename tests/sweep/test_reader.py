"""Reading archives back: ``bmoe.load_archive`` on the sweeps in bench-data/, on a sweep with
failed attempts, and on folders of loose files from the native engine."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest
from sweep_helpers import install_fake_cli, write_config

import bmoe
from bmoe.analyze.metrics import run_summary
from bmoe.errors import BmoeError
from bmoe.formats.metrics import read_metrics
from bmoe.formats.sidecar import read_pressure

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench-data"


def bench_sweep(name: str) -> Path:
    found = sorted(BENCH.glob(f"*-{name}"))
    if not found:
        pytest.skip(f"no {name} sweep in bench-data/")
    return found[-1]


def quiet_metrics(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_metrics(path)


# ----------------------------------------------------------------------------- sweeps


def test_a_sweep_opens_as_cells_with_parameters_and_outcomes():
    root = bench_sweep("tiny-cache-lanes")
    archive = bmoe.load_archive(root)
    assert archive.kind == "sweep" and archive.axes == ["cache_mb", "io_threads"]
    cells = archive.cells
    manifest = [json.loads(x) for x in (root / "manifest.jsonl").read_text().splitlines()]
    assert len(cells) == len(manifest) == len(archive)
    assert set(cells["run"]) == {m["run"] for m in manifest}
    assert cells.groupby("cell")["repeat"].nunique().eq(3).all()
    # Outcomes are the run's summary figures, read from its own files.
    row = cells.iloc[0]
    csv = root / row["dir"] / "run.csv"
    expected = run_summary(quiet_metrics(csv), read_pressure(csv.with_suffix(".metrics")))
    for key in ("tok_s_mean", "ttft_s", "cache_hit_pct", "read_mib_per_token", "peak_rss_gb"):
        assert row[key] == pytest.approx(expected[key], nan_ok=True), key
    assert archive.config["grid"] == {"cache_mb": [0, 1, 2, 4, 8], "io_threads": [1, 2, 4]}


def test_runs_are_read_lazily_by_cell_and_repeat(monkeypatch):
    root = bench_sweep("tiny-cache-lanes")
    from bmoe.formats import metrics as metrics_format

    calls: list[str] = []
    real = metrics_format.read_metrics
    monkeypatch.setattr(
        metrics_format, "read_metrics", lambda p, *a, **k: calls.append(str(p)) or real(p)
    )
    archive = bmoe.load_archive(root)
    assert calls == []  # results.parquet has the outcomes: no run file is opened
    cell = archive.cells["cell"].iloc[0]
    second = archive.metrics(cell, repeat=2)
    assert calls == [str(root / "cells" / cell / "r2" / "run.csv")]
    assert second.rows.equals(quiet_metrics(root / "cells" / cell / "r2" / "run.csv").rows)
    assert archive.metrics(f"{cell}/r2") is second  # read once, by run id too
    assert archive.run(cell).repeat == 1  # the first completed repeat
    assert [r.repeat for r in archive.runs(cell)] == [1, 2, 3]
    assert archive.run(cell, 3).pressure == read_pressure(root / "cells" / cell / "r3/run.metrics")


def test_traces_by_cell_id():
    root = bench_sweep("small-traces")
    archive = bmoe.load_archive(root)
    cell = archive.cells["cell"].iloc[-1]
    run = archive.run(cell)
    assert {"metrics", "route", "compute", "io", "pressure", "output"} <= set(run.files)
    route = archive.trace(cell, "route")
    direct = bmoe.load(root / "cells" / cell / "r1" / "run.route.csv")
    assert route.rows.equals(direct.rows) and route.meta == direct.meta
    assert archive.trace(cell, "io").rows.equals(bmoe.load(run.files["io"]).rows)
    assert run.params["cache_mb"] == archive.cells["cache_mb"].iloc[-1]
    assert len(archive.with_file("compute")) == len(archive.runs())


def test_unknown_ids_and_kinds_say_what_exists():
    archive = bmoe.load_archive(bench_sweep("tiny-cache-lanes"))
    with pytest.raises(BmoeError, match=r"no cell or run 'nope'.*cells: cache_mb-"):
        archive.metrics("nope")
    cell = archive.cells["cell"].iloc[0]
    with pytest.raises(BmoeError, match=r"has no repeat 7 \(it has \[1, 2, 3\]\)"):
        archive.run(cell, 7)
    with pytest.raises(BmoeError, match="has no route file"):
        archive.trace(cell, "route")
    with pytest.raises(BmoeError, match="unknown trace kind"):
        archive.trace(cell, "bogus")


def test_failed_attempts_stay_reachable(tmp_path):
    from bmoe.sweep.archive import ArchiveWriter
    from bmoe.sweep.config import load_config, resolved_toml
    from bmoe.sweep.plan import make_plan
    from bmoe.sweep.runner import run_sweep

    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "m.gguf").write_bytes(b"GGUF stand-in")
    (tmp_path / "state").mkdir()
    cfg = write_config(tmp_path, f"""\
        [sweep]
        name = "f"
        engine = "native"
        output = "{tmp_path / "out"}"
        retries = 1
        [base]
        model = "m.gguf"
        prompt = "hi"
        n_predict = 4
        fake_state = "{tmp_path / "state"}"
        [grid]
        fake_mode = ["crash-once", "ok"]
        [[targets]]
        name = "here"
        binary = "{fake}"
        """)  # fmt: skip
    config = load_config(cfg)
    archive_dir = ArchiveWriter.create(Path(config.settings.output), "f", resolved_toml(config))
    run_sweep(config, make_plan(config), archive_dir)
    archive = bmoe.load_archive(archive_dir.root)
    assert sorted(archive.cells["status"]) == ["crashed", "ok", "ok"]
    flaky = archive.cells.loc[archive.cells["fake_mode"] == "crash-once", "cell"].iloc[0]
    crashed = archive.runs(flaky, status="crashed")
    assert len(crashed) == 1 and crashed[0].folder.name == "r1.a1.crashed"
    assert crashed[0].output.is_stream  # its stdout is kept and reads
    assert archive.run(flaky).status == "ok"  # by cell id: the completed attempt
    assert set(archive.metrics_runs()) == {f"{c}/r1" for c in archive.cells["cell"].unique()}


def test_an_archive_with_a_killed_attempt_reads_and_reports(tmp_path):
    """A resume writes a ``killed`` line for the attempt the kill cut short; every reader of
    the folder takes it (the line has no ``repeat`` in folders written before it did)."""
    import shutil

    from hostile_inputs import run_in_process

    root = tmp_path / "s"
    shutil.copytree(bench_sweep("tiny-cache-lanes"), root)
    first = json.loads((root / "manifest.jsonl").read_text().splitlines()[0])
    cell = first["cell"]
    killed = {"run": f"{cell}/r2", "cell": cell, "attempt": 1, "status": "killed",
              "error": "the sweep stopped while this attempt ran",
              "dir": f"cells/{cell}/r2.a1.killed", "ended": "2026-12-02T10:00:00Z"}  # fmt: skip
    with open(root / "manifest.jsonl", "a") as fh:
        fh.write(json.dumps(killed) + "\n")
    (root / "results.parquet").unlink()  # rebuilt from the manifest
    archive = bmoe.load_archive(root)
    assert archive.run(f"{first['cell']}/r2.a1").status == "killed"
    assert archive.run(f"{first['cell']}/r2.a1").repeat == 2  # from the run id
    again = shutil.copytree(root, tmp_path / "s2")
    for args in (["report", str(root), "-o", str(tmp_path / "r.html")],
                 ["analyze", "sweep", str(root)], ["history", str(root), str(again)]):  # fmt: skip
        result = run_in_process(args)
        assert result.code == 0 and result.traceback is None, (args, result.err)


def test_a_folder_of_sweeps_names_them(tmp_path):
    for name in ("2026-01-01-a", "2026-01-02-b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sweep.toml").write_text("[sweep]\n")
    with pytest.raises(BmoeError, match="holds 2 sweep folders, open one: 2026-01-01-a"):
        bmoe.load_archive(tmp_path)
    with pytest.raises(BmoeError, match="no such folder"):
        bmoe.load_archive(tmp_path / "missing")


def test_load_opens_a_folder_as_an_archive():
    root = bench_sweep("tiny-cache-lanes")
    assert bmoe.load(root).cells.equals(bmoe.load_archive(root).cells)


# ----------------------------------------------------------------------------- loose files


def test_loose_native_files_group_by_run(corpus):
    folder = corpus / "native-tiny"
    archive = bmoe.load_archive(folder)
    assert archive.kind == "loose"
    assert sorted(archive.cells["cell"]) == ["ct", "ctl", "drop", "mmap", "pf", "run", "sess"]
    files = {r.cell: {k: p.name for k, p in r.files.items()} for r in archive}
    assert files["run"] == {"metrics": "run.csv", "route": "run.route.csv", "io": "run.io.csv",
                            "output": "run.out"}  # fmt: skip
    assert files["ctl"] == {"metrics": "ctl.csv", "compute_layers": "ctl.compute-layers.csv"}
    assert files["pf"]["output"] == "pf.out"
    pf = archive.cells.set_index("cell").loc["pf"]
    assert pf["tok_s_mean"] == pytest.approx(run_summary(quiet_metrics(folder / "pf.csv"))[
        "tok_s_mean"])  # fmt: skip
    assert pf["cache_mb"] == 3 and pf["io_threads"] == 4  # preamble parameters as columns
    assert {"cache_mb", "io_threads", "prefetch"} <= set(archive.axes)
    trace = archive.trace("pf", "route")
    assert trace.rows.equals(bmoe.load(folder / "pf.route.csv").rows)
    assert archive.run("sess").output.errors  # the rejected request of the session


def test_loose_folders_of_dated_runs(corpus):
    archive = bmoe.load_archive(corpus / "metrics")
    cells = archive.cells.set_index("cell")
    assert "2026-07-12/qwen_mmap" in cells.index
    mmap = archive.run("2026-07-12/qwen_mmap")
    sidecar = corpus / "metrics/2026-07-12/qwen_mmap.metrics"
    assert mmap.pressure == read_pressure(sidecar)
    assert mmap.files["output"].name == "qwen_mmap.log"
    assert cells.loc["2026-07-12/qwen_mmap", "peak_rss_gb"] == pytest.approx(
        run_summary(mmap.metrics, read_pressure(sidecar))["peak_rss_gb"]
    )
    # A run the model stopped at 1354 of 2048 steps (its summary says so) is a completed run.
    assert cells.loc["2026-07-21-pinned-dense-ab/bmoe-20260721-103724", "status"] == "ok"
    for dated in sorted(p for p in (corpus / "metrics").iterdir() if p.is_dir()):
        one = bmoe.load_archive(dated)
        assert len(one.cells) == len(list(dated.glob("*.csv")))


def test_a_relative_folder_with_one_run(tmp_path, corpus, monkeypatch):
    (tmp_path / "one").mkdir()
    for name in ("pf.csv", "pf.route.csv"):
        (tmp_path / "one" / name).write_bytes((corpus / "native-tiny" / name).read_bytes())
    monkeypatch.chdir(tmp_path)
    archive = bmoe.load_archive("one")
    assert archive.cells["cell"].tolist() == ["pf"] and archive.root == tmp_path / "one"
    assert set(archive.run("pf").files) == {"metrics", "route"}


def test_loose_metrics_named_dot_metrics(corpus):
    archive = bmoe.load_archive(corpus / "route-trace")
    (run,) = list(archive)
    assert run.cell == "gemma"
    assert {k: p.name for k, p in run.files.items()} == {
        "metrics": "gemma.metrics", "route": "gemma.route.csv", "state": "gemma.state",
        "output": "gemma.log",
    }  # fmt: skip
    assert run.pressure is None


def test_a_folder_without_runs_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here\n")
    with pytest.raises(BmoeError, match=r"no sweep here .* and no metrics files"):
        bmoe.load_archive(tmp_path)


def test_cells_frame_feeds_the_sweep_analyses():
    from bmoe.analyze.sweep import rank_cells

    archive = bmoe.load_archive(bench_sweep("tiny-cache-lanes"))
    ranked = rank_cells(archive.cells)
    assert len(ranked) == 15 and ranked["n"].eq(3).all()
    assert isinstance(ranked, pd.DataFrame)


def test_load_opens_every_kind_of_file(corpus, tmp_path):
    from bmoe.formats.convert import convert_file
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.op_traces import ComputeTrace, IoTrace
    from bmoe.formats.route import RouteTrace
    from bmoe.formats.runlog import RunOutput

    tiny = corpus / "native-tiny"
    expected = {
        tiny / "run.csv": MetricsRun, tiny / "run.route.csv": RouteTrace,
        tiny / "ct.compute.csv": ComputeTrace, tiny / "run.io.csv": IoTrace,
        tiny / "run.out": RunOutput, tiny / "pf.out": RunOutput,
        corpus / "route-trace" / "gemma.log": RunOutput,
        corpus / "route-trace" / "gemma.metrics": MetricsRun,
    }  # fmt: skip
    for path, cls in expected.items():
        assert isinstance(bmoe.load(path), cls), path
    assert bmoe.load(corpus / "metrics/2026-07-12/qwen_mmap.metrics") == read_pressure(
        corpus / "metrics/2026-07-12/qwen_mmap.metrics"
    )
    assert "before" in bmoe.load(corpus / "route-trace" / "gemma.state")
    parquet = bmoe.load(convert_file(tiny / "run.route.csv", "parquet", tmp_path))
    assert isinstance(parquet, RouteTrace)
    assert parquet.rows.equals(bmoe.load(tiny / "run.route.csv").rows)
