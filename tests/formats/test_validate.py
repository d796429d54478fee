"""`validate_file`: the contract's findings, with the lines a reader would look at."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.formats.errors import FormatError
from bmoe.formats.validate import validate_file

CLEAN = [
    "native-tiny/run.csv",
    "native-tiny/sess.csv",
    "native-tiny/run.route.csv",
    "native-tiny/drop.route.csv",
    "native-tiny/ct.compute.csv",
    "native-tiny/ctl.compute-layers.csv",
    "native-tiny/pf.io.csv",
    "native-tiny/run.out",
    "native-tiny/sess.out",
    "route-trace/gemma.route.csv",
    "route-trace/gemma.metrics",
    "route-trace/gemma.log",
    "route-trace/gemma.state",
    "metrics/2026-07-12/qwen_mmap.csv",
    "metrics/2026-07-12/qwen_mmap.metrics",
]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _short(findings) -> list[tuple[str, int | None, str]]:
    return [(f.severity, f.line, f.message) for f in findings]


@pytest.mark.parametrize("name", CLEAN)
def test_native_files_are_clean(corpus: Path, name: str) -> None:
    assert validate_file(corpus / name) == []


def test_partial_and_failed_runs_are_reported(corpus: Path, tmp_path: Path) -> None:
    # 1354 of 2048 steps, ended by the model: finished
    ended = corpus / "metrics/2026-07-21-pinned-dense-ab/bmoe-20260721-103724.csv"
    assert validate_file(ended) == []
    text = ended.read_text()
    killed = _write(tmp_path, "killed.csv", text[: text.index("# summary")])
    assert _short(validate_file(killed)) == [
        ("warning", None, "no '# summary' trailer: the run did not finish (partial)")
    ]
    lying = _write(tmp_path, "lying.csv", text.replace("tokens=1354", "tokens=2048"))
    assert _short(validate_file(lying)) == [
        ("warning", None, "summary 1 says tokens=2048, its rows are 1354")
    ]
    failed = validate_file(corpus / "native-tiny/ov.err")
    assert [f.severity for f in failed] == ["error"]
    assert "--overlap requires the bmoe llama.cpp fork" in failed[0].message


ROUTE = """\
# route_trace v1
# model=m.gguf arch=qwen3moe n_layer=2 n_expert=4 n_expert_used=2
# layer=0 expert_bytes=1000 dense_bytes=50
turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped
0,1,5,0,0,1,0.6,0,1000,0
0,1,5,0,1,2,0.4,3,0,0
0,1,5,1,0,3,0.5,1,1000,0
0,1,5,1,2,0,0.5,1,0,0
0,1,5,0,0,1,0.6,1,0,0
0,1,4,0,0,7,nan,0,1000,0
"""


def test_route_trace_findings(tmp_path: Path) -> None:
    found = _short(validate_file(_write(tmp_path, "r.csv", ROUTE)))
    assert found == [
        ("error", 6, "residency not in 0/1/2"),
        ("error", 8, "slot outside 0..1 (n_expert_used=2)"),
        ("error", 10, "expert outside 0..3"),
        ("error", 7, "expert_bytes on a hit (only misses read)"),
        ("error", 9, "(turn, phase, step, layer, slot) repeats an earlier row"),
        ("error", 10, "step goes back within its turn, phase and layer"),
        ("error", 1, "no '# layer=... expert_bytes=' line for routed layer(s) 1"),
        ("warning", None, "2 cell(s) do not hold n_expert_used=2 rows"),
    ]


METRICS = """\
# bmoe_metrics v1
# model=m.gguf arch=x n_layer=2 n_expert=4 n_expert_used=2
step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct
1,3,10.0,1.0,9.0,100,150.00
2,3,10.0,1.0,9.0,100,-1.00
2,3,-1.0,1.0,9.0,100,50.00
# summary tokens=4 cache_hit_pct=50.0
"""


def test_metrics_findings(tmp_path: Path) -> None:
    found = _short(validate_file(_write(tmp_path, "m.csv", METRICS)))
    missing = "stall_ms, mgmt_ms, majflt, cpu_ms, dense_resident_frac, turn, majflt_mib"
    assert found[0][:2] == ("error", 3)
    assert found[0][2].startswith(f"bmoe_metrics v1 lacks required column(s): {missing}")
    assert found[1:] == [
        ("error", 1, "preamble lacks key(s): moe_stream, cache_mb"),
        ("error", 4, "cache_hit_pct outside [0, 100] and not -1"),
        ("error", 6, "wall_ms is negative"),
        ("error", 6, "step does not increase"),
        ("warning", None, "summary 1 says tokens=4, its rows are 3"),
    ]


def test_many_bad_rows_make_one_finding(tmp_path: Path) -> None:
    rows = "".join(f"{i},9,1.0,0.0,1.0,0,{101 + i}.00\n" for i in range(1, 9))
    text = "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct\n" + rows
    found = validate_file(_write(tmp_path, "v0.csv", text))
    assert _short(found)[0] == (
        "error",
        2,
        "cache_hit_pct outside [0, 100] and not -1 (8 rows: lines 2, 3, 4, ...)",
    )


STREAM = """\
BMOE_READY {"load_s":0.014,"arch":"qwen3moe","n_ctx":2048,"think_ctl":"template","n_expert_used":2}
BMOE_BEGIN {"id":1}
BMOE_PROGRESS {"step":1,"steps":2,"wall_ms":1.0,"io_ms":0.5,"compute_ms":0.5,"stall_ms":0.0,"read_mb":0.10,"cache_hit_pct":50.0,"delta_text":"a"}
BMOE_PROGRESS {"step":1,"steps":2,"wall_ms":1.0,"io_ms":0.5,"compute_ms":0.5,"stall_ms":0.0,"read_mb":0.10,"cache_hit_pct":120.0,"delta_text":"b"}
BMOE_PROGRESS {"step":
BMOE_DONE {"id":2,"cancelled":false,"tokens":2}
BMOE_BEGIN {"id":3}
"""  # noqa: E501


def test_protocol_stream_findings(tmp_path: Path) -> None:
    found = _short(validate_file(_write(tmp_path, "s.out", STREAM)))
    assert found == [
        ("error", 4, "step 1 does not increase (previous 1)"),
        ("error", 4, "cache_hit_pct=120.0 outside [0, 100] and not -1"),
        ("error", 5, "BMOE_PROGRESS payload is not valid JSON (Expecting value)"),
        ("error", 6, "BMOE_DONE id=2 answers request 1"),
        ("warning", 7, "request 3 never ended (stream cut?)"),
    ]


def test_pressure_findings(tmp_path: Path) -> None:
    found = _short(
        validate_file(_write(tmp_path, "p.metrics", "peak_rss_kb=12\nmem_avail_floor_kb=abc\n"))
    )
    assert found[0][0] == "warning" and found[0][2].startswith("pressure sidecar lacks")
    assert found[1] == ("error", None, "mem_avail_floor_kb='abc' is not an integer")


def test_unreadable_files_raise(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="file is empty"):
        validate_file(_write(tmp_path, "e.csv", ""))
    with pytest.raises(FormatError, match="no such file"):
        validate_file(tmp_path / "missing.csv")
    bad = "step,steps,wall_ms\n1,2,3.0\n2,2,x\n3,2,1.0\n"
    with pytest.raises(FormatError, match=r"b\.csv:3: column 'wall_ms': 'x' is not a number"):
        validate_file(_write(tmp_path, "b.csv", bad))


def test_packed_keys_find_what_pandas_grouping_finds() -> None:
    import numpy as np
    import pandas as pd

    from bmoe.formats.validate import _packed_key

    rng = np.random.default_rng(0)
    n = 5000
    frame = pd.DataFrame({
        "turn": rng.integers(-2, 2, n).astype(np.int16),
        "step": rng.integers(-5, 40, n).astype(np.int32),
        "layer": rng.integers(0, 4, n).astype(np.int16),
        "slot": rng.integers(0, 3, n).astype(np.int8),
    })  # fmt: skip
    key = _packed_key(frame, list(frame.columns))
    assert key is not None
    assert (pd.Series(key).duplicated().to_numpy() == frame.duplicated().to_numpy()).all()
    groups = frame.groupby(["turn", "layer"]).ngroup().to_numpy()
    packed = _packed_key(frame, ["turn", "layer"])
    assert len(np.unique(packed)) == len(np.unique(groups))
    assert (pd.factorize(packed)[0] == pd.factorize(groups)[0]).all()
    wide = pd.DataFrame({"a": np.array([0, 2**40]), "b": np.array([0, 2**30])})
    assert _packed_key(wide, ["a", "b"]) is None  # 41 + 31 bits: the grouping path
