"""Bad input: one clear ``file:line: problem`` error, or the good rows and a warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest
from format_samples import COMPUTE, IO, METRICS, ROUTE

from bmoe.formats.errors import FormatError, FormatWarning
from bmoe.formats.load import load_file
from bmoe.formats.metrics import read_metrics
from bmoe.formats.op_traces import read_compute_trace, read_io_trace
from bmoe.formats.route import read_route_trace
from bmoe.formats.runlog import read_run_output

READERS = [
    ("route.csv", ROUTE, read_route_trace),
    ("metrics.csv", METRICS, read_metrics),
    ("compute.csv", COMPUTE, read_compute_trace),
    ("io.csv", IO, read_io_trace),
]
IDS = [r[0] for r in READERS]


def _file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _quiet(reader, path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FormatWarning)
        return reader(path)


def _first_data_line(data: bytes) -> int:
    lines = data.split(b"\n")
    header = next(i for i, ln in enumerate(lines) if ln and not ln.startswith(b"#"))
    return header + 2


@pytest.mark.parametrize(("name", "data", "reader"), READERS, ids=IDS)
def test_empty_and_binary(tmp_path: Path, name: str, data: bytes, reader, read_mode: str) -> None:
    with pytest.raises(FormatError, match=r"empty\.csv: file is empty$"):
        reader(_file(tmp_path, "empty.csv", b""))
    with pytest.raises(FormatError, match="file is empty"):
        reader(_file(tmp_path, "blank.csv", b"\xef\xbb\xbf \n\n"))
    with pytest.raises(FormatError, match="binary data"):
        reader(_file(tmp_path, "bin.csv", bytes(range(256)) * 4))
    with pytest.raises(FormatError, match=r"bad\.csv:1: binary data"):
        reader(_file(tmp_path, "bad.csv", b"\xff\xfe\xfa\xfb" * 50))


@pytest.mark.parametrize(("name", "data", "reader"), READERS, ids=IDS)
def test_header_less_file(tmp_path: Path, name: str, data: bytes, reader, read_mode: str) -> None:
    with pytest.raises(FormatError, match=r"h\.csv:1: header lacks"):
        reader(_file(tmp_path, "h.csv", b"1,2,3,4\n5,6,7,8\n"))
    with pytest.raises(FormatError, match=r"only\.csv: no header row"):
        reader(_file(tmp_path, "only.csv", b"# route_trace v1\n# model=x\n"))


@pytest.mark.parametrize(("name", "data", "reader"), READERS, ids=IDS)
def test_wrong_field_count(tmp_path: Path, name: str, data: bytes, reader, read_mode: str) -> None:
    lines = data.split(b"\n")
    n = _first_data_line(data)  # 1-based line of the first data row
    lines[n] = lines[n] + b",7"  # the second data row gets one field too many
    with pytest.raises(FormatError, match=rf"{name}:{n + 1}: expected \d+ fields"):
        reader(_file(tmp_path, name, b"\n".join(lines)))


@pytest.mark.parametrize(("name", "data", "reader"), READERS, ids=IDS)
def test_text_in_a_numeric_column(
    tmp_path: Path, name: str, data: bytes, reader, read_mode: str
) -> None:
    lines = data.split(b"\n")
    n = _first_data_line(data)
    fields = lines[n].split(b",")
    fields[2] = b"lots"  # the third column is numeric in every format
    lines[n] = b",".join(fields)
    with pytest.raises(FormatError, match=rf"{name}:{n + 1}: column '\w+': 'lots' is not an? "):
        reader(_file(tmp_path, name, b"\n".join(lines)))


@pytest.mark.parametrize(("name", "data", "reader"), READERS, ids=IDS)
def test_crlf_and_bom_read_like_the_plain_file(
    tmp_path: Path, name: str, data: bytes, reader, read_mode: str
) -> None:
    plain = _quiet(reader, _file(tmp_path, "plain.csv", data))
    for variant in (data.replace(b"\n", b"\r\n"), b"\xef\xbb\xbf" + data):
        other = _quiet(reader, _file(tmp_path, "v.csv", variant))
        pd.testing.assert_frame_equal(plain.rows, other.rows)
        assert getattr(plain, "meta", None) == getattr(other, "meta", None)
        assert getattr(plain, "params", None) == getattr(other, "params", None)
        assert getattr(plain, "summaries", None) == getattr(other, "summaries", None)


@pytest.mark.parametrize(("name", "data", "reader"), READERS, ids=IDS)
def test_a_file_cut_mid_line_keeps_its_good_rows(
    tmp_path: Path, name: str, data: bytes, reader, read_mode: str
) -> None:
    body = data.split(b"# summary")[0]
    whole = _quiet(reader, _file(tmp_path, "whole.csv", body))
    last_line = body.count(b"\n")
    for cut in (3, 1):  # mid-field and right after the first character
        with pytest.warns(FormatWarning, match=rf"cut\.csv:{last_line}: last line is cut short"):
            part = reader(_file(tmp_path, "cut.csv", body[: -cut - 1]))
        expected = whole.rows.iloc[:-1]
        pd.testing.assert_frame_equal(part.rows, expected, check_categorical=False)
        assert part.warnings and "cut short" in part.warnings[0]


def test_a_cut_summary_line_keeps_its_whole_keys(tmp_path: Path) -> None:
    cut = METRICS[: METRICS.index(b"tok/s=") + len(b"tok/s=89.5")]
    with pytest.warns(FormatWarning, match=r"m\.csv:7: summary line is cut short"):
        run = read_metrics(_file(tmp_path, "m.csv", cut))
    assert run.summary == {"tokens": 3, "s/tok": 0.011}
    assert run.tokens == 3 and not run.partial


def test_a_cut_progress_stream_keeps_its_events(tmp_path: Path) -> None:
    data = b'BMOE_BEGIN {"id":1}\nBMOE_LOAD {"mb":1.20,"ms":2.8}\nBMOE_PROGRESS {"step":1,"st'
    with pytest.warns(FormatWarning, match=r"s\.out:3: last line is cut short"):
        out = read_run_output(_file(tmp_path, "s.out", data))
    assert [e.tag for e in out.events] == ["BEGIN", "LOAD"] and out.warnings


def test_bad_protocol_line_mid_stream(tmp_path: Path) -> None:
    data = b'BMOE_BEGIN {"id":1}\nBMOE_LOAD {"mb":1.20,\nBMOE_BEGIN {"id":2}\n'
    with pytest.raises(FormatError, match=r"s\.out:2: BMOE_LOAD payload is not valid JSON"):
        read_run_output(_file(tmp_path, "s.out", data))


def test_load_file_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="file is empty"):
        load_file(_file(tmp_path, "e.txt", b"  \n"))
    with pytest.raises(FormatError, match="binary data"):
        load_file(_file(tmp_path, "b.txt", b"\x00\x01\x02" * 100))
    with pytest.raises(FormatError, match="unrecognised content"):
        load_file(_file(tmp_path, "t.txt", b"hello\nworld\n"))
    with pytest.raises(FormatError, match="is a directory"):
        load_file(tmp_path)


def test_numbers_too_wide_for_the_compact_type_widen(tmp_path: Path, read_mode: str) -> None:
    wide = ROUTE.replace(b"0,1,6,0,0,3,nan,1,0", b"0,1,6,0,0,70000,nan,1,0")
    trace = _quiet(read_route_trace, _file(tmp_path, "w.csv", wide))
    assert trace.rows["expert"].tolist() == [1, 2, 70000]
    assert trace.rows["expert"].dtype == "int64" and trace.rows["slot"].dtype == "int8"


def test_a_comment_among_the_rows_is_skipped(tmp_path: Path, read_mode: str) -> None:
    head = ROUTE.split(b"0,1,5,0,0")[0]
    rows = [b"0,1,%d,0,%d,%d,0.5,1,0" % (i // 2, i % 2, i % 4) for i in range(600)]
    rows.insert(550, b"# a note between two rows, well past the head")
    trace = _quiet(read_route_trace, _file(tmp_path, "c.csv", head + b"\n".join(rows) + b"\n"))
    assert trace.rows["expert"].tolist() == [i % 4 for i in range(600)]
    assert trace.meta["n_expert_used"] == 2
