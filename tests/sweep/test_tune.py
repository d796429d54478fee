"""``bmoe tune``: the configuration, the decisions, and whole tunes on the embedded engine.

The decision layer is checked on hand-made tables (what it must choose follows from the
rules in :mod:`bmoe.analyze.tune`, worked out here); whole tunes run the generated tiny model:
the recommendation never breaks a constraint, the budget holds, a SIGKILL loses no finished
run and repeats none.
"""

from __future__ import annotations

import importlib.util
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sweep_helpers import manifest, sweep_folder, wait_for_a_run_in_flight, write_config

from bmoe.analyze.tune import (
    CHEAPER_RULE,
    Constraint,
    cost_key,
    decide,
    estimates,
    excluded_by_fidelity,
    measured_cells,
    ratio_at,
    recommend,
    t_at,
)
from bmoe.analyze.verdict import ratio_interval
from bmoe.engine.synth import ARCHS
from bmoe.errors import BmoeError
from bmoe.sweep.config import parse_config
from bmoe.sweep.plan import expand
from bmoe.sweep.tune_config import load_tune_config, parse_tune_config

ROOT = Path(__file__).resolve().parents[2]

BASE = """
[sweep]
name = "t"
engine = "{engine}"

[base]
model = "m.gguf"
n_predict = {n}
moe_stream = true

[grid]
cache_mb = [1, 2]
"""


def _parse(tune: str, engine: str = "embedded", n: int = 64, grid: str = ""):
    return parse_tune_config(
        BASE.format(engine=engine, n=n) + grid + "\n[tune]\n" + tune, "tune.toml"
    )


# ----------------------------------------------------------------------------- configuration


def test_an_objective_the_engine_cannot_produce_is_refused() -> None:
    with pytest.raises(BmoeError, match=r"tune.toml:\d+: tune.objective: 'tok_per_joule'"):
        _parse('objective = "tok_per_joule"')
    # a 16-token decode has no steady state (the run analysis needs 32 tokens)
    with pytest.raises(BmoeError, match="steady_tok_s needs n_predict >= 32"):
        _parse('objective = "steady_tok_s"', n=16)
    assert _parse('objective = "steady_tok_s"', n=64).tune.objective == "steady_tok_s"
    # the KL divergence is measured teacher-forced, by the embedded engine only
    with pytest.raises(BmoeError, match="the native engine gives the identical-token share"):
        _parse("[tune.constraints]\nmax_fidelity_kl = 0.1", engine="native")
    assert _parse("min_fidelity = 0.9", engine="native").tune.needs_fidelity


def test_budgets_constraints_and_ranges_parse() -> None:
    cfg = _parse(
        'budget = "20 min"\nmax_rss_mb = 900\nmin_fidelity = 0.95\n'
        "[tune.constraints]\nmax_fidelity_kl = 0.05\nmin_cache_hit_pct = 40"
    )
    assert cfg.tune.budget_s == 1200 and cfg.tune.budget_runs is None
    assert {c.text() for c in cfg.tune.constraints} == {
        "rss_mb <= 900",
        "fidelity >= 0.95",
        "fidelity_kl <= 0.05",
        "cache_hit_pct >= 40",
    }
    assert _parse("budget = 14").tune.budget_runs == 14
    assert _parse('budget = "9 runs"').tune.budget_runs == 9
    for bad in ('budget = "fast"', "budget = 0", "confidence = 1.5", 'trace = "nope.csv"'):
        with pytest.raises(BmoeError, match=r"tune.toml:\d+: tune\."):
            _parse(bad)
    with pytest.raises(BmoeError, match="'prompt' must be the same"):
        _parse("", grid='prompt = ["a", "b"]')
    quantised = BASE.format(engine="embedded", n=64).replace('model = "m.gguf"\n', "")
    quantised += 'model = ["q4.gguf", "f16.gguf"]\n[tune]\nmin_fidelity = 0.9\n'
    with pytest.raises(BmoeError, match=r"grid.model: .*\[tune.reference\] model"):
        parse_tune_config(quantised)
    cfg = parse_tune_config(quantised + '[tune.reference]\nmodel = "f16.gguf"\n')
    assert cfg.tune.reference == {"model": "f16.gguf"}


