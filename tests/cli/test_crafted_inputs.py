"""Crafted inputs, one test per kind: device profiles with bad values, Parquet files with a
wrong schema, text trace headers, control characters, configurations asking for unbounded
work and special paths (FIFOs, symlink loops, huge sparse files, a full disk). Each is refused
with a one-line error naming the file and the problem, or shown escaped, never a traceback.
The special-file and huge-value cases run in a child process under a memory cap, as on the
machine they took down.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from hostile_inputs import (
    CONFIGS,
    _config_text,
    _drop_column,
    capped,
    good_profile,
    materialize,
    parquet_mutations,
    run_in_process,
    special_cases,
)
from hostile_inputs import (
    one_error as _one_error,
)

# ----------------------------------------------------------------------------- the profile


@pytest.fixture()
def profile_doc(corpus: Path) -> dict:
    return good_profile(corpus)


def _predict(corpus: Path, profile: Path, *extra: str):
    trace = corpus / "native-tiny/run.route.csv"
    return run_in_process(["predict", str(trace), "-p", str(profile), "-g", "cache_mb=1,2", *extra])


def _write(tmp_path: Path, doc, name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc, allow_nan=True).encode())
    return path


def test_a_clean_profile_predicts(corpus, tmp_path, profile_doc):
    result = _predict(corpus, _write(tmp_path, profile_doc), "-f", "json")
    assert result.code == 0, result.err
    assert len(json.loads(result.out)["predicted"]) == 2


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (lambda d: d["flash"][0].update(lanes=10**20), ("flash[0].lanes", "at most 4096")),
        (lambda d: d["compute"].update(token_ms=1e39), ("compute.token_ms", "at most")),
        (lambda d: d["compute"].update(token_ms=float("-inf")), ("compute.token_ms", "-Infinity")),
        (lambda d: d["mgmt"].update(per_admit_ms=None), ("mgmt.per_admit_ms", "null")),
        (lambda d: d["model"].update(slices_per_expert="3"), ("slices_per_expert", '"3"')),
        (lambda d: d.update(overlap=5), ("overlap must be an object", "5")),
        (lambda d: d["model"]["expert_bytes"].update({"²": 196608}), ("expert_bytes", "\\u00b2")),
        (lambda d: d.update(caveats=["c" * (10 << 20)]), ("caveats[0]", "10485760 characters")),
        (lambda d: d["flash"][0].update(reads=True), ("flash[0].reads", "true")),
        (lambda d: d.update(mode="overlap"), ("overlap.stall_ms_per_miss is missing",)),
    ],
)
def test_every_profile_value_is_checked_and_named(corpus, tmp_path, profile_doc, change, needles):
    change(profile_doc)
    started = time.monotonic()
    result = _predict(corpus, _write(tmp_path, profile_doc))
    _one_error(result, "p.json", *needles)
    assert time.monotonic() - started < 10  # the 10 MB caveat took 48 s


def test_an_all_zero_profile_is_refused_not_divided_by(corpus, tmp_path, profile_doc):
    """The dry run divided by the sum of its times (ZeroDivisionError)."""
    for section in ("compute", "mgmt"):
        profile_doc[section] = {k: 0 for k in profile_doc[section]}
    kept = ("lanes", "req_bytes", "source")
    profile_doc["flash"] = [{**row, **{k: 0 for k in row if k not in kept}}
                            for row in profile_doc["flash"]]  # fmt: skip
    path = _write(tmp_path, profile_doc)
    _one_error(_predict(corpus, path), "compute.token_ms must be > 0")
    config = tmp_path / "s.toml"
    config.write_text('[sweep]\nname = "z"\nengine = "embedded"\nprofile = "p.json"\n'
                      '[base]\nmodel = "m.gguf"\n')  # fmt: skip
    (tmp_path / "m.gguf").write_bytes(b"GGUF")  # (the dry run refuses a missing model first)
    _one_error(run_in_process(["sweep", str(config), "--dry-run"]), "compute.token_ms")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b'{"format": "bmoe_profile", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}", "nested"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
        (
            '{"format": "bmoe_profile", "model": {"name": "mö"}}'.encode("latin-1"),
            "p.json:1: not UTF-8",
        ),
        ('{"format": "bmoe_profile"}'.encode("utf-16"), "not UTF-8"),
        (b'{"format": "bmoe_profile", "version": 1, "version": 2}', "key 'version' appears twice"),
        (b'{"format": "bmoe_profile", "version": ' + b"9" * 5000 + b"}", "version"),
    ],
)
def test_profile_files_that_are_not_plain_json(corpus, tmp_path, data, needle):
    _one_error(_predict(corpus, _write(tmp_path, data)), needle)


def test_profiles_that_never_end_or_block_are_refused_under_a_memory_cap(corpus, tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    trace = corpus / "native-tiny/run.route.csv"
    for source, needle in (("/dev/zero", "character device"), (fifo, "FIFO")):
        result = capped(["predict", trace, "-p", source, "-g", "cache_mb=1"], timeout=60)
        _one_error(result, needle)
        config = tmp_path / "s.toml"
        config.write_text(f'[sweep]\nname = "z"\nengine = "embedded"\nprofile = "{source}"\n'
                          '[base]\nmodel = "m.gguf"\n')  # fmt: skip
        result = capped(["sweep", config, "--dry-run"], timeout=60)
        _one_error(result, "s.toml:4: sweep.profile", needle)
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: 20 GB of nothing after an opening brace
        fh.write(b'{"format": "bmoe_profile", "caveats": ["')
        fh.truncate(20 << 30)
    _one_error(capped(["predict", trace, "-p", big, "-g", "cache_mb=1"]), "larger than 16 MiB")


# ----------------------------------------------------------------------------- Parquet


@pytest.fixture(scope="module")
def parquet_route(corpus: Path) -> dict:
    """Damaged Parquet forms of the corpus route trace, by what was done to them."""
    from bmoe.formats.load import load_file
    from bmoe.formats.parquet import to_table

    table = to_table(load_file(corpus / "native-tiny/run.route.csv"), "route")
    return dict(parquet_mutations(table))


ROUTE_COMMANDS = (
    ["info"], ["validate"], ["convert", "--to", "csv"], ["analyze", "route"],
    ["analyze", "replay", "--budgets", "1"], ["analyze", "drop"],
    ["analyze", "replay", "--stream", "--policies", "lru"], ["analyze", "route", "--stream"],
)  # fmt: skip


@pytest.mark.parametrize(
    ("what", "needle"),
    [
        ("parquet-no-step", "header lacks required column(s): step"),
        ("parquet-renamed-layer", "header lacks required column(s): layer"),
        ("parquet-nan-expert", "column 'expert', row 1: nan is not an integer"),
        ("parquet-null-step", "column 'step', row 1: None is not an integer"),
        ("parquet-text-expert", "column 'expert' holds text where integers belong"),
        ("parquet-huge-expert", "expert=4611686018427387904 is beyond the 32-bit range"),
        ("parquet-list-expert", "column 'expert' holds list<element: int64> values where integers"),
        ("parquet-duplicate", "duplicate column(s): turn"),
        (
            "parquet-meta-bmoe.meta=b'1'",
            "bmoe.meta in the Parquet metadata (the preamble is not an object)",
        ),
        ("parquet-meta-bmoe.meta=b'null'", "the preamble is not an object"),
        ("parquet-meta-bmoe.layers=b'[1, 2]'", "corrupt bmoe.layers"),
        ("parquet-meta-bmoe.kind=b'\\xff\\xfe'", "without bmoe metadata"),
        ("parquet-meta-n_expert='[/]'", "n_expert='[/]' is not a count"),
    ],
)
def test_parquet_with_a_wrong_schema_says_what_is_wrong(tmp_path, parquet_route, what, needle):
    path = tmp_path / "t.parquet"
    path.write_bytes(parquet_route[what])
    for args in ROUTE_COMMANDS:
        out = tmp_path / "out"
        result = run_in_process([*args, str(path), *(["-o", str(out)] if args[0] == "convert"
                                                    else [])])  # fmt: skip
        if args == ["validate"]:
            assert result.code == 2, result.err
        _one_error(result, needle)


def test_parquet_columns_are_typed_as_the_csv_reader_types_them(tmp_path, corpus, parquet_route):
    """A column stored wider (int64, float64) or as a dictionary reads back as the CSV form."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bmoe.formats.route import read_route_trace

    csv = read_route_trace(corpus / "native-tiny/run.route.csv")
    table = pq.read_table(pa.BufferReader(parquet_route["parquet-clean"]))
    wide = table.set_column(5, "expert", pa.array(table.column(5).to_numpy().astype("float64")))
    wide = wide.set_column(2, "step", pa.array(table.column(2).to_numpy().astype("int64")))
    path = tmp_path / "wide.parquet"
    pq.write_table(wide, path)
    back = read_route_trace(path)
    assert dict(back.rows.dtypes) == dict(csv.rows.dtypes)
    assert back.rows.equals(csv.rows)


