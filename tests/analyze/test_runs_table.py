"""The runs table is built from runs as read, no file opened: an ok attempt without its run is
invalid, of a run's ok attempts the latest counts, entry state comes from the sidecar before the
``.state`` snapshot."""

from __future__ import annotations

import math

from runs_factory import rows, write_run

from bmoe.analyze.runs_table import attempts_frame, entry_state, loose_runs_frame, varying_columns
from bmoe.formats.metrics import read_metrics
from bmoe.formats.sidecar import DeviceState


def test_attempts_as_read_make_one_row_each(tmp_path) -> None:
    run = read_metrics(write_run(tmp_path / "run.csv", rows(8)))
    records = [
        {"run": "a/r1", "attempt": 1, "status": "ok", "params": {"cache_mb": 1}},
        {"run": "a/r1", "attempt": 2, "status": "ok", "params": {"cache_mb": 1}},
        {"run": "b/r1", "attempt": 1, "status": "ok", "params": {"cache_mb": 2}},
        {"run": "c/r1", "attempt": 1, "status": "crashed", "params": {"cache_mb": 4}},
    ]
    read = [(records[0], run, None, "cells/a/r1/run.csv"),
            (records[1], run, None, "cells/a/r1.a2/run.csv"),
            (records[2], None, None, None), (records[3], None, None, None)]  # fmt: skip
    frame = attempts_frame(read)
    assert list(frame["status"]) == ["superseded", "ok", "invalid", "crashed"]
    assert frame.loc[1, "file"] == "cells/a/r1.a2/run.csv" and frame.loc[1, "tokens"] == 8
    assert "missing or unreadable" in frame.loc[2, "error"]
    assert frame.attrs["params"] == ["cache_mb"]
    assert varying_columns(frame, ["cache_mb"]) == ["cache_mb"]
    assert varying_columns(frame.iloc[:2], ["cache_mb"]) == []


def test_loose_runs_are_ordered_by_mtime_and_take_their_entry_state(tmp_path) -> None:
    first = read_metrics(write_run(tmp_path / "x.csv", rows(4)))
    second = read_metrics(write_run(tmp_path / "y.csv", rows(4)))
    before = DeviceState(temps_c={"CPU0": 50.0}, meminfo_kb={"MemAvailable": 2048},
                         scaling_max_freq={"policy0": 1000, "policy4": 2000})  # fmt: skip
    pressure = {"cpu_temp_before_mC": 41_000}
    frame = loose_runs_frame([(first, pressure, before, 20.0, "x.csv"),
                              (second, None, None, 10.0, "y.csv")])  # fmt: skip
    assert list(frame["order"]) == [1, 0]
    assert frame.loc[0, "entry_cpu_temp_c"] == 41.0  # the sidecar's, before the snapshot's
    assert frame.loc[0, "entry_mem_available_mb"] == 2.0
    assert frame.loc[0, "entry_scaling_max_freq_khz"] == 3000.0
    assert math.isnan(frame.loc[1, "entry_cpu_temp_c"])
    assert entry_state(None, None) == {}
