"""A sweep's folder from start to finish is the sweep package's: a library caller gets the
archive ``bmoe sweep`` makes (predictions, results, summary), a resume with a changed
configuration keeps the old one, a second runner is refused, and a tune's folder gets its
``summary.md`` as a sweep's does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sweep_helpers import install_fake_cli, manifest, sweep_folder, write_config

from bmoe.cli import main
from bmoe.formats import archive as layout
from bmoe.formats.profile import write_profile
from bmoe.sweep.config import load_config
from bmoe.sweep.lifecycle import hold_folder, run_sweep_folder
from tests.analyze.device.test_predict import round_profile


def _sweep(folder: Path, grid: str = "[0, 8]") -> Path:
    """A two-cell sweep of the stand-in engine with a device profile (so: predictions)."""
    folder.mkdir(parents=True)
    fake = install_fake_cli(folder / "bin")
    (folder / "tiny.gguf").write_bytes(b"GGUF stand-in")
    profile = round_profile(prefill={"load_s": 1.0, "prefill_s": 2.0})
    profile.model["n_expert_used"] = 2
    write_profile(profile, folder / "device.json")
    return write_config(folder, f"""\
        [sweep]
        name = "life"
        engine = "native"
        output = "{folder / "out"}"
        profile = "device.json"
        timeout_s = 30

        [base]
        model = "tiny.gguf"
        prompt = "hi"
        n_predict = 4

        [grid]
        cache_mb = {grid}

        [[targets]]
        name = "here"
        binary = "{fake}"
        """)  # fmt: skip


def _top_level(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if not p.name.startswith(".")}


def _headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


def test_a_library_sweep_makes_the_archive_the_cli_makes(tmp_path, capsys):
    outcome = run_sweep_folder(load_config(_sweep(tmp_path / "lib")))
    assert outcome.completed == outcome.total == 2
    assert main(["sweep", str(_sweep(tmp_path / "cli")), "--plain"]) == 0
    capsys.readouterr()
    lib, cli = outcome.root, sweep_folder(tmp_path / "cli" / "out")
    wanted = {layout.CONFIG, layout.MANIFEST, layout.RESULTS, layout.PREDICTIONS,
              layout.SUMMARY, layout.CELLS}  # fmt: skip
    assert _top_level(lib) == _top_level(cli) == wanted
    assert layout.read_predictions(lib).equals(layout.read_predictions(cli))
    assert [len(manifest(r)) for r in (lib, cli)] == [2, 2]
    summaries = [(r / layout.SUMMARY).read_text(encoding="utf-8") for r in (lib, cli)]
    assert summaries[0].startswith("# Sweep life\n")
    assert _headings(summaries[0]) == _headings(summaries[1])
    assert "### cells ranked by tok_s_mean" in summaries[0]


def test_a_library_resume_keeps_the_changed_configuration(tmp_path):
    config = _sweep(tmp_path / "s")
    root = run_sweep_folder(load_config(config)).root
    first = (root / layout.CONFIG).read_text(encoding="utf-8")
    config.write_text(config.read_text().replace("[0, 8]", "[0, 8, 16]"))
    outcome = run_sweep_folder(load_config(config), folder=root)
    assert outcome.root == root and outcome.skipped == 2 and outcome.completed == 3
    assert (root / "sweep.1.toml").read_text(encoding="utf-8") == first
    assert "16" in (root / layout.CONFIG).read_text(encoding="utf-8")
    assert not (root / "sweep.2.toml").exists()
    # a resume that changes nothing keeps no copy
    run_sweep_folder(load_config(config), folder=root)
    assert not (root / "sweep.2.toml").exists()
    assert len(manifest(root)) == 3  # nothing complete ran again


def test_a_held_sweep_refuses_a_second_runner(tmp_path):
    """While a library caller holds the sweep, ``bmoe sweep`` of the same configuration in
    another process is refused before it makes a folder."""
    config = _sweep(tmp_path / "s")
    output = Path(load_config(config).settings.output)
    with hold_folder("life", "[sweep]\n", output=output) as held:
        assert held.root.parent == output and not held.resumed
        done = subprocess.run([sys.executable, "-m", "bmoe", "sweep", str(config), "--plain"],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "sweep 'life'" in done.stderr and "is in use by" in done.stderr
    assert [p.name for p in output.iterdir() if not p.name.startswith(".")] == [held.root.name]


@pytest.mark.engine
@pytest.mark.slow
def test_a_tunes_folder_gets_its_summary(tmp_path):
    """``bmoe tune``'s folder from the library: calibration, the tune's rounds, then
    ``summary.md`` as a sweep's folder has it."""
    pytest.importorskip("llama_cpp")
    from bmoe.engine.synth import synth_model
    from bmoe.sweep.lifecycle import run_tune_folder
    from bmoe.sweep.tune_config import load_tune_config
    from tests.sweep.test_tune import _tune_config

    tiny = Path(synth_model(tmp_path / "tiny.gguf", preset="tiny"))
    cfg = _tune_config(tmp_path, tiny, "budget = 2\nper_round = 1")
    outcome = run_tune_folder(load_tune_config(cfg))
    root = outcome.root
    assert root.parent == tmp_path / "out"
    assert json.loads((root / layout.TUNE_STATE).read_text())["result"] == outcome.result
    summary = (root / layout.SUMMARY).read_text(encoding="utf-8")
    assert summary.startswith("# Tune tt\n") and "### cells ranked by tok_s_mean" in summary