@pytest.mark.slow
def test_metrics_and_decode_parquet_without_a_column(tmp_path, corpus):
    from bmoe.formats.load import load_file
    from bmoe.formats.parquet import to_table

    cases = {
        "run.csv": (["analyze", "metrics"], ["analyze", "stall"], ["info"]),
        "run.io.csv": (["analyze", "decode", "io"], ["export", "trace"]),
        "ct.compute.csv": (["analyze", "decode", "compute"], ["export", "trace"]),
    }
    for name, commands in cases.items():
        obj = load_file(corpus / "native-tiny" / name)
        kind = {"run.csv": "metrics", "run.io.csv": "io", "ct.compute.csv": "compute"}[name]
        table = to_table(obj, kind)
        for what, data in parquet_mutations(table):
            if not what.startswith(("parquet-no-", "parquet-renamed-", "parquet-text-")):
                continue
            path = tmp_path / f"{what}.parquet"
            path.write_bytes(data)
            for args in commands:
                extra = (
                    ["-o", str(tmp_path / f"{what}.json"), "--force"] if args[0] == "export" else []
                )
                result = run_in_process([*args, str(path), *extra])
                assert result.traceback is None and result.code in (0, 1, 2), (
                    what,
                    args,
                    result.err,
                )
                if result.code == 2:
                    _one_error(result)


