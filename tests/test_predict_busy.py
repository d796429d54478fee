"""A profile recorded while the machine is busy says so: a short embedded run with spinning
processes taking every core (eight a core, for a few seconds: with one or three a core the
engine still got a third to a half of a core on this shared machine, not starved), then
``bmoe profile`` of it marks the run starved of a core, takes compute from its CPU time, calls
the profile unsettled, and ``--strict`` refuses it.

The model is a synthetic one with a few milliseconds of compute a token on one thread (the
``tiny`` preset's third of a millisecond is shorter than a scheduler's time slice, so the time
a spinner takes lands anywhere in a token), and a cache that holds every expert, so that the
run waits for a core, not for flash."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.analyze.profile import build_profile, read_runs
from bmoe.cli import main
from bmoe.engine.embedded.config import EngineConfig
from bmoe.engine.embedded.run import run_engine
from bmoe.engine.synth import synth_model

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _spinners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_run_on_a_busy_machine_is_starved_unsettled_and_refused_under_strict(
    tmp_path: Path, capsys
) -> None:
    model = synth_model(
        tmp_path / "mid.gguf",
        "tiny",
        n_embd=512,
        n_ff_exp=1024,
        experts=4,
        n_head=8,
        head_dim=64,
        n_head_kv=4,
        n_ff_shexp=512,
        type="f16",
    )  # fmt: skip  (55 MiB; ~3 ms of compute a token on one thread)
    csv = tmp_path / "busy.csv"
    cfg = EngineConfig(
        model=str(model), prompt=PROMPT, n_predict=32, threads=1, moe_stream=True,
        cache_mb=64, io_threads=1, csv=str(csv),
    )  # fmt: skip
    procs = _spinners(8 * (os.cpu_count() or 2))
    try:
        time.sleep(0.5)  # the spinners have the cores before the run starts
        run_engine(cfg)
    finally:
        _stop(procs)
    runs = read_runs([csv])
    prof = build_profile(runs)
    state = prof.runs[0]
    # most of a token's wall time was neither the engine's CPU time nor a measured wait
    assert state["starved"] and state["off_cpu_pct"] > 50, state
    assert "cpu_ms/threads" in prof.terms["compute"]["columns"]
    assert any("every run was starved of a core" in u for u in prof.unsettled)
    assert main(["profile", str(csv)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "unsettled:" in err and "starved of a core" in err
    assert main(["profile", str(csv), "--strict"]) == 2
    assert "not settled (--strict)" in " ".join(capsys.readouterr().err.split())
