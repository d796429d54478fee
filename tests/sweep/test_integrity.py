"""No measurement lost or counted twice: attempt numbers never reused after resume, at most one
``ok`` per run in the manifest and the results, remote deliveries checked before a run counts,
and one runner per sweep folder."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
from sweep_helpers import install_fake_cli, manifest, sweep_folder, write_config

from bmoe.errors import BmoeError
from bmoe.sweep.archive import (
    ArchiveWriter,
    file_digest,
    load_results,
    read_manifest,
    results_frame,
)
from bmoe.sweep.config import load_config, resolved_toml
from bmoe.sweep.lock import SweepBusy, folder_lock, name_lock
from bmoe.sweep.plan import make_plan
from bmoe.sweep.runner import run_sweep
from bmoe.sweep.shipping import Delivery, Receiver, delivery_problem
from bmoe.sweep.units import DiskFull

ROOT = Path(__file__).resolve().parents[2]


def make_sweep(tmp_path: Path, grid: str, extra: str = "", base: str = "") -> Path:
    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF stand-in")
    return write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "t"
        engine = "native"
        output = "{tmp_path / "out"}"
        timeout_s = 30
        {extra}

        [base]
        model = "tiny.gguf"
        n_predict = 4
        {base}

        [grid]
        {grid}

        [[targets]]
        name = "here"
        binary = "{fake}"
        """,
    )


def run(path: Path, archive: ArchiveWriter | None = None) -> ArchiveWriter:
    config = load_config(path)
    plan = make_plan(config)
    if archive is None:
        archive = ArchiveWriter.create(Path(config.settings.output), config.settings.name,
                                 resolved_toml(config))  # fmt: skip
    run_sweep(config, plan, archive)
    return archive


def ok_lines(root: Path) -> list[dict]:
    return [r for r in manifest(root) if r["status"] == "ok"]


def test_resume_after_a_damaged_or_deleted_run_takes_a_new_attempt(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]\nthreads = [1, 2]", "repeats = 2")
    archive = run(cfg)
    root = archive.root
    assert len(ok_lines(root)) == 8
    records = ok_lines(root)
    damaged, deleted = records[0], records[5]
    csv = root / damaged["dir"] / "run.csv"
    csv.write_bytes(csv.read_bytes()[:-40])  # cut: no summary line any more
    import shutil

    shutil.rmtree(root / deleted["dir"])

    run(cfg, ArchiveWriter.open(root))
    ok = ok_lines(root)
    assert len(ok) == 8 and len({r["run"] for r in ok}) == 8  # one ok per run, none twice
    by_run = {r["run"]: r for r in ok}
    for earlier in (damaged, deleted):
        assert by_run[earlier["run"]]["attempt"] == 2  # never attempt 1 again
    aside = {r["run"]: r for r in manifest(root) if r["status"] == "set_aside"}
    assert set(aside) == {damaged["run"], deleted["run"]}
    assert (
        aside[damaged["run"]]["was"] == "ok"
        and "run.csv changed" in (aside[damaged["run"]]["set_aside"])
    )
    assert (root / aside[damaged["run"]]["dir"] / "INVALID").is_file()
    assert aside[deleted["run"]]["set_aside"] == "its folder is missing"
    # The results and the analysis count every run once.
    results = pd.read_parquet(root / "results.parquet")
    assert (results["status"] == "ok").sum() == 8
    assert results[results["status"] == "ok"]["run"].is_unique
    from bmoe.analyze.sweep import analyze_sweep

    views = analyze_sweep(load_results(root))
    ranked = views["ranking"]
    assert ranked["n"].tolist() == [2, 2, 2, 2]


def test_an_archive_with_two_ok_lines_for_a_run_counts_the_latest_once(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]")
    root = run(cfg).root
    first = ok_lines(root)[0]
    # An archive written before the fix: the same run ok twice (attempts 1 and 2).
    again = {**first, "attempt": 2}
    with open(root / "manifest.jsonl", "a") as fh:
        fh.write(json.dumps(again) + "\n")
    frame = results_frame(root)
    mine = frame[frame["run"] == first["run"]]
    assert sorted(mine["status"]) == ["ok", "superseded"]
    assert mine[mine["status"] == "ok"]["attempt"].tolist() == [2]
    # Resume makes the manifest itself hold one ok per run: the folder's attempt counts.
    run(cfg, ArchiveWriter.open(root))
    ok = ok_lines(root)
    assert len(ok) == 2 and len({r["run"] for r in ok}) == 2
    assert next(r for r in ok if r["run"] == first["run"])["attempt"] == 1


