"""How the tests find a native ``bmoe-cli`` (tests/native_build.py) and what they say when
there is none: each way of not finding one gives its own reason, and the tests that pair with
the native engine skip with it rather than fail or pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import native_build

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def find(monkeypatch, tmp_path):
    """find_native without its cache, with a build script of the test's own (absent by
    default) and no BMOE_NATIVE_CLI."""
    monkeypatch.delenv("BMOE_NATIVE_CLI", raising=False)
    monkeypatch.setattr(native_build, "BUILD_SCRIPT", tmp_path / "build.sh")
    monkeypatch.setattr(native_build, "BUILD_WAIT_S", 5.0)
    return native_build.find_native.__wrapped__


def _executable(path: Path, body: str = "exit 0") -> Path:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


def test_the_variable_wins_and_set_empty_means_none(find, monkeypatch, tmp_path) -> None:
    cli = _executable(tmp_path / "bmoe-cli")
    _executable(tmp_path / "build.sh", f"echo {tmp_path / 'other'}")
    monkeypatch.setenv("BMOE_NATIVE_CLI", str(cli))
    assert find() == (cli, f"BMOE_NATIVE_CLI={cli}")
    monkeypatch.setenv("BMOE_NATIVE_CLI", "")
    path, why = find()
    assert path is None and "set and empty" in why
    monkeypatch.setenv("BMOE_NATIVE_CLI", str(tmp_path / "missing"))
    path, why = find()
    assert path is None and f"{tmp_path / 'missing'} is not an executable file" in why


def test_the_build_script_reports_the_binary(find, tmp_path) -> None:
    cli = _executable(tmp_path / "bmoe-cli")
    _executable(tmp_path / "build.sh", f"echo building >&2; echo noise; echo {cli}")
    assert find() == (cli, f"bash {tmp_path / 'build.sh'}")


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (None, "BMOE_NATIVE_CLI is not set and {build} does not exist"),
        ("echo 'cmake: not found' >&2; exit 2", "failed (status 2): cmake: not found"),
        ("echo /nonexistent/bmoe-cli", "reported /nonexistent/bmoe-cli, which is not an exec"),
        ("sleep 30", "did not report a build within 5 s"),
    ],
)
def test_each_way_of_having_none_says_why(find, tmp_path, script, reason) -> None:
    build = tmp_path / "build.sh"
    if script is not None:
        _executable(build, script)
    path, why = find()
    assert path is None
    assert reason.format(build=build) in why


@pytest.mark.slow
def test_the_paired_tests_skip_naming_where_they_looked(tmp_path) -> None:
    """With BMOE_NATIVE_CLI set and empty, the identity checks and the native sweeps skip, and
    the skip says why and how to get a build."""
    env = {**os.environ, "BMOE_NATIVE_CLI": ""}
    tests = [
        "tests/engine/test_native_identity.py::test_the_architectures_the_native_engine_streams",
        "tests/sweep/test_native_engine.py",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-2000:]
    assert " passed" not in out and "failed" not in out
    skips = [ln for ln in out.splitlines() if ln.startswith("SKIPPED")]
    assert len(skips) >= 2
    for line in skips:
        assert "no native bmoe-cli: BMOE_NATIVE_CLI is set and empty" in line, line
        assert "set BMOE_NATIVE_CLI or build ../shared/native" in line, line
