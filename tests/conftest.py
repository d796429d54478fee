"""Shared fixtures: the native engine's real files (read in place, never copied)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A kernel module not compiled ahead yet is built where it is first needed, as a user's first
# command would not (it runs numba's JIT and builds in the background): the tests of compiled
# code then run it, and no builder outlives the suite.
os.environ["BMOE_KERNEL_BUILD"] = "wait"
CORPUS = Path(os.environ.get("BMOE_CORPUS", ROOT.parent / "shared" / "corpus"))


@pytest.fixture(scope="session")
def corpus() -> Path:
    """``../shared/corpus`` (or $BMOE_CORPUS); tests using it skip when it is absent."""
    if not CORPUS.is_dir():
        pytest.skip(f"real telemetry corpus not found at {CORPUS} (set BMOE_CORPUS)")
    return CORPUS


@pytest.fixture(params=["whole", "streamed"])
def read_mode(request, monkeypatch) -> str:
    """Run a test with files read whole, and again with every file scanned and streamed
    (the path large files take), in tiny chunks so chunk boundaries fall everywhere."""
    if request.param == "streamed":
        from bmoe.formats import csvtable

        monkeypatch.setattr(csvtable, "STREAM_ABOVE", -1)
        monkeypatch.setattr(csvtable, "SCAN_HEAD", 4096)
        monkeypatch.setattr(csvtable, "SCAN_CHUNK", 13)
    return request.param


@pytest.fixture(scope="session")
def small_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The device profile of the archived small sweep (``bench-data/2026-11-29-small-traces``,
    its traced runs allowed), built once per session by ``bmoe profile``."""
    small = ROOT / "bench-data" / "2026-11-29-small-traces"
    if not small.is_dir():
        pytest.skip(f"bench-data small sweep absent ({small})")
    from bmoe.cli import main

    out = tmp_path_factory.mktemp("profile") / "small.json"
    assert main(["profile", str(small), "--allow-traced", "-o", str(out), "-f", "json"]) == 0
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic ``tiny`` qwen3moe GGUF (4 layers, 8 experts, top-2), made once per session."""
    pytest.importorskip("gguf", reason="the engine extra (gguf) is not installed")
    from bmoe.engine.synth import synth_model

    return synth_model(tmp_path_factory.mktemp("models") / "tiny.gguf", "tiny")


@pytest.fixture(scope="session")
def native_cli() -> Path:
    """The native ``bmoe-cli`` ($BMOE_NATIVE_CLI, else ``../shared/native/build.sh``'s); tests
    using it skip, naming both, when there is none."""
    from tests.native_build import native_cli_or_skip

    return native_cli_or_skip()