def test_a_numeric_range_axis_expands_like_the_list() -> None:
    text = BASE.format(engine="embedded", n=8).replace(
        "cache_mb = [1, 2]",
        "cache_mb = { from = 1, to = 16, times = 2 }\nio_threads = { from = 1, to = 4, step = 1 }",
    )
    cfg = parse_config(text)
    assert cfg.grid == {"cache_mb": [1, 2, 4, 8, 16], "io_threads": [1, 2, 3, 4]}
    assert len(expand(cfg)) == 20
    with pytest.raises(BmoeError, match="one of 'step' or 'times'"):
        parse_config(text.replace("times = 2", "times = 2, step = 1"))


# ----------------------------------------------------------------------------- statistics


#: Two-sided 95 % quantiles of Student's t from a printed table (dof: value).
T_TABLE_95 = {1: 12.706, 2: 4.303, 3: 3.182, 5: 2.571, 10: 2.228, 20: 2.086, 30: 2.042}


def test_t_quantiles_match_a_printed_table() -> None:
    for dof, expected in T_TABLE_95.items():
        assert t_at(0.95, dof) == pytest.approx(expected, abs=5e-4)
    assert t_at(0.99, 1) == pytest.approx(63.657, abs=1e-3)  # a textbook value
    assert t_at(0.90, 10) == pytest.approx(1.812, abs=1e-3)


def test_the_ratio_is_the_verdict_layers_at_95_and_wider_at_99() -> None:
    args = (100.0, 5.0, 4, 90.0, 6.0, 5)
    expected = tuple(float(x[0]) for x in ratio_interval(*([a] for a in args)))
    assert ratio_at(0.95, *args) == pytest.approx(expected)
    r, low, high = ratio_at(0.99, *args)
    assert r == pytest.approx(expected[0]) and low < expected[1] and high > expected[2]


# ----------------------------------------------------------------------------- decisions

CON = (Constraint("fidelity", "min", 0.9),)


def _results(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"cell": c, "status": "ok", "tok_s_reported": v, "fidelity": f} for c, v, f in rows]
    )


def _candidates(cells: dict[str, tuple[float, float]], predicted: dict[str, float]):
    return pd.DataFrame(
        [
            {
                "cell": c,
                "cache_mb": cache,
                "drop_cold_experts": drop,
                "predicted": predicted.get(c, np.nan),
                "predicted_low": predicted.get(c, np.nan) * 0.9,
                "predicted_high": predicted.get(c, np.nan) * 1.1,
            }
            for c, (cache, drop) in cells.items()
        ]
    )


def test_the_fastest_cell_breaking_a_constraint_is_never_the_incumbent() -> None:
    results = _results([("fast", 300, 0.5)] * 3 + [("ok", 200, 1.0)] * 3)
    m = measured_cells(results, ["fast", "ok"], "tok_s_reported", False, CON)
    feasible = dict(zip(m["cell"], m["feasible"], strict=True))
    assert feasible == {"fast": False, "ok": True}
    table = estimates(_candidates({"fast": (8, 1.0), "ok": (8, 0.0)}, {}), m, 0.95)
    d = decide(table, feasible, {}, confidence=0.95, slots=2)
    assert d.incumbent == "ok" and d.settled


def test_a_constraint_column_never_measured_does_not_count_as_met() -> None:
    results = _results([("a", 300, np.nan)] * 3)
    m = measured_cells(results, ["a"], "tok_s_reported", False, CON)
    assert not m["feasible"].iloc[0] and "not measured" in m["broken"].iloc[0]


def test_the_worst_run_decides_feasibility() -> None:
    results = _results([("a", 300, 0.95), ("a", 310, 0.85), ("a", 305, 0.99)])
    m = measured_cells(results, ["a"], "tok_s_reported", False, CON)
    assert not m["feasible"].iloc[0] and "0.85 breaks fidelity >= 0.9" in m["broken"].iloc[0]


