"""Fuzzing the readers: whatever the bytes, the only exception is FormatError."""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

from format_samples import COMPUTE, IO, METRICS, ROUTE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bmoe.formats import protocol
from bmoe.formats.errors import FormatError
from bmoe.formats.load import load_file
from bmoe.formats.metrics import read_metrics
from bmoe.formats.op_traces import read_compute_trace, read_io_trace
from bmoe.formats.route import read_route_trace
from bmoe.formats.runlog import read_run_output
from bmoe.formats.sidecar import read_pressure, read_state

FAST = settings(
    max_examples=int(os.environ.get("BMOE_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
STREAM = (
    b'BMOE_READY {"load_s":0.014,"arch":"qwen3moe","n_ctx":2048,"n_expert_used":2}\n'
    b'BMOE_BEGIN {"id":1}\nBMOE_LOAD {"mb":1.20,"ms":2.8}\n'
    b'BMOE_PROGRESS {"step":1,"steps":8,"wall_ms":2.3,"read_mb":1.20,"delta_text":"\xcf"}\n'
    b'BMOE_DONE {"id":1,"cancelled":false,"tokens":8,"tok_s":485.682,"text":"x"}\n'
    b"generation: 24 tokens, 0.003 s/token (362.141 tok/s)\n"
    b"moe-cache: 9.7% hit, resident 1.9 MiB\n"
)
SEEDS = [ROUTE, METRICS, COMPUTE, IO, STREAM]
READERS = [
    read_route_trace,
    read_metrics,
    read_compute_trace,
    read_io_trace,
    read_run_output,
    read_pressure,
    read_state,
]


@st.composite
def mutated(draw) -> bytes:
    """A valid file with a few edits: cut, bytes replaced, lines duplicated or dropped."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["cut", "replace", "insert", "dup", "drop"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if action == "cut":
            del data[pos:]
        elif action == "replace" and data:
            data[pos] = draw(st.sampled_from(b',\n\r#=.-x0 \x00\xff"9e'))
        elif action == "insert":
            data[pos:pos] = draw(st.binary(max_size=8))
        else:
            lines = bytes(data).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i] = [lines[i]] if action == "dup" else []
            if action == "drop":
                del lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def _only_format_errors(reader, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(FormatError):
            reader(path)


@FAST
@given(data=st.one_of(st.binary(max_size=300), mutated()))
def test_readers_raise_only_format_errors(tmp_path: Path, data: bytes, read_mode: str) -> None:
    path = tmp_path / "fuzz.csv"
    path.write_bytes(data)
    for reader in (*READERS, load_file):
        _only_format_errors(reader, path)


@FAST
@given(line=st.one_of(st.binary(max_size=120), st.text(max_size=120)))
def test_protocol_lines_parse_or_raise_format_error(line) -> None:
    raw = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
    for candidate in (line, b"BMOE_PROGRESS " + raw, b"BMOE_X " + raw):
        try:
            event = protocol.parse_line(candidate)
        except FormatError:
            continue
        if event is not None:
            protocol.format_event(event)
    protocol.parse_run_lines(raw)
