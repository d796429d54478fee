"""Session mode: the prompts of a sweep as turns of one ``--session`` stand-in engine."""

from __future__ import annotations

import json
from pathlib import Path

from sweep_helpers import install_fake_cli, manifest, write_config

from bmoe.formats.metrics import read_metrics
from bmoe.sweep.archive import ArchiveWriter, load_results
from bmoe.sweep.config import load_config, resolved_toml
from bmoe.sweep.plan import make_plan
from bmoe.sweep.runner import run_sweep

PROMPTS = ["first", "FAIL", 'a "quoted"\nprompt $HOME']


def _sweep(tmp_path: Path, extra_base: str = "", repeats: int = 2) -> Path:
    fake = install_fake_cli(tmp_path / "bin")
    (tmp_path / "m.gguf").write_bytes(b"x")
    cfg = write_config(
        tmp_path,
        f"""\
        [sweep]
        name = "sess"
        session = true
        repeats = {repeats}
        retries = 1
        timeout_s = 60
        output = "{tmp_path / "out"}"

        [base]
        model = "m.gguf"
        n_predict = 4
        io_trace = true
        {extra_base}

        [grid]
        prompt = {json.dumps(PROMPTS)}

        [[targets]]
        name = "here"
        binary = "{fake}"
        """,
    )
    config = load_config(cfg)
    plan = make_plan(config)
    assert [len(u.runs) for u in plan.units] == [3] * repeats and all(u.session for u in plan.units)
    archive = ArchiveWriter.create(Path(config.settings.output), "sess", resolved_toml(config))
    run_sweep(config, plan, archive)
    return archive.root


def test_prompts_are_turns_of_one_engine_per_round(tmp_path):
    root = _sweep(tmp_path)
    lines = manifest(root)
    status = {(r["params"]["prompt"], r["repeat"]): r["status"] for r in lines}
    assert len(lines) == 6  # the rejected prompt is not retried
    for rep in (1, 2):
        assert status[("first", rep)] == "ok" and status[(PROMPTS[2], rep)] == "ok"
        assert status[("FAIL", rep)] == "rejected"
    sessions = sorted(p for p in (root / "sessions").iterdir())
    assert len(sessions) == 2
    for session in sessions:
        out = (session / "session.out").read_bytes()
        assert out.count(b"BMOE_READY ") == 1 and out.count(b"BMOE_DONE ") == 2
        assert len(json.loads((session / "runs.json").read_text())) == 3
        whole = read_metrics(session / "run.csv")
        assert len(whole.summaries) == 2
    for record in lines:
        if record["status"] != "ok":
            assert "prompt rejected" in record["error"]
            continue
        folder = root / record["dir"]
        run = read_metrics(folder / "run.csv")
        assert run.tokens == 4 and not run.partial and len(run.summaries) == 1
        assert run.rows["turn"].nunique() == 1
        out = (folder / "run.out").read_bytes()
        assert out.count(b"BMOE_PROGRESS ") == 4 and out.count(b"BMOE_DONE ") == 1
        assert record["stream"]["done"]["n_prompt"] == len(record["params"]["prompt"])
        assert record["session"].startswith("sessions/")
    results = load_results(root)
    assert results["status"].value_counts().to_dict() == {"ok": 4, "rejected": 2}
    assert results.loc[results["status"] == "ok", "tok_s_mean"].gt(0).all()


def test_a_session_that_crashes_is_retried_in_a_new_session(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    root = _sweep(tmp_path, f'fake_mode = "crash-once"\nfake_state = "{state}"', repeats=1)
    lines = manifest(root)
    runs = [(r["params"]["prompt"], r["attempt"], r["status"]) for r in lines]
    assert runs[0] == ("first", 1, "crashed")
    assert ("first", 2, "ok") in runs and (PROMPTS[2], 1, "ok") in runs
    assert len(list((root / "sessions").iterdir())) == 2


def test_a_session_turn_that_fails_the_same_way_every_time_stops_the_sweep(tmp_path):
    import pytest

    from bmoe.sweep.attempt import CellFailed

    with pytest.raises(CellFailed, match="every attempt \\(2\\) failed the same way: crashed"):
        _sweep(tmp_path, 'fake_mode = "crash"', repeats=1)
    root = next((tmp_path / "out").iterdir())
    statuses = [r["status"] for r in manifest(root)]
    assert statuses and set(statuses) == {"crashed"}
    assert (root / "results.parquet").is_file()
