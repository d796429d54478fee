"""The column table against the native engine's files and against every list derived from it:
the v1 and v2 headers are the recorded ones, each column is printed with the decimals the
native engine prints, and the analysis's and the engine's column lists are the table's roles."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.analyze import metrics as analysis
from bmoe.engine.embedded import probes
from bmoe.formats import metrics, quickinfo
from bmoe.formats.metrics_columns import (
    BY_NAME,
    COLUMNS,
    INT_COLUMN_BITS,
    ROLES,
    ROW_PRECISION,
    native_columns,
    with_role,
)

V1_FILE = "metrics/2026-07-21-pinned-dense-ab"


def _header_and_first_row(path: Path) -> tuple[list[str], list[str]]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    body = [line for line in lines if not line.startswith("#")]
    return body[0].split(","), body[1].split(",")


def test_the_native_headers_are_the_recorded_ones(corpus: Path) -> None:
    v2, _ = _header_and_first_row(corpus / "native-tiny" / "run.csv")
    assert native_columns(2) == metrics.COLUMNS_V2 == v2
    v1_files = sorted((corpus / V1_FILE).glob("*.csv"))
    assert v1_files
    for path in v1_files:
        assert native_columns(1) == metrics.COLUMNS_V1 == _header_and_first_row(path)[0]
    v0 = sorted((corpus / "metrics" / "2026-07-12").glob("*.csv"))
    assert v0 and all(_header_and_first_row(p)[0] == native_columns(0)[:8] for p in v0)


def test_each_column_is_printed_as_the_native_engine_prints_it(corpus: Path) -> None:
    """Decimals per float column, none for an integer, read off a native file's rows."""
    for path in sorted((corpus / "native-tiny").glob("*.csv")):
        header, row = _header_and_first_row(path)
        if header != metrics.COLUMNS_V2:
            continue  # a trace, not a metrics file
        for name, text in zip(header, row, strict=True):
            digits = len(text.partition(".")[2]) if "." in text else None
            assert digits == BY_NAME[name].digits, (path.name, name, text)


def test_the_table_is_well_formed() -> None:
    names = [c.name for c in COLUMNS]
    assert len(names) == len(set(names))
    assert all(c.role in ROLES for c in COLUMNS)
    assert all((c.digits is None) or (c.int_bits is None) for c in COLUMNS)
    native = [c for c in COLUMNS if c.native]
    assert [c.since for c in native] == sorted(c.since for c in native)  # versions append
    assert [c for c in COLUMNS if not c.native] == list(COLUMNS[len(native) :])  # ours last
    with pytest.raises(ValueError, match="'costs'"):
        with_role("costs")


def test_the_roles_are_the_contracts() -> None:
    """The telemetry contract: a verify decode's "entire cost - wall_ms, io_ms, majflt,
    cpu_ms, read_bytes, loop_overhead_ms - is charged to the group's FIRST row"; the memory
    block is VmRSS, RssAnon, RssFile, VmSwap and the device's MemAvailable, MemFree and
    SwapFree. The analysis spreads the costs and draws the memory picture by these roles,
    the engine's probes fill the memory block by them."""
    charged = {"wall_ms", "io_ms", "majflt", "cpu_ms", "read_bytes", "loop_overhead_ms"}
    assert charged <= set(with_role("cost")) == set(analysis.COST_COLUMNS)
    assert not {"step", "turn", "mtp_batch", "cache_hit_pct"} & set(analysis.COST_COLUMNS)
    block = ("rss_mib", "rss_anon_mib", "rss_file_mib", "swap_mib", "mem_available_mib",
             "mem_free_mib", "swap_free_mib")  # fmt: skip
    assert with_role("memory") == probes.MEMORY_COLUMNS == block
    assert with_role("budget", "memory") == analysis.MEMORY_COLUMNS


def test_the_readers_type_every_column_of_the_table() -> None:
    assert set(metrics.COLUMN_TYPES) == set(BY_NAME)
    assert set(metrics.INT_COLUMNS) == set(INT_COLUMN_BITS) == quickinfo._INT_COLUMNS
    floats = {c.name for c in COLUMNS if c.int_bits is None}
    assert floats == quickinfo._FLOAT_COLUMNS and set(ROW_PRECISION) <= floats
