"""Bounded reads and safe output: one test per kind of failure hostile tunes, archives and
outputs met (route traces and fidelity references too large to read, torn metrics files,
formula cells, control characters in what ``bmoe run`` prints, special paths and
out-of-range values in a ``[tune]`` table, archives whose files are not theirs). The
huge-file cases run in a child process under a memory cap, as on the machine they took
down."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_inputs import capped, one_error

# ----------------------------------------------------------------------------- bounded reads


@pytest.mark.slow
def test_a_huge_sparse_file_given_as_a_route_trace_is_refused_early(corpus, tmp_path):
    """20 GiB of NULs and no line at all: read whole before it was looked at (MemoryError)."""
    path = tmp_path / "huge.route.csv"
    with open(path, "wb") as fh:
        fh.truncate(20 << 30)
    metrics = corpus / "native-tiny/run.csv"
    for args in (["analyze", "route", path], ["analyze", "route", "--stream", path],
                 ["profile", metrics, "--trace", path, "--allow-traced"]):  # fmt: skip
        result = capped(args, timeout=60)
        one_error(result, "huge.route.csv", "binary")
        assert result.seconds < 30, (args, result.seconds)  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_huge_sparse_route_trace_given_to_a_tune_is_refused_before_its_first_run(
    corpus, tmp_path
):
    """A route trace's preamble, then 20 GiB of NULs, as a tune's `trace`: refused with its
    key when the configuration is read, no folder made, no run spent."""
    import json

    from hostile_inputs import good_profile

    head = (corpus / "native-tiny/run.route.csv").read_bytes()
    path = tmp_path / "huge.route.csv"
    with open(path, "wb") as fh:
        fh.write(head[: head.index(b"\n", head.index(b"turn,")) + 1])
        fh.truncate(20 << 30)
    profile = tmp_path / "device.json"
    profile.write_text(json.dumps(good_profile(corpus)))
    (tmp_path / "tune.toml").write_text(TUNE + f'trace = "{path}"\nprofile = "{profile}"\n')
    result = capped(["tune", tmp_path / "tune.toml", "-o", tmp_path / "out"], timeout=60)
    one_error(result, "tune.toml:", "tune.trace", "huge.route.csv")
    assert result.seconds < 30, result.seconds  # type: ignore[attr-defined]
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- [tune] values

TUNE = """
[sweep]
name = "t"
engine = "embedded"

[base]
model = "m.gguf"
n_predict = 8
moe_stream = true

[grid]
cache_mb = [1, 2]