# ----------------------------------------------------------------------------- text traces


def test_an_io_trace_without_offset_and_a_compute_trace_without_op(corpus, tmp_path):
    io = tmp_path / "x.io.csv"
    io.write_bytes(_drop_column((corpus / "native-tiny/run.io.csv").read_bytes(), "offset"))
    _one_error(run_in_process(["analyze", "decode", "io", str(io)]), "no offset column")
    comp = tmp_path / "x.compute.csv"
    comp.write_bytes(_drop_column((corpus / "native-tiny/ct.compute.csv").read_bytes(), "op"))
    _one_error(run_in_process(["analyze", "decode", "compute", str(comp)]), "no op column")
    export = run_in_process(["export", "trace", str(comp), "-o", str(tmp_path / "t.json")])
    assert export.code == 0, export.err  # the timeline names nodes by name: op not needed


@pytest.mark.parametrize("stream", [False, True])
def test_a_header_name_with_blanks_is_the_name(corpus, tmp_path, stream, read_mode):
    """``expert `` in the header is ``expert`` for the reader, the views and validate."""
    data = (corpus / "native-tiny/run.route.csv").read_bytes()
    spaced = tmp_path / "spaced.route.csv"
    spaced.write_bytes(
        data.replace(b",expert,", b",expert ,", 1).replace(b"weight,", b" weight ,", 1)
    )
    args = ["analyze", "route", "--format", "json", *(["--stream"] if stream else [])]
    plain_result = run_in_process([*args, str(corpus / "native-tiny/run.route.csv")])
    spaced_result = run_in_process([*args, str(spaced)])
    assert spaced_result.code == 0, spaced_result.err
    assert spaced_result.out == plain_result.out
    replay = run_in_process(["analyze", "replay", str(spaced), "--budgets", "1", "-f", "json"])
    assert replay.code == 0, replay.err


# ----------------------------------------------------------------------------- control characters

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _clean(text: str) -> None:
    m = CONTROL.search(text)
    assert m is None, repr(text[max(0, m.start() - 40) : m.end() + 20])


FORMATS = ("table", "csv", "markdown", "json")


@pytest.mark.slow
def test_control_characters_never_reach_the_terminal_or_a_file(corpus, tmp_path):
    tiny = corpus / "native-tiny"
    marked = {}
    for name in ("run.route.csv", "run.csv", "ct.compute.csv", "run.io.csv"):
        mark = "arch=\x1b[2J\x9b31m\x07".encode()  # ESC, CSI (UTF-8), BEL
        data = (tiny / name).read_bytes().replace(b"arch=", mark, 1)
        marked[name] = tmp_path / name
        marked[name].write_bytes(data)
    runs = [
        ["analyze", "drop", str(marked["run.route.csv"])],
        ["analyze", "route", str(marked["run.route.csv"])],
        *(["info", str(p), "-f", f] for p in marked.values() for f in FORMATS),
        *(["analyze", "metrics", str(marked["run.csv"]), "-f", f] for f in FORMATS),
        *(["analyze", "decode", "compute", str(marked["ct.compute.csv"]), "-f", f]
          for f in FORMATS),
    ]  # fmt: skip
    for args in runs:
        result = run_in_process(args)
        assert result.code in (0, 1), (args, result.err)
        _clean(result.out)
        _clean(result.err)
    page = tmp_path / "r.html"
    assert run_in_process(["report", str(marked["run.csv"]), "-o", str(page)]).code == 0
    _clean(page.read_text())
    assert "\\x1b[2J" in page.read_text()  # shown, escaped