def test_a_lossier_cell_than_one_that_broke_fidelity_is_excluded() -> None:
    cells = {
        "c4d5": (4, 0.5),
        "c4d1": (4, 1.0),
        "c2d1": (2, 1.0),
        "c8d1": (8, 1.0),
        "c4d0": (4, 0.0),
    }
    m = measured_cells(_results([("c4d5", 100, 0.8)]), list(cells), "tok_s_reported", False, CON)
    out = excluded_by_fidelity(_candidates(cells, {}), ["cache_mb", "drop_cold_experts"], m, CON)
    # more dropping at the same or a smaller cache: excluded; a larger cache or less dropping
    # may keep more of the output, so they stay
    assert set(out) == {"c4d1", "c2d1"}


def test_unmeasured_cells_whose_interval_reaches_the_best_are_run_first() -> None:
    cells = {c: (v, 0.0) for c, v in {"best": 8, "near": 6, "far": 1}.items()}
    predicted = {"best": 100.0, "near": 95.0, "far": 10.0}
    results = _results([("best", 100.0, 1.0), ("best", 101.0, 1.0), ("best", 99.0, 1.0)])
    m = measured_cells(results, list(cells), "tok_s_reported", False, CON)
    table = estimates(_candidates(cells, predicted), m, 0.95)
    d = decide(
        table, dict(zip(m["cell"], m["feasible"], strict=True)), {}, confidence=0.95, slots=3
    )
    assert d.incumbent == "best" and not d.settled
    assert [c for c, _ in d.chosen] == ["near"]  # "far" cannot reach it, "best" has 3 runs


def test_settled_when_every_contender_is_measured_and_worse() -> None:
    cells = {"a": (8, 0.0), "b": (6, 0.0)}
    results = _results(
        [("a", v, 1.0) for v in (100, 101, 99)] + [("b", v, 1.0) for v in (80, 81, 79)]
    )
    m = measured_cells(results, list(cells), "tok_s_reported", False, CON)
    table = estimates(_candidates(cells, {"a": 100.0, "b": 95.0}), m, 0.95)
    d = decide(
        table, dict(zip(m["cell"], m["feasible"], strict=True)), {}, confidence=0.95, slots=3
    )
    assert d.settled and d.runner_up == "b" and d.distinguishable and not d.chosen


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(10, 1000), st.floats(0, 1), st.integers(0, 3)), min_size=1, max_size=8
    )
)
def test_the_incumbent_is_never_a_cell_known_to_break_a_constraint(cells) -> None:
    rows, names = [], []
    for i, (speed, fid, n) in enumerate(cells):
        names.append(f"c{i}")
        rows += [(f"c{i}", speed * (1 + 0.01 * k), fid) for k in range(n)]
    m = measured_cells(_results(rows), names, "tok_s_reported", False, CON)
    spec = {c: (1.0 + i, 0.0) for i, c in enumerate(names)}
    table = estimates(_candidates(spec, {c: 100.0 for c in names}), m, 0.95)
    feasible = dict(zip(m["cell"], m["feasible"], strict=True)) if len(m) else {}
    d = decide(table, feasible, {}, confidence=0.95, slots=3)
    if any(feasible.values()):
        assert feasible.get(d.incumbent) is True
    if d.settled:
        assert feasible.get(d.incumbent) is True
    assert all(feasible.get(c) is not False for c, _ in d.chosen)


def _measured_table(rows: dict[str, list[float]], fidelity: dict[str, float] | None = None):
    """The estimates of measured cells (`rows`: cell -> its runs' tok/s), none predicted."""
    fidelity = fidelity or {}
    results = _results([(c, v, fidelity.get(c, 1.0)) for c, vs in rows.items() for v in vs])
    m = measured_cells(results, list(rows), "tok_s_reported", False, CON)
    table = estimates(_candidates({c: (4, 0.0) for c in rows}, {}), m, 0.95)
    return table, dict(zip(m["cell"], m["feasible"], strict=True))


def test_a_cell_measured_once_never_takes_the_recommendation_from_a_repeated_one() -> None:
    table, feasible = _measured_table({"lucky": [900.0], "firm": [600.0, 610.0, 590.0]})
    costs = {"lucky": cost_key({"cache_mb": 2}, True), "firm": cost_key({"cache_mb": 4}, True)}
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    # lucky is cheaper and faster on its one run, yet one run does not outweigh three
    assert r.cell == "firm"
    assert any("lucky" in why and "1 run" in why for why in r.reasons), r.reasons
    # with nothing measured three times, the best mean is all there is (and it says so)
    table, feasible = _measured_table({"lucky": [900.0], "other": [600.0, 610.0]})
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs={})
    assert r.cell == "lucky" and any("fewer than 3" in why for why in r.reasons), r.reasons