def test_an_ok_delivery_with_a_one_byte_csv_is_not_complete(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]", 'executor = "ray"')
    config = load_config(cfg)
    plan = make_plan(config)
    archive = ArchiveWriter.create(tmp_path / "out", "t", resolved_toml(config))
    unit = plan.units[0]
    run_ = unit.runs[0]
    delivery = Delivery(unit, config.targets[0])
    receiver = Receiver(archive, config, _Sink())
    receiver.receive(delivery, {"kind": "started", "run": run_.id, "attempt": 1})
    receiver.receive(delivery, {"kind": "file", "run": run_.id, "attempt": 1,
                                "name": "run.csv", "offset": 0, "data": b"#"})  # fmt: skip
    listing = {"run.csv": {"bytes": 1, "sha256": file_digest(_bytes_file(tmp_path, b"#"))}}
    record = {"run": run_.id, "attempt": 1, "status": "ok", "error": None, "files": listing,
              "params": dict(run_.cell.params)}  # fmt: skip
    [archived] = receiver.receive(delivery, {"kind": "record", "record": record})
    assert archived["status"] == "invalid"
    assert archived["error"].startswith("delivery check: ") and "run.csv" in archived["error"]
    assert not archive.validate_run(run_.id)[0]
    assert archive.next_attempt(run_.id) == 2


def test_a_delivery_that_differs_from_the_hosts_files_is_refused(tmp_path):
    staging = tmp_path / "s"
    staging.mkdir()
    (staging / "run.out").write_bytes(b"abc")
    good = {"run.out": {"bytes": 3, "sha256": file_digest(staging / "run.out")}}
    assert delivery_problem(staging, good, complete=False) is None
    short = {"run.out": {"bytes": 4, "sha256": good["run.out"]["sha256"]}}
    assert "3 bytes arrived, the host wrote 4" in delivery_problem(staging, short, False)
    flipped = {"run.out": {"bytes": 3, "sha256": "0" * 64}}
    assert "checksum" in delivery_problem(staging, flipped, False)
    assert "did not arrive" in delivery_problem(staging, {"run.err": good["run.out"]}, False)
    assert "no file listing" in delivery_problem(staging, None, complete=True)


def test_a_piece_beyond_the_end_of_its_file_is_refused(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]", 'executor = "ray"')
    config = load_config(cfg)
    archive = ArchiveWriter.create(tmp_path / "out", "t", resolved_toml(config))
    unit = make_plan(config).units[0]
    delivery = Delivery(unit, config.targets[0])
    receiver = Receiver(archive, config, _Sink())
    piece = {"kind": "file", "run": unit.runs[0].id, "attempt": 1, "name": "run.csv",
             "offset": 1 << 40, "data": b"x"}  # fmt: skip
    with pytest.raises(BmoeError, match="offset"):
        receiver.receive(delivery, piece)
    staged = list((archive.root / "cells").glob("*/.*.staging/run.csv"))
    assert all(p.stat().st_size == 0 for p in staged)


class _Sink:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _bytes_file(folder: Path, data: bytes) -> Path:
    path = folder / "bytes"
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------- one runner


