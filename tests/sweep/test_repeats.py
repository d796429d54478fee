"""Adaptive repeats (``repeats = "auto"``) and warm-up runs, on the stand-in engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sweep_helpers import install_fake_cli, manifest, write_config

from bmoe.sweep.adaptive import cells_needing_more, mean_intervals, t95
from bmoe.sweep.archive import ArchiveWriter, load_results
from bmoe.sweep.config import ConfigError, load_config, parse_config, resolved_toml
from bmoe.sweep.plan import make_plan
from bmoe.sweep.runner import run_sweep


def make_sweep(tmp_path, sweep: str, grid: str):
    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF stand-in")
    return write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "t"
        engine = "native"
        output = "{tmp_path / "out"}"
        timeout_s = 30
        {sweep}

        [base]
        model = "tiny.gguf"
        n_predict = 3

        [grid]
        {grid}

        [[targets]]
        name = "here"
        binary = "{fake}"
        """,
    )


def run(cfg):
    config = load_config(cfg)
    archive = ArchiveWriter.create(Path(config.settings.output), "t", resolved_toml(config))
    outcome = run_sweep(config, make_plan(config), archive)
    return archive.root, outcome


def test_auto_repeats_stop_when_the_mean_is_settled_or_at_the_bound(tmp_path):
    cfg = make_sweep(
        tmp_path,
        'repeats = "auto"\nmin_repeats = 3\nmax_repeats = 5\ntarget_interval = 0.001',
        "fake_jitter = [0.0, 0.8]",
    )
    root, outcome = run(cfg)
    lines = manifest(root)
    by_cell: dict[str, list[int]] = {}
    for r in lines:
        assert r["status"] == "ok"
        by_cell.setdefault(r["params"]["fake_jitter"], []).append(r["repeat"])
    assert by_cell[0.0] == [1, 2, 3]  # identical runs: settled after min_repeats
    assert by_cell[0.8] == [1, 2, 3, 4, 5]  # noisy runs: up to max_repeats, no further
    assert outcome.total == 8 and outcome.completed == 8 and outcome.not_run == 0
    results = load_results(root)
    assert len(results) == 8
    intervals = mean_intervals(results).set_index("cell")
    noisy = results[results["fake_jitter"] == 0.8]["cell"].iloc[0]
    assert intervals.loc[noisy, "relative"] > 0.001


def test_warmup_runs_are_archived_and_left_out_of_the_results(tmp_path):
    cfg = make_sweep(tmp_path, "repeats = 2\nwarmup = 1", "cache_mb = [0, 8]")
    root, outcome = run(cfg)
    lines = manifest(root)
    warm = [r for r in lines if r.get("warmup")]
    assert len(warm) == 2 and {r["run"].split("/")[1] for r in warm} == {"w1"}
    for record in warm:
        assert (root / record["dir"] / "run.csv").is_file()
    # Each cell's warm-up comes right before its first measured run.
    order = [r["run"] for r in lines]
    for record in warm:
        cell = record["cell"]
        assert order.index(f"{cell}/w1") + 1 == order.index(f"{cell}/r1")
    results = load_results(root)
    assert len(results) == 4 and not results["run"].str.contains("/w").any()
    assert outcome.completed == 6


def test_resume_does_not_run_a_completed_warmup_again(tmp_path):
    cfg = make_sweep(tmp_path, "warmup = 2", "cache_mb = [0]")
    root, _ = run(cfg)
    before = len(manifest(root))
    config = load_config(cfg)
    outcome = run_sweep(config, make_plan(config), ArchiveWriter.open(root))
    assert len(manifest(root)) == before == 3 and outcome.skipped == 3


def test_interval_of_the_mean():
    # Student's t at 1, 2, 30, 31 and 1000 degrees of freedom (printed tables' values), and the
    # normal's 1.95996 in the limit: beyond 30 the quantile keeps falling, not a step to 1.96.
    got = t95(np.array([1, 2, 30, 31, 1000]))
    assert got == pytest.approx([12.706, 4.303, 2.042, 2.040, 1.962], abs=5e-4)
    assert got[3] > got[4] > 1.95996
    results = pd.DataFrame({
        "cell": ["a"] * 4 + ["b"] * 3 + ["c"],
        "status": ["ok"] * 7 + ["ok"],
        "tok_s_mean": [10.0, 10.0, 10.0, 10.0, 8.0, 10.0, 12.0, 5.0],
    })  # fmt: skip
    table = mean_intervals(results).set_index("cell")
    assert table.loc["a", "relative"] == 0
    # b: mean 10, sd 2, n 3: t(2) * 2 / sqrt(3) / 10
    assert table.loc["b", "relative"] == pytest.approx(4.303 * 2 / np.sqrt(3) / 10, rel=2e-4)
    assert np.isnan(table.loc["c", "relative"])
    assert cells_needing_more(results, ["a", "b", "c", "d"], 0.05) == ["b", "c", "d"]


BASE = '[sweep]\nname = "t"\n{}\n[base]\nmodel = "m"\n'


@pytest.mark.parametrize(
    ("sweep", "key", "says"),
    [
        ('repeats = "many"', "sweep.repeats", '"auto"'),
        ("min_repeats = 3", "sweep.min_repeats", 'only applies to repeats = "auto"'),
        ('repeats = "auto"\nmin_repeats = 1', "sweep.min_repeats", "at least 2"),
        ('repeats = "auto"\nmin_repeats = 4\nmax_repeats = 3', "sweep.max_repeats",
         "at least 4"),
        ('repeats = "auto"\ntarget_interval = 1.5', "sweep.target_interval", "below 1"),
        ('repeats = "auto"\ntarget_interval = 0', "sweep.target_interval", "greater than 0"),
        ("warmup = -1", "sweep.warmup", "at least 0"),
        ('warmup = 1\nsession = true', "sweep.warmup", "session mode"),
    ],
)  # fmt: skip
def test_repeat_keys_are_checked(sweep, key, says):
    with pytest.raises(ConfigError) as info:
        make_plan(parse_config(BASE.format(sweep), "cfg.toml", base_dir="/"))
    assert info.value.key == key and says in info.value.problem, str(info.value)


def test_auto_repeats_survive_the_archived_config():
    text = BASE.format('repeats = "auto"\nmax_repeats = 7\ntarget_interval = 0.02\nwarmup = 2')
    cfg = parse_config(text, "cfg.toml", base_dir="/")
    again = parse_config(resolved_toml(cfg), "sweep.toml", base_dir="/").settings
    assert (again.adaptive, again.repeats, again.max_repeats, again.target_interval,
            again.warmup) == (True, 3, 7, 0.02, 2)  # fmt: skip
    assert len(make_plan(cfg).runs) == 3 + 2  # the first rounds and the warm-ups
