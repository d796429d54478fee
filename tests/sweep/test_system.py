"""System checks (governor, load, CPU caps, the engine's CPU share, temperature) recorded per
run and warned about, and the machine metadata in every record and results row."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from sweep_helpers import install_fake_cli, manifest, write_config

import bmoe
from bmoe.formats.metrics import read_metrics
from bmoe.sweep.archive import ArchiveWriter, load_results
from bmoe.sweep.config import load_config, resolved_toml
from bmoe.sweep.gate import STATE_SCRIPT, EntryState, parse_entry_state
from bmoe.sweep.plan import make_plan
from bmoe.sweep.runner import run_sweep
from bmoe.sweep.system import system_warnings

STATE = """\
cpu_mC=45000
avail_kb=2048000
policy0=1800000
gov_policy0=schedutil
hwmax_policy0=1800000
policy4=1200000
gov_policy4=performance
hwmax_policy4=2400000
load1=3.50
runnable=4
ncpu=8
"""


def test_the_entry_state_reads_governor_caps_load_and_cpus():
    state = parse_entry_state(STATE)
    assert state.governor == {"policy0": "schedutil", "policy4": "performance"}
    assert state.hardware_max_freq_khz == {"policy0": 1800000, "policy4": 2400000}
    assert (state.load_1m, state.busy_tasks, state.cpus) == (3.5, 3, 8)  # not the probe
    columns = state.columns()
    assert columns["entry_governor"] == "performance,schedutil"
    assert (columns["entry_load_1m"], columns["entry_busy_tasks"], columns["entry_cpus"]) == (
        3.5, 3, 8)  # fmt: skip
    # The probe itself, here: this machine's load and CPU count.
    out = subprocess.run(["sh", "-c", STATE_SCRIPT], capture_output=True, text=True).stdout
    here = parse_entry_state(out)
    assert here.cpus == os.cpu_count()
    assert here.load_1m == pytest.approx(os.getloadavg()[0], abs=2.0)
    assert here.busy_tasks is not None and here.busy_tasks >= 0


def test_warnings_name_what_makes_a_run_unreliable():
    state = parse_entry_state(STATE)
    warnings = system_warnings(state, cpu_share=0.17, cpu_temp_max_c=86.0)
    text = "\n".join(warnings)
    assert "CPU governor schedutil (not performance)" in text
    assert "capped below the hardware maximum (policy4)" in text
    assert "other tasks" not in text  # 3 others on 8 CPUs: below half of them
    assert "the engine got 17% of a CPU" in text
    assert "CPU reached 86 °C" in text
    busy = parse_entry_state("load1=9.8\nrunnable=4\nncpu=2\n")
    assert system_warnings(busy, 1.0, 40.0) == [
        "3 other tasks were running on 2 CPUs before the run: other work competes for the CPUs"
    ]
    calm = parse_entry_state("load1=9.8\nrunnable=2\nncpu=2\n")  # a high load from our own last run
    assert system_warnings(calm, 1.0, 40.0) == []
    quiet = EntryState(governor={"policy0": "performance"}, load_1m=0.1, busy_tasks=0, cpus=4)
    assert system_warnings(quiet, cpu_share=0.98, cpu_temp_max_c=50.0) == []
    assert system_warnings(EntryState(), None, None) == []  # nothing read, nothing said


class _Messages:
    def __init__(self):
        self.lines = []

    def message(self, text):
        self.lines.append(text)

    def __getattr__(self, name):
        return lambda *a, **k: None


def test_every_record_carries_the_machine_and_its_system_state(tmp_path):
    fake = install_fake_cli(tmp_path / "bin")
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF stand-in " * 100)
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "t"
        output = "{tmp_path / "out"}"
        timeout_s = 30
        repeats = 2
        [base]
        model = "tiny.gguf"
        n_predict = 4
        [grid]
        cache_mb = [0, 8]
        [[targets]]
        name = "here"
        binary = "{fake}"
        """,
    )
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "sweep.toml"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "sweep"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    config = load_config(cfg)
    archive = ArchiveWriter.create(tmp_path / "out", "t", resolved_toml(config))
    sink = _Messages()
    run_sweep(config, make_plan(config), archive, sink=sink)

    lines = manifest(archive.root)
    assert len(lines) == 4
    kernel = os.uname().release
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    for record in lines:
        assert record["machine"]["kernel"] == kernel
        assert record["machine"]["engine_build"] == "fake-bmoe-cli 0.1 (build stand-in)"
        assert record["model_sha256"] == digest
        assert record["bmoe_version"] == bmoe.__version__
        # The output folder is untracked inside the repository: the commit says +dirty.
        assert record["config_commit"] == head.stdout.strip() + "+dirty"
        rows = read_metrics(archive.root / record["dir"] / "run.csv").rows
        share = rows["cpu_ms"].sum() / rows["wall_ms"].sum()
        assert record["engine_cpu_share"] == pytest.approx(share, abs=1e-3)
        # The stand-in spends 2 ms of CPU per token of 5 ms (cache_mb 0) or 3 ms (cache_mb 8).
        warned = any("of a CPU" in w for w in record["system_warnings"])
        assert warned == (share < 0.5) and warned == (record["params"]["cache_mb"] == 0)
        assert "entry_load_1m" in record["entry_columns"]
    # Each kind of warning is shown once, not once per run.
    shown = [m for m in sink.lines if "of a CPU" in m]
    assert len(shown) == 1 and "(results may vary)" in shown[0]
    results = load_results(archive.root)
    assert set(results["model_sha256"]) == {digest}
    assert set(results["machine_kernel"]) == {kernel}
    assert results["engine_cpu_share"].between(0.3, 0.7).all()
    low = results["engine_cpu_share"] < 0.5
    assert (results["system_warnings"].fillna("").str.contains("of a CPU") == low).all()
    if Path("/proc/cpuinfo").is_file():
        model_line = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                           if ln.startswith("model name")), None)  # fmt: skip
        if model_line:
            assert set(results["machine_cpu_model"]) == {model_line.split(":", 1)[1].strip()}