def test_a_held_folder_is_refused_naming_the_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from bmoe.sweep.lock import folder_lock\n"
         "with folder_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)",
         str(tmp_path)],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(SweepBusy) as info:
            folder_lock(tmp_path).acquire()
        assert f"pid {holder.pid} on host" in str(info.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The holder was killed: the kernel dropped its lock; its record is taken over as stale.
    with folder_lock(tmp_path) as lock:
        assert lock.stale is not None and lock.stale["pid"] == holder.pid
        with folder_lock(tmp_path):  # the same process again: fine (held, not re-taken)
            pass
        record = json.loads((tmp_path / ".lock").read_text())
        assert record["pid"] == os.getpid()
    assert (tmp_path / ".lock").read_text() == ""  # released: no record left to mislead


def _sweep(cfg: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg), "--plain", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_a_second_sweep_of_the_same_config_or_folder_is_refused(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]", base='fake_mode = "hang"')
    out = tmp_path / "out"
    first = _sweep(cfg)  # runs until stopped
    try:
        _wait_for(lambda: out.is_dir() and any(p.is_dir() for p in out.iterdir()))
        root = sweep_folder(out)
        _wait_for(lambda: list((root / "cells").glob("*/.*.staging")))
        for extra in ((), ("--resume",)):
            second = _sweep(cfg, *extra)
            _out, err = second.communicate(timeout=60)
            assert second.returncode == 2, err.decode()
            text = err.decode()
            assert "in use by pid" in text and str(first.pid) in text
            assert "Traceback" not in text
        second = _sweep(root)  # the folder itself
        _out, err = second.communicate(timeout=60)
        assert second.returncode == 2 and str(first.pid) in err.decode()
        assert [p for p in out.iterdir() if p.is_dir()] == [root]  # no second folder
        first.send_signal(signal.SIGINT)
        _out, err = first.communicate(timeout=60)
        assert first.returncode == 130, err.decode()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # The refused runs touched nothing: the first runner's attempt is its only record.
    assert [r["status"] for r in manifest(root)] == ["interrupted"]


def test_the_library_runner_takes_the_folder_lock(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]")
    config = load_config(cfg)
    archive = ArchiveWriter.create(tmp_path / "out", "t", resolved_toml(config))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from bmoe.sweep.lock import folder_lock\n"
         "with folder_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)",
         str(archive.root)],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(SweepBusy):
            run_sweep(config, make_plan(config), archive)
    finally:
        holder.kill()
        holder.wait()
    assert manifest(archive.root) == []
    with name_lock(tmp_path / "out", "t"):
        pass


# ----------------------------------------------------------------------------- disk full


def test_a_full_disk_stops_the_sweep_with_one_clear_error(tmp_path, monkeypatch, capsys):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8, 16]")
    config = load_config(cfg)
    archive = ArchiveWriter.create(tmp_path / "out", "t", resolved_toml(config))
    finalize = ArchiveWriter.finalize
    calls = []

    def full_after_one(self, files, record):
        calls.append(record["run"])
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(files.staging))
        return finalize(self, files, record)

    monkeypatch.setattr(ArchiveWriter, "finalize", full_after_one)
    with pytest.raises(DiskFull, match="no space left on the device") as info:
        run_sweep(config, make_plan(config), archive)
    assert "resume with: bmoe sweep" in str(info.value)
    assert len(calls) == 2  # stopped: the third run never started
    results = pd.read_parquet(archive.root / "results.parquet")
    assert results["status"].tolist() == ["ok"]  # what completed is in the results
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("made_by", ["sweep", "tune"])
def test_a_full_disk_names_the_command_that_made_the_folder(tmp_path, monkeypatch, made_by):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]")
    config = load_config(cfg)
    text = resolved_toml(config) + ("\n[tune]\nbudget = 3\n" if made_by == "tune" else "")
    archive = ArchiveWriter.create(tmp_path / "out dir", "t", text)

    def full(self, files, record):
        raise OSError(errno.ENOSPC, "No space left on device", str(files.staging))

    monkeypatch.setattr(ArchiveWriter, "finalize", full)
    with pytest.raises(DiskFull) as info:
        run_sweep(config, make_plan(config), archive)
    assert str(info.value).endswith(f"resume with: bmoe {made_by} '{archive.root}')")


def test_sweep_refuses_a_tune_folder_and_leaves_it_as_it_was(tmp_path):
    from hostile_inputs import run_in_process

    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]")
    text = resolved_toml(load_config(cfg)) + "\n[tune]\nbudget = 3\n"
    root = ArchiveWriter.create(tmp_path / "out", "t", text).root
    for args in ([str(root)], [str(cfg), "--resume"]):  # the folder, or found as the latest
        result = run_in_process(["sweep", *args])
        assert result.code == 2 and result.traceback is None, result.err
        assert f"{root}: made by bmoe tune; resume it with: bmoe tune {root}" in result.err
        assert (root / "sweep.toml").read_text() == text
        assert not list(root.glob("sweep.*.toml")) and manifest(root) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_output_capture_on_a_full_disk_keeps_draining_without_a_thread_traceback(monkeypatch):
    import io
    import threading

    from bmoe.sweep.attempt import pump as _pump

    hooked = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args))
    lines = [f"BMOE_PROGRESS {i}\n".encode() for i in range(1000)]
    seen = []
    thread = _pump(io.BytesIO(b"".join(lines)), Path("/dev/full"), seen.append)
    thread.join(timeout=30)
    assert not thread.is_alive() and hooked == []
    assert thread.error.errno == errno.ENOSPC
    assert seen == lines  # the engine's pipe was drained to the end


