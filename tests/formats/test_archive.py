"""The archive's layout: a run's stem and the files beside it, the one finder of metrics files,
the manifest's lines and ``predictions.csv``; every reader of a folder agrees with them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest
from runs_factory import write_run

from bmoe.errors import BmoeError
from bmoe.formats import archive as layout
from bmoe.formats.errors import FormatWarning

ROUTE = "# route_trace v1\nstep,layer,expert,slot\n0,0,1,0\n"


def test_a_stem_is_cut_at_the_last_dot():
    """A flag value in a file name keeps its dot: ``c1.5.csv`` is run ``c1.5``'s."""
    assert layout.run_stem("qwen_c1.5.csv") == "qwen_c1.5"
    assert layout.run_stem("dir/run.csv") == "run"
    assert layout.run_stem("gemma.metrics") == "gemma"
    assert layout.run_stem("noext") == "noext"
    assert layout.run_stem(".hidden") == ".hidden"


def _runs_with_dotted_names(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("c1.csv", "c1.5.csv"):
        write_run(folder / name)
    (folder / "c1.route.csv").write_text(ROUTE)
    (folder / "c1.5.route.csv").write_text(ROUTE)
    (folder / "c1.5.log").write_text("generation: 6 tokens\n")


def test_files_beside_a_run_are_its_own_not_a_longer_stems(tmp_path):
    _runs_with_dotted_names(tmp_path)
    assert layout.files_beside(tmp_path / "c1.csv") == [tmp_path / "c1.route.csv"]
    assert layout.files_beside(tmp_path / "c1.5.csv") == [
        tmp_path / "c1.5.log", tmp_path / "c1.5.route.csv",
    ]  # fmt: skip
    known = [tmp_path / "c1.csv", tmp_path / "c1.5.csv"]  # the caller's finding, the same
    assert layout.files_beside(tmp_path / "c1.csv", known) == [tmp_path / "c1.route.csv"]


def test_the_readers_of_loose_runs_agree_on_a_runs_files(tmp_path):
    import bmoe
    from bmoe.formats.runfiles import traces_beside

    _runs_with_dotted_names(tmp_path)
    assert traces_beside(tmp_path / "c1.csv") == [str(tmp_path / "c1.route.csv")]
    archive = bmoe.load_archive(tmp_path)
    assert sorted(r.cell for r in archive) == ["c1", "c1.5"]
    assert archive.run("c1").files["route"].name == "c1.route.csv"
    assert archive.run("c1.5").files["route"].name == "c1.5.route.csv"
    assert archive.run("c1.5").files["output"].name == "c1.5.log"


def test_one_finder_of_metrics_files(tmp_path):
    """Folders recursively, by content: CSVs, a CSV named ``.metrics`` and the Parquet form
    (``bmoe convert``); not traces, sidecars or files of other formats."""
    from bmoe.formats.convert import convert_file

    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    csv = write_run(tmp_path / "one.csv")
    named = write_run(tmp_path / "a" / "two.metrics", pressure=None)
    parquet = convert_file(write_run(deep / "three.csv"), "parquet", tmp_path / "conv")
    (tmp_path / "one.route.csv").write_text(ROUTE)
    (tmp_path / "notes.txt").write_text("not a run\n")
    found = layout.find_metrics_files([tmp_path])
    assert set(found) == {csv, named, deep / "three.csv", Path(parquet)}
    # the profile reads the same runs as the contamination tells do
    from bmoe.analyze.device import profile_runs
    from bmoe.formats.runfiles import read_recorded_runs
    from bmoe.sweep.results import runs_table

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            len(profile_runs(read_recorded_runs([tmp_path])))
            == len(runs_table([tmp_path]))
            == len(found)
        )


def test_named_files_are_kept_when_they_are_runs(tmp_path):
    run = write_run(tmp_path / "run.csv")
    (tmp_path / "run.route.csv").write_text(ROUTE)  # a run's trace: read with it, no warning
    (tmp_path / "notes.txt").write_text("not a run\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert layout.find_metrics_files([run, tmp_path / "run.route.csv"]) == [run]
    with pytest.warns(FormatWarning, match=r"not metrics files, skipped: .*notes\.txt"):
        assert layout.find_metrics_files([run, tmp_path / "notes.txt"]) == [run]
    with pytest.raises(BmoeError, match=r"gone\.csv: no such file or folder"):
        layout.find_metrics_files([tmp_path / "gone.csv"])


def test_manifest_lines_read_back_and_damage_is_named(tmp_path):
    records = [{"run": "c/r1", "attempt": 1, "status": "ok"}, {"run": "c/r2", "note": "é"}]
    (tmp_path / layout.MANIFEST).write_text(
        "".join(map(layout.manifest_line, records)) + "[1]\n{cut", encoding="utf-8"
    )
    with pytest.warns(FormatWarning) as caught:
        assert layout.read_manifest(tmp_path) == records  # the folder or the file
    said = [str(w.message) for w in caught]
    assert any(":3: not a record" in s for s in said)
    assert any(":4: cut short" in s for s in said)


def test_predictions_write_and_read_back_validated(tmp_path):
    assert layout.read_predictions(tmp_path) is None
    table = pd.DataFrame({"run": ["a/r1"], "cell": ["a"], "tok_s": [4.5]})
    layout.write_predictions(tmp_path, table)
    assert layout.read_predictions(tmp_path).equals(table)
    (tmp_path / layout.PREDICTIONS).write_text("cell,rate\na,1\n")
    with pytest.raises(BmoeError, match=r"predictions\.csv: line 1: no tok_s column"):
        layout.read_predictions(tmp_path)


def test_a_sweeps_results_are_read_with_their_axes_by_the_contamination_tells(tmp_path):
    """The tells read a sweep folder through the archive's reader: the axes and parameters
    its results were written with come back (a bare Parquet read loses them)."""
    from bmoe.sweep.results import runs_table

    frame = pd.DataFrame({"run": ["a/r1", "b/r1"], "cell": ["a", "b"], "status": "ok",
                          "cache_mb": [1, 2], "tok_s_mean": [3.0, 4.0]})  # fmt: skip
    frame.attrs["params"] = ["cache_mb"]
    layout.write_results(tmp_path, frame, ["cache_mb"], "s")
    cells = runs_table([tmp_path])
    assert cells.attrs["axes"] == ["cache_mb"] and cells.attrs["params"] == ["cache_mb"]
    assert list(cells["cell"]) == ["a", "b"]
