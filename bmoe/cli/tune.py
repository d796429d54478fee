"""``bmoe tune CONFIG`` (find the best configuration of a device in a fraction of a grid's
runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from bmoe.cli import app, console, err_console
from bmoe.cli.options import OutputRoot, PlainProgress
from bmoe.errors import BmoeError
from bmoe.render.messages import literal


@app.command("tune")
def tune_command(
    config: Path = typer.Argument(
        ...,
        help="Tune configuration (a sweep's TOML with a tune table), or a tune folder to resume.",
    ),
    output: OutputRoot = None,
    plain: PlainProgress = False,
) -> None:
    """Search a sweep configuration's grid for the best cell by the tune table's objective,
    running only the cells that can still change the answer: a traced calibration run, then
    rounds of predict (the device profile), run (the sweep's runner and archive), refit,
    until the best cell is settled against the cells that could reach it or the budget is
    spent. The folder is a sweep archive with tune.json (every round's decisions).

    Example: bmoe tune sweeps/tiny-tune.toml
    Example: bmoe tune bench-data/2026-12-01-tiny-tune   # resume after a kill
    Example: bmoe sweep sweeps/tiny-tune.toml   # the full grid of the same file
    """
    from bmoe.formats.archive import CONFIG, TUNE_STATE
    from bmoe.sweep.tune_config import load_tune_config

    folder: Path | None = None
    if config.is_dir():
        folder, config = config, config / CONFIG
        if not (folder / TUNE_STATE).is_file() and not config.is_file():
            raise BmoeError(f"{folder}: not a tune folder (no {CONFIG})")
    cfg = load_tune_config(config)
    root = output or Path(cfg.sweep.settings.output)
    _check_flags(cfg)
    _run(cfg, root, folder, plain)


def _check_flags(cfg) -> None:
    import tempfile

    from bmoe.sweep.flags import check_flags
    from bmoe.sweep.targets import open_target
    from bmoe.sweep.tune import Tuner

    cells = [*Tuner.cells_to_check(cfg)]
    with tempfile.TemporaryDirectory(prefix="bmoe-check-") as state:
        targets = [open_target(s, Path(state)) for s in cfg.sweep.targets]
        try:
            local = cfg.sweep.settings.executor == "local"
            for note in check_flags(cfg.sweep, cells, targets, probe=local):
                err_console.print(f"note: {note}", highlight=False, markup=False)
        finally:
            for target in targets:
                target.close()


def _run(cfg, root: Path, folder: Path | None, plain: bool) -> None:
    from bmoe.cli.sweep import note, with_progress
    from bmoe.render.tune import tune_report
    from bmoe.sweep.lifecycle import run_tune_folder

    # piped, the log goes to stderr: what stdout carries is the answer, first
    log = sys.stdout if console.is_terminal else sys.stderr
    outcome = with_progress(plain, lambda sink: run_tune_folder(
        cfg, output=root, folder=folder, sink=sink, say=note), log)  # fmt: skip
    console.print(literal(tune_report(outcome.state)), highlight=False, soft_wrap=True)
    if not outcome.result.get("best"):
        raise typer.Exit(1)