def test_when_the_best_is_not_distinguishable_the_cheaper_cell_is_recommended() -> None:
    noisy = {"lossy": [700.0, 500.0, 600.0], "exact": [650.0, 450.0, 560.0]}
    table, feasible = _measured_table(noisy)
    costs = {
        "lossy": cost_key({"cache_mb": 4, "drop_cold_experts": 0.5}, False),
        "exact": cost_key({"cache_mb": 4, "drop_cold_experts": 0.0}, True),
    }
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    assert r.cell == "exact" and r.runner_up == "lossy" and r.distinguishable is False
    assert any(CHEAPER_RULE in why for why in r.reasons), r.reasons
    # measured twice is enough to be told apart, or not: the cheaper still wins the tie
    table, feasible = _measured_table({"lossy": noisy["lossy"], "exact": [450.0, 470.0]})
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    assert r.cell == "exact" and r.runner_up == "lossy"
    # lossless alike: the smaller cache, then the fewer read lanes
    assert cost_key({"cache_mb": 2, "io_threads": 4}, True) < cost_key(
        {"cache_mb": 4, "io_threads": 1}, True
    )
    assert cost_key({"cache_mb": 4, "io_threads": 1}, True) < cost_key(
        {"cache_mb": 4, "io_threads": 4}, True
    )
    # distinguishable: the faster stays, whatever it costs
    table, feasible = _measured_table({"lossy": [900.0, 905.0, 895.0], "exact": [600.0] * 3})
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    assert r.cell == "lossy" and r.distinguishable is True and not r.reasons


def test_an_unsettled_answer_says_how_many_more_runs_would_settle_it() -> None:
    # b measured once, 3 % below a (whose runs agree within 1 %): two more runs of b tell
    table, feasible = _measured_table({"a": [100.0, 101.0, 99.0], "b": [97.0]})
    d = decide(table, feasible, {}, confidence=0.95, slots=3, min_repeats=3, max_repeats=5)
    assert not d.settled and d.more_runs == 2
    # alike within the noise: both to their repeat bound (5), where they count as equivalent
    table, feasible = _measured_table({"a": [100.0, 110.0, 90.0], "b": [99.0, 109.0, 89.0]})
    d = decide(table, feasible, {}, confidence=0.95, slots=3, min_repeats=3, max_repeats=5)
    assert not d.settled and d.more_runs == 4


def test_the_report_names_the_cells_the_fidelity_floor_excluded_and_an_unsettled_answer():
    from bmoe.render.tune import tune_report

    state = {
        "objective": "tok_s",
        "result": {
            "stop": {"reason": "budget", "sentence": "budget spent: a is the best so far"},
            "best": {
                "cell": "a", "label": "cache_mb=4", "objective": 500.0, "low": 450.0,
                "high": 550.0, "runs": 3, "confidence": 0.95, "command": "bmoe run -m m.gguf",
                "toml": "[base]\ncache_mb = 4\n",
            },
            "settle_runs": 6,
            "infeasible": {
                "cache_mb=4 drop_cold_experts=1.0": "fidelity 0.64 breaks fidelity >= 0.9"
            },
            "excluded": 14,
            "cells_measured": 5,
            "used_runs": 14,
            "budget_runs": 14,
        },
    }  # fmt: skip
    text = tune_report(state)
    assert "not settled" in text and "about 6 more runs" in text
    assert "cache_mb=4 drop_cold_experts=1.0: fidelity 0.64 breaks fidelity >= 0.9" in text
    assert "14 cells" in text and "not run" in text


# ----------------------------------------------------------------------------- whole tunes


