"""Shared pieces of the sweep tests: the stand-in engine, configuration files and the
moment to kill a sweep."""

from __future__ import annotations

import json
import stat
import sys
import textwrap
import time
from pathlib import Path

STAND_INS = Path(__file__).parent / "stand_ins"


def install_fake_cli(folder: Path, name: str = "fake-bmoe-cli") -> Path:
    """The stand-in ``bmoe-cli`` as an executable in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\n" + (STAND_INS / "bmoe_cli.py").read_text())
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def write_config(folder: Path, body: str, name: str = "sweep.toml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def manifest(root: Path) -> list[dict]:
    path = root / "manifest.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sweep_folder(output: Path) -> Path:
    folders = [p for p in output.iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def wait_for_a_run_in_flight(
    proc, out: Path, done: int = 1, timeout_s: float = 300, poll_s: float = 0.05
) -> Path:
    """The sweep folder under `out` once `done` runs are complete and another is staged (the
    moment a kill cuts a run short); fails the test if `proc` ends first."""
    import pytest

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before it could be killed: {proc.stderr.read()!r}")
        if out.is_dir() and any(p.is_dir() for p in out.iterdir()):
            root = sweep_folder(out)
            ok = [r for r in manifest(root) if r["status"] == "ok"]
            if len(ok) >= done and list((root / "cells").glob("*/.*.staging")):
                return root
        time.sleep(poll_s)
    pytest.fail(f"no run was in flight under {out} within {timeout_s:g} s")
