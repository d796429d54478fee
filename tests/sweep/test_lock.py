"""The sweep lock lives where every runner of a sweep looks (the output folder and the sweep
folder), and a live holder is never taken over: not by a runner with another $TMPDIR, not
after its lock files were deleted, not on another host while its heartbeat goes on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_helpers import manifest, sweep_folder

from bmoe.sweep import lock as lockmod
from bmoe.sweep.lock import SweepBusy, folder_lock, name_lock
from tests.sweep.test_integrity import _wait_for, make_sweep

ROOT = Path(__file__).resolve().parents[2]


def _sweep(cfg: Path, tmpdir: Path, *extra: str) -> subprocess.Popen:
    tmpdir.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg), "--plain", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir)},
    )  # fmt: skip


def test_a_live_runner_is_never_taken_over(tmp_path):
    """The scenario: a second runner with another $TMPDIR, the sweep folder's .lock deleted,
    resumes the folder in use; then the output's lock deleted too."""
    cfg = make_sweep(tmp_path, "cache_mb = [0, 8]", base='fake_mode = "hang"')
    out = tmp_path / "out"
    first = _sweep(cfg, tmp_path / "tmp-a")
    try:
        _wait_for(lambda: out.is_dir() and any(p.is_dir() for p in out.iterdir()))
        root = sweep_folder(out)
        _wait_for(lambda: list((root / "cells").glob("*/.*.staging")))
        assert (out / ".t.lock").is_file()  # in the output folder, not in $TMPDIR
        (root / ".lock").unlink()
        for args in ((root,), (cfg, "--resume")):
            second = _sweep(args[0], tmp_path / "tmp-b", *args[1:])
            _out, err = second.communicate(timeout=60)
            text = err.decode()
            assert second.returncode == 2, text
            assert f"in use by pid {first.pid}" in text and "Traceback" not in text
        (out / ".t.lock").unlink()  # both lock files gone: the folder's record still says
        second = _sweep(root, tmp_path / "tmp-b")
        _out, err = second.communicate(timeout=60)
        assert second.returncode == 2 and f"pid {first.pid}" in err.decode(), err.decode()
        assert "runner.json" in err.decode()
        assert first.poll() is None  # the first runner runs on, its attempt untouched
        assert list((root / "cells").glob("*/.*.staging"))
        first.send_signal(signal.SIGINT)
        _out, err = first.communicate(timeout=60)
        assert first.returncode == 130, err.decode()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert [r["status"] for r in manifest(root)] == ["interrupted"]
    assert not (root / ".state" / "runner.json").exists()  # released: no record left


def _holder(**fields) -> dict:
    return {"pid": 4242, "host": "elsewhere", "command": "bmoe sweep x", **fields}


def _witness(folder: Path, record: dict) -> None:
    path = folder / ".state" / "runner.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_another_host_holds_while_its_heartbeat_is_fresh(tmp_path):
    _witness(tmp_path, _holder(heartbeat=time.time()))
    with pytest.raises(SweepBusy, match="pid 4242 on host elsewhere"):
        folder_lock(tmp_path).acquire()
    _witness(tmp_path, _holder(heartbeat=time.time() - lockmod.STALE_S - 5))
    with folder_lock(tmp_path):  # its heartbeat stopped a while ago: gone
        record = json.loads((tmp_path / ".state" / "runner.json").read_text())
        assert record["pid"] == os.getpid() and record["heartbeat"] > time.time() - 60


def test_a_pid_reused_by_another_process_is_not_the_holder(tmp_path):
    me = os.getppid()  # alive, but started at another time than the record says
    started = lockmod._start_ticks(me)
    if started is None:
        pytest.skip("no /proc here")
    _witness(tmp_path, _holder(pid=me, host=socket.gethostname(), pid_start=started + 1))
    with folder_lock(tmp_path):
        pass
    _witness(tmp_path, _holder(pid=me, host=socket.gethostname(), pid_start=started))
    with pytest.raises(SweepBusy, match=f"pid {me}"):
        folder_lock(tmp_path).acquire()


def test_the_holder_beats_and_the_name_lock_is_in_the_output(tmp_path, monkeypatch):
    monkeypatch.setattr(lockmod, "HEARTBEAT_S", 0.05)
    out = tmp_path / "no" / "such" / "output"

    def beat(path: Path) -> float:
        try:
            return json.loads(path.read_text())["heartbeat"]
        except (ValueError, KeyError):  # read while it was rewritten
            return 0.0

    with name_lock(out, "s") as held:
        assert held.path == out / ".s.lock"
        first = beat(held.path)
        assert first > 0
        _wait_for(lambda: beat(held.path) > first, 10)
    assert not held.path.exists()  # released: the output holds sweep folders only
