"""End to end on the embedded engine (``bmoe run`` as a subprocess) with a generated tiny
model: a 2x2 grid with repeats archives valid files, and a sweep killed with SIGKILL in the
middle of a run resumes and completes with no completed run lost or run twice."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from sweep_helpers import manifest, sweep_folder, wait_for_a_run_in_flight, write_config

from bmoe.formats.metrics import read_metrics
from bmoe.sweep.archive import load_results
from bmoe.sweep.config import load_config
from bmoe.sweep.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]


def _engine_missing() -> str | None:
    for module in ("bmoe.engine.synth", "bmoe.engine.embedded.run", "llama_cpp"):
        try:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not available (the embedded engine has not landed)"
        except ModuleNotFoundError:
            return f"{module} is not available (the embedded engine has not landed)"
    return None


pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(_engine_missing() is not None, reason=str(_engine_missing())),
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from bmoe.engine.synth import synth_model

    return Path(synth_model(tmp_path_factory.mktemp("model") / "tiny.gguf", preset="tiny"))


def _config(tmp_path: Path, model: Path, n_predict: int, repeats: int = 2) -> Path:
    return write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "emb"
        engine = "embedded"
        repeats = {repeats}
        order = "alternate"
        output = "{tmp_path / "out"}"
        timeout_s = 300

        [base]
        model = "{model}"
        prompt = "Explain how a \\"mixture\\" of experts routes tokens.\\nBriefly."
        n_predict = {n_predict}
        threads = 1
        moe_stream = true
        route_trace = true

        [grid]
        cache_mb = [0, 2]
        io_threads = [1, 2]
        """,
    )


def _sweep(cfg: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg), "--plain", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_grid_with_repeats_archives_valid_files(tmp_path, tiny_model):
    cfg = _config(tmp_path, tiny_model, 8)
    proc = _sweep(cfg)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()
    root = sweep_folder(tmp_path / "out")
    lines = manifest(root)
    assert len(lines) == 8 and {r["status"] for r in lines} == {"ok"}
    for record in lines:
        folder = root / record["dir"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run = read_metrics(folder / "run.csv")
        assert not run.partial and run.tokens == 8
        assert run.params.get("cache_mb") == record["params"]["cache_mb"]
        assert (folder / "run.route.csv").stat().st_size > 0
        assert (folder / "run.metrics").is_file()
        assert b"BMOE_PROGRESS " in (folder / "run.out").read_bytes()
    results = load_results(root)
    assert len(results) == 8 and results["tok_s_mean"].gt(0).all()
    assert (root / "summary.md").read_text().count("cache_mb") >= 1


def test_sigkill_mid_run_then_resume(tmp_path, tiny_model):
    cfg = _config(tmp_path, tiny_model, 48, repeats=1)
    proc = _sweep(cfg)
    out = tmp_path / "out"
    root = wait_for_a_run_in_flight(proc, out, timeout_s=300)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {r["run"]: r["started"] for r in manifest(root) if r["status"] == "ok"}
    assert 1 <= len(done_before) < 4

    proc = _sweep(cfg, "--resume")
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()
    lines = manifest(root)
    ok = sorted(r["run"] for r in lines if r["status"] == "ok")
    assert ok == sorted(r.id for r in make_plan(load_config(cfg)).runs)
    for run_id, started in done_before.items():
        record = json.loads((root / "cells" / run_id / "record.json").read_text())
        assert record["started"] == started
    assert [r["status"] for r in lines].count("killed") == 1