def _engine_missing() -> str | None:
    for module in ("bmoe.engine.synth", "llama_cpp"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not available"
    return None


needs_engine = pytest.mark.skipif(_engine_missing() is not None, reason=str(_engine_missing()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from bmoe.engine.synth import synth_model

    return Path(synth_model(tmp_path_factory.mktemp("model") / "tiny.gguf", preset="tiny"))


def _tune_config(
    tmp_path: Path, model: Path, tune: str, n_predict: int = 16, output: str | None = None
) -> Path:
    return write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "tt"
        engine = "embedded"
        output = "{output or tmp_path / "out"}"
        timeout_s = 300

        [base]
        model = "{model}"
        n_predict = {n_predict}
        threads = 1
        moe_stream = true

        [grid]
        cache_mb = [1, 2, 8]
        drop_cold_experts = [0.0, 1.0]

        [tune]
        {tune}
        """,
        name="tune.toml",
    )


def _tune(cfg: Path, *extra: str, cwd: Path = ROOT) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bmoe", "tune", str(cfg), "--plain", *extra],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
@pytest.mark.parametrize("budget", [5])
def test_a_tune_keeps_its_budget_and_recommends_only_a_feasible_cell(tmp_path, tiny, budget):
    cfg = _tune_config(tmp_path, tiny, f"budget = {budget}\nmin_fidelity = 0.99\nper_round = 2")
    proc = _tune(cfg)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode in (0, 1), err.decode()
    root = sweep_folder(tmp_path / "out")
    lines = manifest(root)
    assert len(lines) <= budget  # the calibration run counts
    state = json.loads((root / "tune.json").read_text())
    assert state["result"]["used_runs"] == len(lines)
    assert state["result"]["stop"]["reason"] in ("budget", "settled", "exhausted")
    assert "stopped:" in out.decode()
    best = state["result"]["best"]
    if best is not None:  # every run of the recommended cell keeps the fidelity floor
        from bmoe.sweep.archive import load_results

        results = load_results(root)
        mine = results[(results["cell"] == best["cell"]) & (results["status"] == "ok")]
        assert len(mine) and (mine["fidelity"] >= 0.99).all()
        assert "--cache-mb" in best["command"] and "[base]" in best["toml"]
    # the folder is a sweep archive the analyses read
    report = tmp_path / "tune.html"
    for command in (["analyze", "sweep", str(root)], ["report", str(root), "-o", str(report)]):
        done = subprocess.run(
            [sys.executable, "-m", "bmoe", *command], cwd=ROOT, capture_output=True, check=False
        )
        assert done.returncode == 0, done.stderr.decode()
    assert "Speed against fidelity" in report.read_text(encoding="utf-8")  # the report plots it


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
def test_a_tune_with_a_relative_output_finds_its_fidelity_reference(tmp_path, tiny):
    """The default output is relative to the working directory, and every run works in its
    own staging folder: the calibration run's fidelity reference must reach them all."""
    cfg = _tune_config(tmp_path, tiny, "budget = 4\nmin_fidelity = 0.5", output="out")
    proc = _tune(cfg.name, cwd=tmp_path)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()
    lines = manifest(sweep_folder(tmp_path / "out"))
    assert len(lines) <= 4
    assert [r["status"] for r in lines] == ["ok"] * len(lines), [r.get("error") for r in lines]
    assert "best: " in out.decode()


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
def test_a_tune_whose_every_attempt_fails_the_same_way_stops_within_its_budget(tmp_path, tiny):
    """A mistake every cell shares (here a fidelity reference of another prompt: a sound
    file, so the configuration's checks pass it and every run refuses it) ends the tune after
    its first round, as it ends a sweep; a failed attempt counts against the budget, retries
    included, and nothing unmeasured is called the best."""
    import numpy as np

    from bmoe.engine.embedded.fidelity import Reference, write_reference

    other = Reference(
        "another prompt", str(tiny), np.zeros(64, np.int32), np.zeros((64, 8), np.float32)
    )
    write_reference(str(tmp_path / "ref.npz"), other)
    cfg = _tune_config(
        tmp_path, tiny, 'budget = 6\nper_round = 3\nmin_fidelity = 0.5\nfidelity_ref = "ref.npz"'
    )
    text = cfg.read_text().replace("timeout_s = 300", "timeout_s = 300\nretries = 1")
    cfg.write_text(text)
    proc = _tune(cfg)
    out, err = proc.communicate(timeout=900)
    text = out.decode() + err.decode()
    assert proc.returncode == 1, text
    lines = manifest(sweep_folder(tmp_path / "out"))
    assert len(lines) <= 6  # the budget, the calibration run and every retry counted
    candidates = [r for r in lines if not r["cell"].startswith("calibrate")]
    assert candidates and {r["status"] for r in candidates} == {"crashed"}
    # the first round's runs failed alike: no second round
    assert {r["cell"] for r in candidates} == {r["cell"] for r in candidates[:3]}
    assert "failed the same way" in text and "ref.npz" in text
    assert "best so far" not in text and "best:" not in text


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
def test_a_tune_killed_mid_run_resumes_without_repeating_a_finished_run(tmp_path, tiny):
    cfg = _tune_config(tmp_path, tiny, "budget = 9\nper_round = 3", n_predict=48)
    proc = _tune(cfg)
    out = tmp_path / "out"
    root = wait_for_a_run_in_flight(proc, out, done=3, timeout_s=600)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {r["run"]: r["started"] for r in manifest(root) if r["status"] == "ok"}
    proc = _tune(root)
    _out, err = proc.communicate(timeout=900)
    assert proc.returncode in (0, 1), err.decode()
    lines = manifest(root)
    ok = [r["run"] for r in lines if r["status"] == "ok"]
    assert len(ok) == len(set(ok))  # no run completed twice
    for run_id, started in before.items():  # a finished run was not run again
        assert [r["started"] for r in lines if r["run"] == run_id and r["status"] == "ok"] == [
            started
        ]
    assert [r["status"] for r in lines].count("killed") == 1
    state = json.loads((root / "tune.json").read_text())
    assert {r["run"] for r in state["runs"]} <= set(ok)
    assert len(lines) <= 9 + 1  # the budget, and the attempt the kill cut short


def test_the_budget_counts_attempts_not_manifest_lines() -> None:
    """A copied manifest repeats its ok lines; each attempt costs the device once."""
    from bmoe.sweep.tune import device_use

    ok = [{"run": f"c{i}/r1", "attempt": 1, "status": "ok", "duration_s": 2.0} for i in range(4)]
    crashed = {"run": "c0/r1", "attempt": 2, "status": "crashed", "duration_s": 1.0}
    aside = {"run": "c1/r1", "attempt": 1, "status": "set_aside", "duration_s": 2.0}
    assert device_use(ok) == (4, 8.0)
    assert device_use(ok + ok + ok[:2]) == (4, 8.0)  # duplicated lines
    assert device_use([*ok, crashed, aside, {"run": 3}, {"status": "ok"}]) == (5, 9.0)


def test_the_recommended_command_pastes_back_to_the_same_values() -> None:
    """A value holding a control character is quoted so that the printed line (plain text
    after the output filter) still names the same file when pasted into a shell."""
    from bmoe.render.messages import printable
    from bmoe.sweep.plan import Cell
    from bmoe.sweep.tune import command_line

    model = "models/m\x1b]0;x\x07 it's\n.gguf"
    cell = Cell("c", 0, {"model": model, "cache_mb": 8, "moe_stream": True}, {}, ())
    line = command_line(cell, "embedded")
    assert printable(line) == line  # nothing for the filter to spell out
    words = subprocess.run(
        ["bash", "-c", f'printf "%s\\0" {line}'], capture_output=True, check=True
    ).stdout.split(b"\0")[:-1]
    assert [w.decode() for w in words] == [
        "bmoe", "run", "-m", model, "--cache-mb", "8", "--moe-stream"
    ]  # fmt: skip


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
@pytest.mark.parametrize("arch", ARCHS)
def test_a_tune_runs_on_every_generated_family(tmp_path, arch) -> None:
    """Every family the project generates calibrates, profiles, predicts and tunes: the
    expert sizes of its route trace agree with its runs' summary figures, dense layers and
    a weight type per layer included (deepseek2's leading dense layer and gemma4's dense
    layers route nothing, so cache_cycle_mb is over the MoE layers only)."""
    from bmoe.engine.synth import synth_model

    extra = {"layer_types": ("q8_0", "q4_0")} if arch == "qwen3moe" else {}
    kind = "mxfp4" if arch == "gpt-oss" else "q8_0" if extra else "f32"
    model = synth_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch, type=kind, **extra)
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "fam"
        engine = "embedded"
        output = "{tmp_path / "out"}"
        timeout_s = 300

        [base]
        model = "{model}"
        n_predict = 12
        threads = 1
        moe_stream = true

        [grid]
        cache_mb = [0.25, 1, 4]

        [tune]
        budget = 3
        per_round = 2
        """,
        name="tune.toml",
    )
    proc = _tune(cfg)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode in (0, 1), err.decode()
    assert "another model" not in out.decode() + err.decode()
    root = sweep_folder(tmp_path / "out")
    state = json.loads((root / "tune.json").read_text())
    assert state["result"]["stop"]["reason"] in ("budget", "settled", "exhausted")
    assert any(r.get("predicted") is not None for r in state["runs"])  # the profile priced it
    assert (root / "profile.json").is_file()


def test_load_tune_config_reads_the_example(tmp_path) -> None:
    cfg = load_tune_config(ROOT / "sweeps" / "tiny-tune.toml")
    assert len(expand(cfg.sweep)) == 48
    assert cfg.tune.budget_runs == 14 and cfg.tune.constraints[0].text() == "fidelity >= 0.9"
    assert math.isclose(cfg.tune.confidence, 0.95)


# ----------------------------------------------------------------------------- native fidelity


def _run_out(path: Path, pieces: list[str]) -> None:
    from bmoe.formats.protocol import format_event

    lines = [
        format_event(
            "PROGRESS", {"step": i + 1, "steps": len(pieces), "wall_ms": 1.0, "delta_text": p}
        )
        for i, p in enumerate(pieces)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("loading\n" + "\n".join(lines) + "\n=== perf ===\n", encoding="utf-8")


def test_generated_tokens_against_the_reference_give_the_share_and_first_divergence(
    tmp_path,
) -> None:
    from bmoe.analyze.fidelity import token_agreement
    from bmoe.sweep.tune import native_fidelity, output_pieces

    ref = ["The", " router", " picks", " two", " experts", "."]
    _run_out(tmp_path / "ref" / "run.out", ref)
    assert output_pieces(tmp_path / "ref" / "run.out") == ref
    # 4 of 6 positions agree; the first difference is at step 3; a run cut short counts its
    # missing steps as different
    assert token_agreement(ref, ["The", " router", " chose", " two", " experts", "!"]) == {
        "fidelity": 4 / 6,
        "fidelity_first_miss": 3.0,
        "fidelity_steps": 6.0,
    }
    assert token_agreement(ref, ref)["fidelity"] == 1.0
    assert token_agreement(ref, ref)["fidelity_first_miss"] == 0.0
    assert token_agreement(ref, ref[:3])["fidelity"] == 0.5
    _run_out(tmp_path / "cells" / "a" / "r1" / "run.out", [*ref[:5], "?"])
    results = pd.DataFrame(
        [
            {"run": "a/r1", "cell": "a", "status": "ok", "dir": "cells/a/r1"},
            {"run": "b/r1", "cell": "b", "status": "crashed", "dir": None},
        ]
    )
    out = native_fidelity(
        results, tmp_path, {"reference_output": str(tmp_path / "ref" / "run.out")}
    )
    assert out.at[0, "fidelity"] == pytest.approx(5 / 6) and out.at[0, "fidelity_first_miss"] == 6
    assert np.isnan(out.at[1, "fidelity"])


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
def test_a_constraint_on_a_column_the_engine_does_not_produce_is_refused(tmp_path, tiny):
    cfg = _tune_config(tmp_path, tiny, "budget = 3\n[tune.constraints]\nmin_tok_per_joule = 3")
    proc = _tune(cfg)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 2
    assert "min_tok_per_joule: the runs have no column 'tok_per_joule'" in err.decode()
    assert "tok_s_reported" in err.decode()  # the columns it could constrain are named


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
def test_a_device_time_budget_is_kept(tmp_path, tiny):
    cfg = _tune_config(tmp_path, tiny, 'budget = "12 s"\nper_round = 2')
    proc = _tune(cfg)
    _out, err = proc.communicate(timeout=900)
    assert proc.returncode in (0, 1), err.decode()
    state = json.loads((sweep_folder(tmp_path / "out") / "tune.json").read_text())
    used = sum(r.get("duration_s") or 0 for r in manifest(sweep_folder(tmp_path / "out")))
    assert state["result"]["used_device_s"] == pytest.approx(used, abs=0.1)
    assert used <= 12.0
    assert state["result"]["stop"]["reason"] in ("budget", "settled", "exhausted")


def test_before_any_cell_is_known_feasible_the_best_lossless_cell_runs_too() -> None:
    cells = {"drop": (8, 1.0), "drop2": (6, 1.0), "keep": (8, 0.0), "keep_small": (2, 0.0)}
    predicted = {"drop": 300.0, "drop2": 290.0, "keep": 200.0, "keep_small": 50.0}
    m = measured_cells(_results([]), list(cells), "tok_s_reported", False, CON)
    table = estimates(_candidates(cells, predicted), m, 0.95)
    d = decide(table, {}, {}, confidence=0.95, slots=2, lossless=["keep", "keep_small"])
    # the predicted best, then the best cell a fidelity floor cannot fail
    assert [c for c, _ in d.chosen] == ["drop", "keep"]


def test_speed_against_fidelity_marks_the_cells_no_other_beats_on_both() -> None:
    from bmoe.analyze.fidelity import speed_fidelity

    results = pd.DataFrame(
        [
            {"cell": c, "status": "ok", "tok_s_mean": v, "fidelity": f, "fidelity_kl": k}
            for c, v, f, k in [
                ("exact", 100, 1.0, 0.0),
                ("exact", 110, 1.0, 0.0),
                ("drop", 200, 0.7, 0.5),
                ("both_worse", 90, 0.6, 0.9),
                ("mid", 150, 0.9, 0.1),
                ("mid", 150, 0.8, 0.2),
            ]
        ]
    )
    table = speed_fidelity(results).set_index("cell")
    assert table.loc["exact", "tok_s_mean"] == 105 and table.loc["mid", "fidelity"] == 0.8
    assert table.loc["mid", "fidelity_kl"] == 0.2  # the worst run
    assert table["frontier"].to_dict() == {
        "drop": True,
        "mid": True,
        "exact": True,
        "both_worse": False,
    }


@pytest.mark.engine
@pytest.mark.slow
@needs_engine
def test_a_given_trace_and_profile_replace_the_calibration_run(tmp_path, tiny):
    from bmoe.analyze.profile import build_profile, profile_runs
    from bmoe.engine.embedded.config import EngineConfig
    from bmoe.engine.embedded.run import run_engine
    from bmoe.formats.profile import write_profile
    from bmoe.formats.runfiles import read_recorded_runs

    made = tmp_path / "made"
    made.mkdir()
    run_engine(EngineConfig(model=str(tiny), n_predict=16, threads=1, moe_stream=True,
                            cache_mb=1, csv=str(made / "run.csv"),
                            route_trace=str(made / "run.route.csv"),
                            io_trace=str(made / "run.io.csv")))  # fmt: skip
    write_profile(build_profile(profile_runs(read_recorded_runs([made]))), tmp_path / "device.json")
    cfg = write_config(tmp_path, f"""\
        [sweep]
        name = "given"
        engine = "embedded"
        output = "{tmp_path / "out"}"

        [base]
        model = "{tiny}"
        n_predict = 16
        threads = 1
        moe_stream = true

        [grid]
        cache_mb = [1, 2, 8]

        [tune]
        budget = 3
        trace = "{made / "run.route.csv"}"
        profile = "{tmp_path / "device.json"}"
        """, name="tune.toml")  # fmt: skip
    proc = _tune(cfg)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()
    root = sweep_folder(tmp_path / "out")
    assert not [r for r in manifest(root) if r["cell"].startswith("calibrate")]
    state = json.loads((root / "tune.json").read_text())
    assert state["calibration"]["trace"] == str(made / "run.route.csv")
    assert len(manifest(root)) <= 3 and state["result"]["best"] is not None
    # every run the tune chose was predicted from the given profile
    assert all(r["predicted"] is not None for r in state["runs"])