[tune]
"""


def _tune_error(text: str, tmp_path: Path) -> str:
    from bmoe.errors import BmoeError
    from bmoe.sweep.tune_config import parse_tune_config

    with pytest.raises(BmoeError) as info:
        parse_tune_config(TUNE + text, str(tmp_path / "tune.toml"), base_dir=tmp_path)
    return str(info.value)


@pytest.mark.parametrize("key", ["trace", "profile", "fidelity_ref"])
def test_a_tune_input_that_is_not_a_file_is_named_for_what_it_is(corpus, tmp_path, key):
    import json
    import os

    from hostile_inputs import good_profile

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    profile = tmp_path / "device.json"
    profile.write_text(json.dumps(good_profile(corpus)))
    good = {"trace": corpus / "native-tiny/run.route.csv", "profile": profile}
    other = "profile" if key == "trace" else "trace"
    pair = f'{other} = "{good[other]}"\n' if key != "fidelity_ref" else ""
    for path, what in (("fifo", "is a FIFO (named pipe)"), ("folder", "is a directory"),
                       ("/dev/zero", "is a character device")):  # fmt: skip
        error = _tune_error(f'{key} = "{tmp_path / path}"\n{pair}', tmp_path)
        assert f"tune.{key}" in error and what in error and "no such file" not in error, error


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('budget = "\u0663 runs"', "a number of runs"),  # an Arabic-Indic digit
        ("budget = 1000000000000000000000000000000", "at most 10000 runs"),
        ('budget = "99999999 h"', "at most 30 days"),
        ("per_round = 9223372036854775808", "must be at most 10000"),
        ("max_repeats = 9223372036854775807", "must be at most 10000"),
    ],
)
def test_tune_counts_are_ascii_and_bounded(tmp_path, line, said):
    error = _tune_error(line + "\n", tmp_path)
    assert "tune.toml:" in error and said in error, error


@pytest.mark.parametrize(
    "text",
    ["x = " + "[" * 100_000 + "]" * 100_000, "x = " + "{a = " * 10_000 + "1" + "}" * 10_000],
)
def test_analyze_sweep_of_a_configuration_nested_too_deep_is_one_error(tmp_path, text):
    """A configuration named in place of its folder was parsed bare: RecursionError."""
    from hostile_inputs import run_in_process

    path = tmp_path / "sweep.toml"
    path.write_text(text + "\n")
    one_error(run_in_process(["analyze", "sweep", str(path)]), "sweep.toml", "nested too deep")


# ----------------------------------------------------------------------------- vast budgets


def test_a_budget_past_int64_bytes_replays_as_one_that_holds_everything(corpus, tmp_path):
    """1e30 MiB (a hand-made ``--budgets``, a metrics preamble's ``cache_mb``) reached the
    compiled kernels as a Python int: internal error, "Int value is too large"."""
    import json

    from hostile_inputs import good_profile, run_in_process

    trace = str(corpus / "native-tiny/run.route.csv")
    for stream in ([], ["--stream"]):
        result = run_in_process(["analyze", "replay", trace, "--budgets", "1e30,4096",
                                 "--policies", "lru,lfu,layer", "-f", "json", *stream])  # fmt: skip
        assert result.code == 0, result.err
        curve = json.loads(result.out)["curve"]
        vast = [r["hit_pct_cum"] for r in curve if r["budget_mib"] > 1e29]
        assert vast == [r["hit_pct_cum"] for r in curve if r["budget_mib"] == 4096]
    metrics = (corpus / "native-tiny/run.csv").read_text()
    vast = tmp_path / "vast.csv"
    vast.write_text(metrics.replace(" cache_mb=2 ", " cache_mb=" + "9" * 30 + " ", 1))
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(good_profile(corpus)))
    for args in (["--against", str(vast)], ["-g", "cache_mb=1e30"]):
        result = run_in_process(["predict", trace, "-p", str(profile), *args])
        assert result.code == 0 and result.traceback is None, result.err


# ----------------------------------------------------------------------------- fidelity refs


def _npz(path: Path, logits_shape: tuple[int, ...], steps: int = 4) -> Path:
    """A fidelity reference whose logits member declares `logits_shape` (its data: a few
    bytes, compressed): what a reader inflating by the header would allocate."""
    import json
    import zipfile

    import numpy as np

    def member(array_header: dict, data: bytes) -> bytes:
        import io

        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, array_header)
        return buf.getvalue() + data

    header = json.dumps({"format": "bmoe_fidelity_ref", "version": 1, "prompt": "p",
                         "model": "m.gguf"}).encode()  # fmt: skip
    members = {
        "header": ("|u1", (len(header),), header),
        "tokens": ("<i4", (steps,), bytes(4 * steps)),
        "logits": ("<f4", logits_shape, bytes(64)),
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (descr, shape, data) in members.items():
            array = {"descr": descr, "fortran_order": False, "shape": shape}
            zf.writestr(f"{name}.npy", member(array, data))
    return path


@pytest.mark.parametrize("shape", [(4, 10**12), (4, 3 << 28), (2**40, 2**40)])
def test_a_fidelity_reference_is_sized_by_its_headers_before_it_is_inflated(tmp_path, shape):
    from bmoe.engine.embedded.fidelity import check_reference, read_reference
    from bmoe.errors import BmoeError

    path = _npz(tmp_path / "ref.npz", shape)
    for read in (check_reference, read_reference):
        with pytest.raises(BmoeError, match=r"ref.npz: logits declares .* more than 1 GiB"):
            read(str(path))


def test_a_fidelity_reference_that_is_not_one_is_one_error(tmp_path):
    from bmoe.engine.embedded.fidelity import check_reference
    from bmoe.errors import BmoeError

    for name, data in {"text.npz": b"not a zip", "empty.npz": b""}.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(BmoeError, match=f"{name}: not a fidelity reference"):
            check_reference(str(tmp_path / name))
    wide = _npz(tmp_path / "wide.npz", (4,))  # logits of one dimension
    with pytest.raises(BmoeError, match=r"wide.npz: not a fidelity reference .*logits"):
        check_reference(str(wide))


@pytest.mark.slow
def test_a_tune_refuses_a_vast_fidelity_reference_before_its_first_run(tmp_path):
    """A 3 GiB reference was refused by every run of the tune after 15 s at 3.2 GB each."""
    ref = _npz(tmp_path / "ref.npz", (4, 3 << 28))
    (tmp_path / "tune.toml").write_text(TUNE + f'min_fidelity = 0.9\nfidelity_ref = "{ref}"\n')
    result = capped(["tune", tmp_path / "tune.toml", "-o", tmp_path / "out"], timeout=60)
    one_error(result, "tune.toml:", "tune.fidelity_ref", "more than 1 GiB")
    assert not (tmp_path / "out").exists()  # no folder, no run


# ----------------------------------------------------------------------------- torn files


@pytest.mark.parametrize("cut", [5, 20, 120])  # the first row is 149 bytes
def test_predict_against_a_metrics_file_torn_in_its_first_row(corpus, tmp_path, cut):
    """Cut inside the first data row: 'assignment destination is read-only' (exit 3)."""
    import json

    from hostile_inputs import good_profile, run_in_process

    data = (corpus / "native-tiny/run.csv").read_bytes()
    first = data.index(b"\n", data.index(b"step,")) + 1
    torn = tmp_path / "torn.csv"
    torn.write_bytes(data[: first + cut])
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(good_profile(corpus)))
    result = run_in_process(
        ["predict", str(corpus / "native-tiny/run.route.csv"), "-p", str(profile),
         "--against", str(torn)]
    )  # fmt: skip
    assert result.traceback is None and result.code in (0, 1, 2), result.err
    assert "torn.csv" in result.err  # the cut is named
    assert "no token rows" in result.out and "not comparable" in result.out  # and why


# ----------------------------------------------------------------------------- output safety


def test_streamed_text_is_filtered_across_write_boundaries():
    """A C1 control split between two writes (an answer is cut at token boundaries, which
    need not be character boundaries) is still caught; undecodable bytes pass as they came."""
    import io

    from bmoe.render.messages import PrintableBytes

    raw = io.BytesIO()
    out = PrintableBytes(raw)
    for piece in (b"a\xc2", b"\x9bb\x1b[2J", b"\x07\xff\xe2\x80", b"\xaeok\n\t", b"\xe2\x82"):
        out.write(piece)
    out.close()
    assert raw.getvalue() == b"a\\x9bb\\x1b[2J\\x07\xff\\u202eok\n\t\xe2\x82"


FORMULAS = ("=cmd|' /C calc'!A0 explain", "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1")


def _csv_cells(text: str) -> list[str]:
    import csv
    import io

    rows = csv.reader(io.StringIO("\n".join(ln for ln in text.splitlines() if ln[:1] != "#")))
    return [cell for row in rows for cell in row]


def test_csv_output_neutralises_formula_cells_but_not_numbers():
    import pandas as pd

    from bmoe.render.tables import render_csv

    values = [-1.5, 2.0, -3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, -10.0]
    frame = pd.DataFrame({"=name": [*FORMULAS, "-1.5", "+3", "1e-3", "plain"], "value": values})
    cells = _csv_cells(render_csv({"t": frame, "g": {"prompt": FORMULAS[0], "x": -2.5}}))
    assert "'=name" in cells and "'=cmd|' /C calc'!A0 explain" in cells
    for cell in ("'+1+1", "'-2+3", "'@SUM(A1)", "'\t=1"):
        assert cell in cells, (cell, cells)
    assert "'\\x0d=1" in cells  # the carriage return spelled out by the output filter
    for number in ("-1.5", "+3", "1e-3", "-10.0", "-2.5", "plain"):
        assert number in cells  # numbers and plain text as they were
    assert not [
        c for c in cells if c[:1] in "=+-@\t\r" and c not in ("-1.5", "+3", "-10.0", "-2.5", "-3.0")
    ]


def test_analyze_sweep_csv_of_a_prompt_axis_that_reads_as_a_formula(tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from hostile_inputs import run_in_process

    root = tmp_path / "s"
    src = Path(__file__).resolve().parents[2] / "bench-data" / "2026-12-02-tiny-cache-lanes"
    if not src.is_dir():
        pytest.skip("no tiny-cache-lanes sweep in bench-data/")
    shutil.copytree(src, root)
    table = pq.read_table(root / "results.parquet")
    i = table.column_names.index("cell")
    cells = [f"{FORMULAS[0]} {v}" for v in table.column(i).to_pylist()]
    pq.write_table(table.set_column(i, "cell", pa.array(cells)), root / "results.parquet")
    result = run_in_process(["analyze", "sweep", str(root), "-f", "csv"])
    assert result.code == 0, result.err
    written = _csv_cells(result.out)
    assert any(c.startswith("'=cmd|") for c in written)
    assert not any(c.startswith("=") for c in written)
    assert "formula" in run_in_process(["analyze", "sweep", "--help"]).out


# ----------------------------------------------------------------------------- archives


def _sweep_copy(tmp_path: Path) -> Path:
    import shutil

    src = Path(__file__).resolve().parents[2] / "bench-data" / "2026-12-02-tiny-cache-lanes"
    if not src.is_dir():
        pytest.skip("no tiny-cache-lanes sweep in bench-data/")
    return Path(shutil.copytree(src, tmp_path / "s"))


def test_an_archive_whose_results_are_another_files_parquet_says_so(corpus, tmp_path):
    from hostile_inputs import run_in_process

    from bmoe.formats.load import load_file, row_kind
    from bmoe.formats.parquet import to_table

    root = _sweep_copy(tmp_path)
    before = run_in_process(["analyze", "sweep", str(root), "-f", "json"])
    trace = load_file(corpus / "native-tiny/run.route.csv")
    import pyarrow.parquet as pq

    pq.write_table(to_table(trace, row_kind(trace)), root / "results.parquet")
    result = run_in_process(["analyze", "sweep", str(root), "-f", "json"])
    assert result.code == 0 and result.traceback is None, result.err
    assert "results.parquet: not a sweep's results table" in result.err
    assert "rebuilt from manifest.jsonl" in result.err
    assert result.out == before.out  # the same analysis, from the manifest and the runs
    (root / "manifest.jsonl").unlink()
    one_error(run_in_process(["analyze", "sweep", str(root)]), "not a sweep's results table")


def test_an_archive_whose_manifest_was_cut_says_so(tmp_path):
    from hostile_inputs import run_in_process

    root = _sweep_copy(tmp_path)
    data = (root / "manifest.jsonl").read_bytes()
    (root / "manifest.jsonl").write_bytes(data[: len(data) // 2])
    for args in (["analyze", "sweep", str(root)], ["analyze", "contamination", str(root)]):
        result = run_in_process(args)
        assert result.code == 0 and result.traceback is None, result.err
        assert "manifest.jsonl:" in result.err and "cut short" in result.err, result.err
        assert "results.parquet holds 23 attempts the manifest does not" in result.err


# ----------------------------------------------------------------------------- compressed


def test_a_parquet_file_is_sized_by_its_footer_before_it_is_read(corpus, tmp_path, monkeypatch):
    """A few MB of Parquet can declare 500 M rows (2 GB of RSS, then a failed malloc): the
    rows it declares are priced against the memory the process may still take."""
    from hostile_inputs import run_in_process

    from bmoe.formats import inputs

    path = tmp_path / "trace.parquet"
    assert run_in_process(["convert", str(corpus / "native-tiny/run.route.csv"), "--to",
                           "parquet", "-o", str(tmp_path)]).code == 0  # fmt: skip
    (tmp_path / "run.route.parquet").rename(path)
    assert run_in_process(["analyze", "route", str(path)]).code == 0
    monkeypatch.setattr(inputs, "readable_bytes", lambda: 1_000)
    for args in (["analyze", "route", str(path)], ["info", str(path)], ["validate", str(path)]):
        one_error(run_in_process(args), "trace.parquet", "rows", "more than this process")
    assert run_in_process(["analyze", "route", "--stream", str(path)]).code == 0  # in blocks
    big = tmp_path / "big.csv"
    big.write_bytes((corpus / "native-tiny/run.csv").read_bytes())
    one_error(run_in_process(["analyze", "metrics", str(big)]), "big.csv", "more than this process")


def test_the_memory_a_read_may_take_is_what_the_address_space_cap_leaves():
    import subprocess
    import sys

    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "from bmoe.formats.inputs import readable_bytes\n"
        "size = next(int(l.split()[1]) << 10 for l in open('/proc/self/status')"
        " if l.startswith('VmSize:'))\n"
        "print(readable_bytes(), (3 << 30) - size)\n"
    )
    room, left = map(int, subprocess.check_output([sys.executable, "-c", code]).split())
    assert 0 < room <= left and left - room < 64 << 20  # what the cap leaves, not the machine


def test_a_streamed_replay_refuses_a_batch_that_outgrows_memory(corpus, tmp_path, monkeypatch):
    """500 M rows of one prefill in 17 MB of Parquet: the stream held the batch until its end
    (2.4 GB, then MemoryError)."""
    from hostile_inputs import _route_parquet_rows, run_in_process

    from bmoe.formats import inputs

    path = tmp_path / "one-batch.parquet"
    _route_parquet_rows(corpus, 2_000_000)(path)
    args = ["analyze", "replay", str(path), "--stream", "--policies", "lru"]
    monkeypatch.setattr(inputs, "readable_bytes", lambda: 200 << 20)
    one_error(run_in_process(args), "one batch of the trace (prefill of turn 0)", "rows")
    monkeypatch.setattr(inputs, "readable_bytes", lambda: 64 << 30)
    assert run_in_process(args).code == 0  # with the room it needs, it is replayed