def test_control_characters_in_a_sweep_are_shown_escaped(tmp_path):
    from hostile_inputs import sweep_cases

    sweep = ROOT / "bench-data" / "2026-11-29-small-traces"
    case = next(c for c in sweep_cases(sweep) if c.name == "sweep-results-control")
    folder = materialize(case, tmp_path)
    for fmt in ("table", "csv", "markdown", "json"):
        result = run_in_process(["analyze", "sweep", str(folder), "-f", fmt])
        assert result.code == 0, result.err
        _clean(result.out)
        _clean(result.err)
        if fmt in ("csv", "markdown"):  # (a table may wrap it)
            assert "\\x1b[31mcache_mb" in result.out
    page = tmp_path / "s.html"
    assert run_in_process(["report", str(folder), "-o", str(page)]).code == 0
    _clean(page.read_text())


def test_the_console_shows_what_it_is_handed_escaped():
    """The guard behind the renderers: a plain string printed as it is, on a terminal that
    takes styles, shows ESC spelled out while rich's own styling still works."""
    import io

    from rich.console import Console
    from rich.text import Text

    from bmoe.render.messages import guarded

    out = io.StringIO()
    console = guarded(Console(file=out, force_terminal=True, color_system="standard", width=80))
    console.print("a\x1b[2Jb\x9b31mc\u202ed", highlight=False)
    console.print(Text("styled", style="bold"))
    console.out("plain \x1b]8;;http://x\x07link", highlight=False)
    text = out.getvalue()
    assert "a\\x1b[2Jb\\x9b31mc\\u202ed" in text and "plain \\x1b]8;;http://x" in text
    assert "\x1b[1mstyled" in text  # the style rich itself writes
    assert "\x1b[2J" not in text and "\x9b" not in text and "\u202e" not in text


# ----------------------------------------------------------------------------- configurations


def _config(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    os.mkfifo(folder / "fifo")
    path = folder / "sweep.toml"
    path.write_text(_config_text(name), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("grid-1e6", "1000000 cells x 1 runs each = 1000000 runs, more than max_runs (10000)"),
        pytest.param("many-cells-1e5", "100000 cells", marks=pytest.mark.slow),
        ("repeats-1e9", "1 cells x 1000000000 runs each"),
        ("warmup-1e9", "1000000001 runs"),
        ("max-repeats-1e9", "1000000000 runs"),
        ("retries-1e9", "sweep.retries: must be at most 100"),
        ("timeout-1e308", "sweep.timeout_s: must be at most"),
        ("prompt-urandom", "/dev/urandom: is a character device"),
        ("prompt-fifo", "is a FIFO"),
        ("prompt-lines-zero", "/dev/zero: is a character device"),
        ("nested-1e5", "nested too deep"),
        ("nested-tables-1e4", "nested too deep"),
        ("cache-1e308", "grid.cache_mb: must be from 0 to 16777216, got 1e+308"),
        ("gate-1e308", "gate.max_wait_s: must be at most"),
    ],
)
def test_configurations_asking_for_unbounded_work_are_refused_quickly(tmp_path, name, needle):
    config = _config(tmp_path, name)
    result = capped(["sweep", config, "--dry-run"], timeout=60)
    _one_error(result, "sweep.toml", needle)
    assert result.seconds < 30, result.seconds  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_large_grid_streams_within_a_limit_the_user_raised(tmp_path):
    config = tmp_path / "big.toml"
    axis = list(range(1, 101))
    body = (
        f'[sweep]\nname = "big"\nengine = "embedded"\nmax_runs = 20000\nrepeats = 2\n'
        f'[base]\nmodel = "m.gguf"\n[grid]\ncache_mb = {axis}\nio_threads = {axis}\n'
    )
    config.write_text(body)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")  # (the dry run refuses a missing model first)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bmoe", "sweep", str(config), "--dry-run"],
        stdout=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    first = proc.stdout.readline()
    assert "10000 cells x 2 repeats = 20000 runs" in first
    rest = proc.stdout.read()
    assert proc.wait(timeout=300) == 0
    assert rest.count("\n      (cd ") == 20000  # each run and its command, as they are planned
    config.write_text(body.replace("max_runs = 20000", "max_runs = 19999"))
    _one_error(run_in_process(["sweep", str(config), "--dry-run"]), "raise [sweep] max_runs")


