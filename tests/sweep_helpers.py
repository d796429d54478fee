"""Shared pieces of the sweep tests: the stand-in engine and configuration files."""

from __future__ import annotations

import json
import stat
import sys
import textwrap
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
