"""What the formats layer reads for a device profile's runs: the engine's streaming line and
the metrics files among the paths a user names."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.errors import BmoeError
from bmoe.formats.archive import find_metrics_files
from bmoe.formats.errors import FormatWarning
from bmoe.formats.runlog import streaming_line
from tests.runs_factory import rows, write_run


def test_streaming_line_gives_lanes_and_cache() -> None:
    log = (
        "llama_model_load: loaded\n"
        "bmoe: expert streaming ON  n_expert=128 o_direct=1 io_threads=4 cache=4000 MiB shards=2\n"
        "answer\n"
    )
    assert streaming_line(log) == {"io_threads": 4, "cache": 4000.0}
    assert streaming_line("expert streaming ON  cache=12.5 MiB") == {"cache": 12.5}
    assert streaming_line("expert streaming OFF io_threads=4") == {}


def test_find_metrics_files_walks_folders_by_content(tmp_path: Path) -> None:
    cells = tmp_path / "cells"
    first = write_run(cells / "a" / "run.csv", rows(4), pressure={"mem_available_mb": 900})
    second = write_run(cells / "b.csv", rows(4))
    (cells / "notes.csv").write_text("name,value\nx,1\n")  # a CSV, not metrics
    (cells / "run.log").write_text("not a metrics file\n")
    named = write_run(tmp_path / "odd.name", rows(4))  # named directly: any name
    found = find_metrics_files([cells, named])
    # the pressure sidecar (a / run.metrics) has a metrics suffix but not their content
    assert (cells / "a" / "run.metrics").is_file()
    assert found == [first, second, named]
    with pytest.raises(BmoeError, match="no such file or folder"):
        find_metrics_files([tmp_path / "missing"])


def test_a_run_read_with_what_was_recorded_beside_it(tmp_path: Path, monkeypatch) -> None:
    """The end-of-run lines of the ``.log`` come before the ``.out``'s, both before the
    sidecar's pressure; the streaming line is the first found; each output is read once."""
    from bmoe.formats.runfiles import read_recorded_run, read_recorded_runs

    csv = write_run(tmp_path / "a.csv", rows(4), pressure={"mem_available_mb": 900})
    log, out = csv.with_suffix(".log"), csv.with_suffix(".out")
    log.write_text(
        "bmoe: expert streaming ON io_threads=4 cache=64 MiB\nmode: from-log\n"
        "mem_available_mb=800\n"
    )
    out.write_text(
        "bmoe: expert streaming ON io_threads=2 cache=32 MiB\nmode: from-out\n"
        "mem_available_mb=1\nswap_used_mb=5\n"
    )
    import builtins
    import io

    opened: list[str] = []
    real_open = io.open

    def counting_open(file, *args, **kwargs):
        opened.append(Path(str(file)).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    run = read_recorded_run(csv)
    assert opened.count("a.log") == 1 and opened.count("a.out") == 1
    assert run.metrics.path == str(csv) and run.traces == {} and run.record is None
    assert run.figures["mode"] == "from-log"
    assert run.pressure["mem_available_mb"] == 800 and run.pressure["swap_used_mb"] == 5
    assert run.streaming_line == {"io_threads": 4, "cache": 64.0}
    assert [r.metrics.path for r in read_recorded_runs([tmp_path])] == [str(csv)]
    with (
        pytest.warns(FormatWarning, match="not metrics files, skipped"),
        pytest.raises(BmoeError, match="no metrics CSV"),
    ):
        read_recorded_runs([tmp_path / "a.log"])
