"""The sweep runner driving a stand-in ``bmoe-cli`` on the local target: archived files,
retries, crashes, hangs past the timeout, output that is not UTF-8, quoting, Ctrl-C and a
sweep killed with SIGKILL then resumed."""

from __future__ import annotations

import csv
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

from bmoe.formats.metrics import read_metrics
from bmoe.formats.sidecar import PRESSURE_KEYS, read_pressure
from bmoe.sweep.archive import ArchiveWriter, load_results
from bmoe.sweep.config import load_config, resolved_toml
from bmoe.sweep.plan import make_plan
from bmoe.sweep.runner import run_sweep

pytestmark = pytest.mark.slow  # real engine processes, timeouts and kills

ROOT = Path(__file__).resolve().parents[2]
NASTY_PROMPT = 'it\'s a "test" with $HOME, `id`, \\back\\slash;\nand a second line\t|& done'


def make_sweep(tmp_path: Path, body: str, extra_base: str = "") -> Path:
    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF stand-in")
    text = f"""\
        [sweep]
        name = "t"
        engine = "native"
        output = "{tmp_path / "out"}"
        {body if "timeout_s" in body else body + chr(10) + "timeout_s = 30"}

        [base]
        model = "tiny.gguf"
        prompt = {json.dumps(NASTY_PROMPT)}
        n_predict = 6
        {extra_base}

        [[targets]]
        name = "here"
        binary = "{fake}"
        """
    return write_config(tmp_path, text)


def run(path: Path, **options) -> Path:
    config = load_config(path)
    plan = make_plan(config)
    archive = ArchiveWriter.create(
        Path(config.settings.output), config.settings.name, resolved_toml(config)
    )
    run_sweep(config, plan, archive, **options)
    return archive.root


def fake_argv(run_dir: Path) -> list[str]:
    line = next(
        ln for ln in (run_dir / "run.err").read_text().splitlines() if ln.startswith("FAKE_ARGV ")
    )
    return json.loads(line[len("FAKE_ARGV ") :])


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_grid_with_repeats_archives_valid_files(tmp_path, capsys):
    cfg = make_sweep(
        tmp_path,
        'repeats = 2\norder = "alternate"',
        "route_trace = true\n[grid]\ncache_mb = [0, 8]\nn_expert_used = [1, 2]",
    )
    root = run(cfg)
    lines = manifest(root)
    assert len(lines) == 8 and {r["status"] for r in lines} == {"ok"}
    assert sorted(r["order"] for r in lines) == list(range(8))
    results = load_results(root)
    assert len(results) == 8
    for record in lines:
        folder = root / record["dir"]
        assert folder.name == f"r{record['repeat']}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            metrics = read_metrics(folder / "run.csv")
        assert not metrics.partial and metrics.tokens == 6
        assert (folder / "run.route.csv").is_file()
        pressure = read_pressure(folder / "run.metrics")
        assert {"mem_avail_before_kb", "mem_avail_floor_kb", "mem_avail_after_kb"} <= set(
            pressure
        ) and set(pressure) <= set(PRESSURE_KEYS)
        out = (folder / "run.out").read_bytes()
        assert out.count(b"BMOE_PROGRESS ") == 6
        argv = fake_argv(folder)
        assert flag_value(argv, "-p") == NASTY_PROMPT
        assert flag_value(argv, "--cache-mb") == str(record["params"]["cache_mb"])
        assert flag_value(argv, "--csv") == "run.csv"
        # The summary figure against the CSV read independently: tokens / seconds.
        with open(folder / "run.csv") as fh:
            walls = [
                float(r["wall_ms"])
                for r in csv.DictReader(ln for ln in fh if not ln.startswith("#"))
            ]
        row = results[results["run"] == record["run"]].iloc[0]
        assert row["tok_s_mean"] == pytest.approx(1000 * len(walls) / sum(walls))
        assert row["cache_mb"] == record["params"]["cache_mb"]
        assert row["entry_mem_available_mb"] > 0
        assert row["target"] == "here"
        files = json.loads((folder / "record.json").read_text())["files"]
        assert {"run.csv", "run.out", "run.err", "run.log", "run.metrics"} <= set(files)
    assert set(results.attrs["axes"]) == {"cache_mb", "n_expert_used"}
    # No staging folders left behind.
    assert not list((root / "cells").glob("*/.*"))
    # The analysis of the folder, as JSON, and its plots.
    from bmoe.cli import main

    capsys.readouterr()
    assert main(["analyze", "sweep", str(root), "-f", "json", "--plots", str(tmp_path / "p")]) == 0
    views = json.loads(capsys.readouterr().out)
    ranked = views["ranking"]
    assert len(ranked) == 4 and all(row["n"] == 2 for row in ranked)
    best = ranked[0]
    assert (best["cache_mb"], best["n_expert_used"]) == (8, 1)  # the stand-in's fastest cell
    # the figure that answers the question: tok/s against one axis, a line per the other
    assert [p.name for p in (tmp_path / "p").iterdir()] == [
        "tok_s_mean-by-cache_mb-and-n_expert_used.png"
    ]