def test_a_torn_last_manifest_line_is_set_aside_before_the_next_append(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8, 16]")
    root = run(cfg).root
    path = root / "manifest.jsonl"
    whole = path.read_bytes()
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[1]
    path.write_bytes(whole[: len(whole) - len(last) // 2 - 1])  # a power loss mid-record
    with pytest.warns(UserWarning, match=r"manifest.jsonl:3: .*cut short"):
        manifest_lines = read_manifest(path)
    assert len(manifest_lines) == 2
    run(cfg, ArchiveWriter.open(root))  # the third run's line comes back from its folder
    lines = path.read_bytes().splitlines()
    assert all(json.loads(line)["status"] == "ok" for line in lines)
    assert sorted(json.loads(line)["run"] for line in lines) == sorted(
        r.id for r in make_plan(load_config(cfg)).runs
    )  # every run once, none lost
    assert (root / "manifest.jsonl.torn").read_bytes() == last[: len(last) - len(last) // 2] + b"\n"
    # a torn tail met by an append (no open() before it) is set aside the same way
    path.write_bytes(path.read_bytes() + b'{"run": "x/r1", "stat')
    ArchiveWriter(root).append_manifest({"run": "y/r1", "status": "error"})
    assert [json.loads(line)["run"] for line in path.read_bytes().splitlines()][-1] == "y/r1"
    assert (root / "manifest.jsonl.torn").read_bytes().endswith(b'{"run": "x/r1", "stat\n')
    # a last record whole but for its newline is kept
    path.write_bytes(path.read_bytes() + b'{"run": "z/r1", "status": "error"}')
    ArchiveWriter(root).append_manifest({"run": "w/r1", "status": "error"})
    runs = [json.loads(line)["run"] for line in path.read_bytes().splitlines()]
    assert runs[-2:] == ["z/r1", "w/r1"]


def test_a_completed_run_whose_line_was_torn_off_is_listed_again_when_the_folder_opens(tmp_path):
    """A tune plans its rounds from the manifest: a completed run whose ``ok`` line a power
    loss tore off was in no later round's plan, so the resume's runner never gave its line
    back, and the run was lost (robustness.py's torn tunes, 1 of 12)."""
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8, 16]")
    root = run(cfg).root
    path = root / "manifest.jsonl"
    whole = path.read_bytes()
    last = json.loads(whole.rstrip(b"\n").rsplit(b"\n", 1)[1])
    path.write_bytes(whole[: len(whole) - 20])  # the last ok line cut mid-record
    (root / "cells" / last["cell"] / "r1.a2.crashed").mkdir()  # an attempt set aside: not it
    archive = ArchiveWriter.open(root)  # no plan, no run: what a tune's resume does first
    assert archive.mended and "1 completed run(s) it did not list" in archive.mended
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["run"] for r in records].count(last["run"]) == 1
    assert all(r["status"] == "ok" for r in records) and len(records) == 3
    assert ArchiveWriter.open(root).mended is None  # listed once: nothing to do again


def test_manifest_lines_that_are_not_records_do_not_stop_a_resume(tmp_path):
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]")
    root = run(cfg).root
    with open(root / "manifest.jsonl", "a") as fh:
        fh.write('[1, 2]\n"text"\n{"run": 3, "status": "ok"}\n')
        fh.write('{"run": "c/r9", "params": [1], "status": "ok", "attempt": "x", "repeat": 9}\n')
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run(cfg, ArchiveWriter.open(root))  # nothing to run again, and no internal error
    skipped = {str(w.message).split("manifest.jsonl:")[1] for w in said}
    assert skipped == {f"{n}: not a record: line skipped" for n in (3, 4)}
    results = pd.read_parquet(root / "results.parquet")
    assert (results["status"] == "ok").sum() == 2
    crafted = results[results["run"] == "c/r9"].iloc[0]
    assert crafted["status"] == "invalid" and crafted["attempt"] == "x"  # kept, as text
