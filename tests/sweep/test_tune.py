"""``bmoe tune``: the configuration and whole tunes on the embedded engine (its decisions are
tested in ``tests/analyze/device/test_tune.py``).

Whole tunes run the generated tiny model:
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
from sweep_helpers import manifest, sweep_folder, wait_for_a_run_in_flight, write_config

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
    from bmoe.analyze.device import build_profile, profile_runs
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