def test_crash_is_retried_then_the_sweep_goes_on(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    cfg = make_sweep(
        tmp_path,
        "retries = 1",
        f'fake_state = "{state}"\n[grid]\nfake_mode = ["crash-once", "crash", "ok"]',
    )
    root = run(cfg, keep_going=True)
    lines = manifest(root)
    by_mode: dict[str, list[str]] = {}
    for r in lines:
        by_mode.setdefault(r["params"]["fake_mode"], []).append(r["status"])
    assert by_mode == {"crash-once": ["crashed", "ok"], "crash": ["crashed", "crashed"],
                       "ok": ["ok"]}  # fmt: skip
    crashed = [r for r in lines if r["status"] == "crashed"]
    assert all(r["exit_code"] == 128 + signal.SIGSEGV for r in crashed)
    for r in crashed:
        folder = root / r["dir"]
        assert folder.name == f"r1.a{r['attempt']}.crashed"
        assert b"BMOE_PROGRESS" in (folder / "run.out").read_bytes()
    assert [r["attempt"] for r in lines if r["params"]["fake_mode"] == "crash"] == [1, 2]


def test_a_cell_that_fails_the_same_way_every_time_stops_the_sweep(tmp_path, capsys):
    from bmoe.cli import main

    state = tmp_path / "state"
    state.mkdir()
    cfg = make_sweep(
        tmp_path, "retries = 1",
        f'fake_state = "{state}"\n[grid]\nfake_mode = ["crash-once", "crash", "ok"]',
    )  # fmt: skip
    assert main(["sweep", str(cfg), "--plain"]) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "every attempt (2) failed the same way: crashed: engine exited with status" in err
    assert "--keep-going" in err
    # The first failure of each cell showed its run.err tail (once per cell).
    assert captured.out.count("run.err (last lines):") == 2
    root = sweep_folder(tmp_path / "out")
    modes = [(r["params"]["fake_mode"], r["status"]) for r in manifest(root)]
    assert modes == [
        ("crash-once", "crashed"),
        ("crash-once", "ok"),
        ("crash", "crashed"),
        ("crash", "crashed"),
    ]  # fmt: skip  (the ok cell never ran)
    assert len(pd.read_parquet(root / "results.parquet")) == 4
    assert (root / "summary.md").is_file()


def test_a_flag_the_engine_does_not_list_is_refused_before_any_run(tmp_path, capsys):
    from bmoe.cli import main

    cfg = make_sweep(tmp_path, "retries = 0", "[grid]\nio_thread = [1, 2]")
    assert main(["sweep", str(cfg), "--plain"]) == 2
    err = capsys.readouterr().err
    line = next(i for i, ln in enumerate(cfg.read_text().splitlines(), 1) if "io_thread" in ln)
    assert f"sweep.toml:{line}: grid.io_thread: --io-thread is not a flag of fake-bmoe-cli -h" in (
        " ".join(err.split())
    )
    assert "did you mean 'io_threads'?" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    # --dry-run checks the same way.
    assert main(["sweep", str(cfg), "--dry-run"]) == 2
    assert "did you mean 'io_threads'?" in capsys.readouterr().err


def test_flags_pass_through_when_the_engine_lists_none(tmp_path):
    cfg = make_sweep(tmp_path, "retries = 0", "fake_delay = 0.0\n[grid]\nbogus_flag = [3]")
    fake = tmp_path / "bin" / "fake-bmoe-cli"
    quiet = tmp_path / "bin" / "quiet-cli"  # an engine whose -h lists nothing
    quiet.write_text(
        f'#!/bin/sh\ncase "$1" in -h) echo "no help"; exit 1;; esac\nexec {fake} "$@"\n'
    )
    quiet.chmod(0o755)
    cfg.write_text(cfg.read_text().replace(f'binary = "{fake}"', f'binary = "{quiet}"'))
    root = run(cfg, keep_going=True)
    (record,) = manifest(root)
    assert record["status"] == "crashed" and record["exit_code"] == 2
    err = (root / record["dir"] / "run.err").read_text()
    assert "unknown argument: --bogus-flag" in err
    assert record["error"].endswith("error: unknown argument: --bogus-flag")  # the reason
    argv = json.loads((root / record["dir"] / "command.json").read_text())["argv"]
    assert flag_value(argv, "--fake-delay") == "0" and flag_value(argv, "--bogus-flag") == "3"


def _engine_processes(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and "fake-bmoe-cli" in cmd:
            pids.append(int(entry.name))
    return pids


def test_hang_past_the_timeout_is_stopped(tmp_path):
    cfg = make_sweep(tmp_path, "timeout_s = 2\nretries = 0", '[grid]\nfake_mode = ["hang", "ok"]')
    started = time.monotonic()
    root = run(cfg)
    assert time.monotonic() - started < 25
    lines = manifest(root)
    assert [(r["params"]["fake_mode"], r["status"]) for r in lines] == [
        ("hang", "timeout"), ("ok", "ok")]  # fmt: skip
    assert 2 <= lines[0]["duration_s"] < 15
    assert _engine_processes(str(tmp_path)) == []
    assert not (root / ".state" / "targets" / "here.pid").exists()


def test_output_that_is_not_utf8(tmp_path):
    cfg = make_sweep(tmp_path, "", '[grid]\nfake_mode = ["badutf8"]')
    root = run(cfg)
    (record,) = manifest(root)
    assert record["status"] == "ok"
    assert record["stream"]["tokens"] == 6
    out = (root / record["dir"] / "run.out").read_bytes()
    assert b'"delta_text":"\xe4\xb8"' in out  # kept byte for byte
    results = load_results(root)
    assert results["status"].tolist() == ["ok"]


def test_dry_run_prints_every_run_and_its_exact_command(tmp_path, capsys):
    from bmoe.cli import main

    cfg = make_sweep(tmp_path, "repeats = 2", "[grid]\ncache_mb = [0, 8]")
    assert main(["sweep", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    plan = make_plan(load_config(cfg))
    assert len(plan.runs) == 4
    for run_ in plan.runs:
        assert run_.id in out
    # Each printed command is one line that a shell parses back to the engine's argv with
    # the prompt (its newline and tab quoted, not printed raw).
    commands = [ln.strip() for ln in out.splitlines() if ln.startswith("      (cd ")]
    assert len(commands) == 4
    for command in commands:
        words = subprocess.run(
            ["bash", "-c", 'printf "%s\\0" ' + command[1:-1].split(" && ", 1)[1]],
            capture_output=True, check=True,
        ).stdout.split(b"\0")[:-1]  # fmt: skip
        argv = [w.decode() for w in words]
        assert flag_value(argv, "-p") == NASTY_PROMPT
        assert argv[-1] == "--progress"
    assert not (tmp_path / "out").exists()


def _sweep_process(cfg: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bmoe", "sweep", str(cfg), "--plain", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended early: {proc.stderr.read().decode()}")
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _ok_runs(root: Path) -> list[str]:
    return [r["run"] for r in manifest(root) if r["status"] == "ok"]


def test_sigkill_mid_cell_then_resume_loses_nothing_and_repeats_nothing(tmp_path):
    cfg = make_sweep(tmp_path, "repeats = 2",
                     "fake_delay = 0.08\n[grid]\ncache_mb = [0, 8]\nthreads = [1, 2]")  # fmt: skip
    out = tmp_path / "out"
    proc = _sweep_process(cfg)
    _wait_for(lambda: out.is_dir() and any(p.is_dir() for p in out.iterdir()), proc)
    root = sweep_folder(out)
    _wait_for(
        lambda: len(_ok_runs(root)) >= 2 and list((root / "cells").glob("*/.*.staging")), proc
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {r["run"]: r for r in manifest(root) if r["status"] == "ok"}
    started_before = {run: rec["started"] for run, rec in before.items()}
    assert 2 <= len(before) < 8

    proc = _sweep_process(cfg, "--resume")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()
    lines = manifest(root)
    ok = [r["run"] for r in lines if r["status"] == "ok"]
    plan = make_plan(load_config(cfg))
    assert sorted(ok) == sorted(r.id for r in plan.runs)  # every run once, none twice
    for run_id, started in started_before.items():
        record = json.loads((root / "cells" / run_id / "record.json").read_text())
        assert record["started"] == started  # completed before the kill: not run again
    killed = [r for r in lines if r["status"] == "killed"]
    assert len(killed) == 1 and (root / killed[0]["dir"]).is_dir()
    assert f"/r{killed[0]['repeat']}" in killed[0]["run"]
    from hostile_inputs import run_in_process

    report = run_in_process(["report", str(root), "-o", str(tmp_path / "r.html")])
    assert report.code == 0 and report.traceback is None, report.err
    assert not list((root / "cells").glob("*/.*.staging"))
    assert len(pd.read_parquet(root / "results.parquet")) == len(lines)
    assert b"already complete" in stdout
    # The killed runner's locks were taken over, and the resume said so.
    assert b"took over the lock of pid" in stderr and b"which ended without releasing" in stderr
    assert "cells ranked by tok_s_mean" in (root / "summary.md").read_text()
    assert _engine_processes(str(tmp_path)) == []


def test_ctrl_c_stops_the_engine_and_marks_the_run_interrupted(tmp_path):
    cfg = make_sweep(tmp_path, "", "fake_delay = 1.0\n[grid]\ncache_mb = [0, 8]")
    out = tmp_path / "out"
    proc = _sweep_process(cfg)
    _wait_for(lambda: out.is_dir() and any(p.is_dir() for p in out.iterdir()), proc)
    root = sweep_folder(out)
    _wait_for(lambda: any(p.is_file() for p in (root / ".state" / "targets").glob("*.pid")), proc)
    proc.send_signal(signal.SIGINT)
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    lines = manifest(root)
    assert [r["status"] for r in lines] == ["interrupted"]
    assert (root / lines[0]["dir"]).name == "r1.a1.interrupted"
    assert b"resume with" in stderr
    assert _engine_processes(str(tmp_path)) == []
    assert os.path.isfile(root / "results.parquet")


def test_resume_from_the_folder_runs_nothing_complete_again(tmp_path, capsys):
    from bmoe.cli import main

    cfg = make_sweep(tmp_path, "", "[grid]\ncache_mb = [0, 8]")
    assert main(["sweep", str(cfg), "--plain"]) == 0
    root = sweep_folder(tmp_path / "out")
    before = (root / "manifest.jsonl").read_bytes()
    assert main(["sweep", str(root), "--plain"]) == 0
    assert (root / "manifest.jsonl").read_bytes() == before
    assert not list(root.glob("sweep.*.toml"))  # the resolved config did not change
    assert "2/2 runs complete (2 from before), 0 failed" in capsys.readouterr().out
    # A changed configuration resumes too; the earlier one is kept beside it.
    cfg.write_text(cfg.read_text().replace("[0, 8]", "[0, 8, 16]"))
    assert main(["sweep", str(cfg), "--resume", "--plain"]) == 0
    assert len(manifest(root)) == 3 and (root / "sweep.1.toml").is_file()


def test_dry_run_names_the_folder_the_run_will_write(tmp_path, capsys):
    from bmoe.cli import main

    cfg = make_sweep(tmp_path, "", "[grid]\ncache_mb = [0, 8]")
    assert main(["sweep", str(cfg), "--plain"]) == 0
    first = sweep_folder(tmp_path / "out")
    capsys.readouterr()
    assert main(["sweep", str(cfg), "--dry-run"]) == 0
    out = "".join(capsys.readouterr().out.split())  # the console may wrap the long path
    assert f"folder{first}-2" in out
    assert main(["sweep", str(cfg), "--plain"]) == 0
    assert (tmp_path / "out" / f"{first.name}-2").is_dir()
