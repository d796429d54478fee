"""What the formats layer reads for a device profile's runs: the engine's streaming line and
the metrics files among the paths a user names."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.errors import BmoeError
from bmoe.formats.archive import find_metrics_files
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
