"""Sweeps of every kind on the real native ``bmoe-cli`` (a grid with repeats, a session sweep,
a paired axis, a sweep killed with SIGKILL and resumed), every file it writes read and validated
by bmoe. The stand-in engine of ``test_native.py`` covers the faults a real engine will not
produce on demand (crashes, hangs, bytes that are not UTF-8); these are the same runner against
the engine itself. They skip, naming where they looked, without a native build."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from sweep_helpers import manifest, sweep_folder, wait_for_a_run_in_flight, write_config

from bmoe.formats.metrics import read_metrics
from bmoe.formats.validate import validate_file
from bmoe.sweep.archive import load_results
from bmoe.sweep.config import load_config
from bmoe.sweep.plan import make_plan
from bmoe.sweep.sessions import split_turns

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]
#: As TOML writes it: quotes and a newline in the prompt.
PROMPT = r"Explain how a \"mixture\" of experts routes tokens.\nBriefly."


def _config(tmp_path: Path, native_cli: Path, model: Path, body: str, base: str = "") -> Path:
    prompt = "" if "prompt =" in base else f'prompt = "{PROMPT}"'
    return write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "real"
        engine = "native"
        output = "{tmp_path / "out"}"
        timeout_s = 120
        {body}

        [base]
        model = "{model}"
        {prompt}
        threads = 1
        moe_stream = true
        force_cache = true
        no_odirect = true
        {base}

        [[targets]]
        name = "here"
        binary = "{native_cli}"
        """,
    )


def _sweep(cfg: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg), "--plain", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(cfg: Path, *extra: str) -> Path:
    proc = _sweep(cfg, *extra)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode(errors="replace")
    return sweep_folder(cfg.parent / "out")


def _valid(path: Path) -> None:
    errors = [f for f in validate_file(path) if f.severity == "error"]
    assert not errors, (path, errors)


def test_a_grid_with_repeats_archives_files_bmoe_reads_and_validates(
    tmp_path, native_cli, tiny_model
) -> None:
    cfg = _config(
        tmp_path,
        native_cli,
        tiny_model,
        'repeats = 2\norder = "alternate"',
        "n_predict = 6\nroute_trace = true\nio_trace = true\n[grid]\ncache_mb = [2, 64]",
    )
    root = _finish(cfg)
    lines = manifest(root)
    assert len(lines) == 4 and {r["status"] for r in lines} == {"ok"}
    for record in lines:
        folder = root / record["dir"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run = read_metrics(folder / "run.csv")
        assert run.engine == "0.19.0" and not run.partial and run.tokens == 6
        assert run.params["cache_mb"] == record["params"]["cache_mb"]
        for name in ("run.csv", "run.route.csv", "run.io.csv", "run.out", "run.metrics"):
            _valid(folder / name)
        assert (folder / "run.out").read_bytes().count(b"BMOE_PROGRESS ") == 6
    results = load_results(root)
    assert len(results) == 4 and results["tok_s_mean"].gt(0).all()
    by_cache = results.groupby("cache_mb")["cache_hit_pct"].mean()
    assert by_cache[64] > by_cache[2]  # the budget is what the engine ran with


def test_a_session_sweep_serves_the_prompts_as_turns_of_one_engine(
    tmp_path, native_cli, tiny_model
) -> None:
    prompts = json.dumps(["first", 'a "quoted"\nprompt $HOME', "third"])
    cfg = _config(
        tmp_path,
        native_cli,
        tiny_model,
        "session = true",
        f"n_predict = 4\ncache_mb = 4\nroute_trace = true\n[grid]\nprompt = {prompts}",
    )
    root = _finish(cfg)
    lines = manifest(root)
    assert len(lines) == 3 and {r["status"] for r in lines} == {"ok"}
    (session,) = (root / "sessions").iterdir()
    _valid(session / "run.csv")
    _valid(session / "run.route.csv")
    turns = split_turns(session / "run.csv")
    # the quoted prompt ends at an end-of-generation token after 2: a turn that finished
    assert [t.tokens for t in turns] == [2, 4, 4]
    assert [t.summaries[0]["tokens"] for t in turns] == [2, 4, 4]
    assert all(r["session"].startswith("sessions/") for r in lines)
    for record in lines:
        _valid(root / record["dir"] / "run.csv")
    assert load_results(root)["tok_s_mean"].gt(0).all()


def test_a_paired_axis_runs_back_to_back_alternating(tmp_path, native_cli, tiny_model) -> None:
    cfg = _config(
        tmp_path,
        native_cli,
        tiny_model,
        'repeats = 2\norder = "alternate"\n[pair]\naxis = "prefetch"',
        "n_predict = 6\ncache_mb = 4\n[grid]\nprefetch = [0, 1]",
    )
    root = _finish(cfg)
    lines = sorted(manifest(root), key=lambda r: r["order"])
    assert {r["status"] for r in lines} == {"ok"}
    assert [r["params"]["prefetch"] for r in lines] == [0, 1, 1, 0]  # AB, then BA
    for record in lines:
        run = read_metrics(root / record["dir"] / "run.csv")
        assert run.params["prefetch"] == record["params"]["prefetch"]
        _valid(root / record["dir"] / "run.csv")


def test_sigkill_mid_run_then_resume(tmp_path, native_cli, tiny_model) -> None:
    cfg = _config(
        tmp_path,
        native_cli,
        tiny_model,
        "",
        "n_predict = 600\ncache_mb = 2\n[grid]\nio_threads = [1, 2, 3, 4]",
    )
    proc = _sweep(cfg)
    out = tmp_path / "out"
    root = wait_for_a_run_in_flight(proc, out, timeout_s=300, poll_s=0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {r["run"]: r["started"] for r in manifest(root) if r["status"] == "ok"}
    assert 1 <= len(done_before) < 4
    root = _finish(cfg, "--resume")
    lines = manifest(root)
    ok = sorted(r["run"] for r in lines if r["status"] == "ok")
    assert ok == sorted(r.id for r in make_plan(load_config(cfg)).runs)  # each once
    for run_id, started in done_before.items():
        record = json.loads((root / "cells" / run_id / "record.json").read_text())
        assert record["started"] == started  # completed before the kill: not run again
    assert [r["status"] for r in lines].count("killed") == 1
    for record in lines:
        if record["status"] == "ok":
            _valid(root / record["dir"] / "run.csv")