def test_a_prompt_longer_than_one_argument_is_refused(tmp_path):
    (tmp_path / "long.txt").write_text("x" * 200_000)
    config = tmp_path / "s.toml"
    config.write_text('[sweep]\nname = "p"\nengine = "embedded"\n[base]\nmodel = "m.gguf"\n'
                      'prompt_file = "long.txt"\n')  # fmt: skip
    _one_error(
        run_in_process(["sweep", str(config), "--dry-run"]), "200000 bytes", "at most 131072"
    )


def test_configs_list_every_limit_case():
    assert {"grid-1e6", "repeats-1e9", "prompt-urandom", "nested-1e5", "cache-1e308"} <= set(
        CONFIGS
    )


# ----------------------------------------------------------------------------- special paths


def test_a_symlink_loop_is_an_error_not_a_crash(tmp_path):
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    for args in (
        ["export", "trace", str(loop), "-o", str(tmp_path / "t.json")],
        ["report", str(loop), "-o", str(tmp_path / "r.html")],
        ["info", str(loop)],
        ["analyze", "metrics", str(loop)],
    ):
        _one_error(run_in_process(args), "loop.csv", "symbolic links")
    _one_error(run_in_process(["profile", str(loop)]), "loop.csv")


SPARSE_COMMANDS = (
    ["analyze", "metrics"], ["analyze", "stall"], ["analyze", "contamination"],
    ["analyze", "decode", "compute"], ["analyze", "decode", "io"], ["analyze", "drop"],
    ["analyze", "route"], ["validate"], ["info"],
)  # fmt: skip


@pytest.mark.slow
def test_a_huge_sparse_file_with_a_metrics_preamble_is_refused_early(corpus, tmp_path):
    """20 GB of NULs after a metrics preamble and header: read whole by six analysis commands
    (MemoryError under a 4 GB cap, or minutes of reading)."""
    case = next(c for c in special_cases(corpus, sparse_gb=20) if c.what == "sparse-metrics")
    path = materialize(case, tmp_path)
    assert path.stat().st_size == 20 << 30
    for args in SPARSE_COMMANDS:
        result = capped([*args, path], timeout=60)
        if args == ["analyze", "contamination"]:  # a folder-level view: the file is skipped
            assert result.returncode in (0, 2), result.stderr
            assert "Traceback" not in result.stderr and "internal" not in result.stderr
            continue
        _one_error(result, "binary")
        assert result.seconds < 30, (args, result.seconds)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- minor


def test_negative_wall_ns_never_makes_a_negative_duration(corpus, tmp_path):
    from hostile_inputs import _set_column

    src = (corpus / "native-tiny/ct.compute.csv").read_bytes()
    comp = tmp_path / "neg.compute.csv"
    comp.write_bytes(_set_column(src, "wall_ns", "-5000"))
    out = tmp_path / "t.json"
    assert run_in_process(["export", "trace", str(comp), "-o", str(out)]).code == 0
    doc = json.loads(out.read_text())
    durations = [e["dur"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert durations and min(durations) >= 0
    assert any("negative wall_ns drawn 0 long" in n for n in doc["otherData"]["notes"])


def test_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    import errno

    from bmoe.sweep import archive

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(archive.os, "fsync", full)
    with pytest.raises(OSError):
        archive.write_atomic(tmp_path / "summary.md", "text")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    # one left by a runner that was killed mid-write goes on the next resume
    (tmp_path / "sweep.toml").write_text('[sweep]\nname = "x"\n')
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    stale = tmp_path / f".summary.md.tmp-{dead}-1"
    stale.write_text("half")
    mine = tmp_path / f".summary.md.tmp-{os.getpid()}-1"
    mine.write_text("being written")
    archive.ArchiveWriter.open(tmp_path)
    assert not stale.exists() and mine.exists()


def test_history_of_a_symlink_loop_is_one_line(tmp_path):
    """``history LOOP LOOP`` resolved the folder to tell it was given twice (RuntimeError)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    result = run_in_process(["history", str(loop), str(loop)])
    assert result.code == 2 and result.traceback is None, result.err
    assert "symbolic link loop" in result.err
