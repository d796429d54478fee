"""A profile recorded while the machine is busy says so: a short embedded run (``bmoe run`` in
its own process) pinned to one core beside a spinning process pinned to the same core, at a
lower priority than the spinner (nice 10 against 0: about a tenth of the core), then
``bmoe profile`` of it marks the run starved of a core, takes compute from its CPU time, calls
the profile unsettled, and ``--strict`` refuses it. Pinning and priority make the starvation
the same on any machine: spinners spread over every core at equal priority left the engine
half a core or more (the scheduler favours a thread that has been waiting), not starved.

The model is a synthetic one with a few milliseconds of compute a token on one thread (the
``tiny`` preset's third of a millisecond is shorter than a scheduler's time slice, so the time
a spinner takes lands anywhere in a token), and a cache that holds every expert, so that the
run waits for a core, not for flash."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the engine extra) is not installed")

from bmoe.analyze.profile import build_profile, read_runs
from bmoe.cli import main
from bmoe.engine.synth import synth_model

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."


def _pinned(cpu: int, nice: int) -> Callable[[], None]:
    def setup() -> None:
        os.sched_setaffinity(0, {cpu})
        os.nice(nice)

    return setup


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
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
    cpu = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True:\n    pass"], preexec_fn=_pinned(cpu, 0)
    )
    try:
        time.sleep(0.3)  # the spinner has the core before the run starts
        run = subprocess.run(
            [sys.executable, "-c", "import sys; from bmoe.cli import main; sys.exit(main())",
             "run", "-m", str(model), "-p", PROMPT, "-n", "32", "-t", "1", "--moe-stream",
             "--cache-mb", "64", "--io-threads", "1", "--csv", str(csv)],
            preexec_fn=_pinned(cpu, 10), capture_output=True, timeout=300,
        )  # fmt: skip
    finally:
        _stop(spinner)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    runs = read_runs([csv])
    prof = build_profile(runs)
    state = prof.runs[0]
    # most of a token's wall time was neither the engine's CPU time nor a measured wait
    seen = {k: state[k] for k in ("tok_s", "cpu_share", "off_cpu_pct")}
    assert state["starved"] and state["off_cpu_pct"] > 50, seen
    assert "cpu_ms/threads" in prof.terms["compute"]["columns"]
    assert any("every run was contended" in u for u in prof.unsettled)
    assert main(["profile", str(csv)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "unsettled:" in err and "starved of a core" in err
    assert main(["profile", str(csv), "--strict"]) == 2
    assert "not settled (--strict)" in " ".join(capsys.readouterr().err.split())
