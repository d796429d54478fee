"""``bmoe sweep CONFIG`` (run a grid of engine runs on targets) and ``bmoe analyze sweep DIR``."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeVar

import typer
from rich.text import Text

from bmoe.cli import analyze_app, app, console, err_console
from bmoe.cli.options import OutputRoot, PlainProgress, check_format
from bmoe.errors import BmoeError
from bmoe.render.messages import literal, printable
from bmoe.render.outputs import FORMAT_HELP

if TYPE_CHECKING:
    from bmoe.sweep.attempt import ProgressSink

T = TypeVar("T")


def _dry_run(config, plan, archive_root: Path) -> None:
    from bmoe.sweep.archive import ArchiveWriter
    from bmoe.sweep.attempt import CellContext
    from bmoe.sweep.attempts import planned_command
    from bmoe.sweep.runner import assign_targets
    from bmoe.sweep.targets import open_target

    archive = ArchiveWriter(archive_root)
    ctx = CellContext(config, archive)
    targets = {s.name: open_target(s, archive.state_dir / "targets") for s in config.targets}
    assigned = assign_targets(plan, config.targets)
    s = config.settings
    repeats = f"{s.repeats}-{s.max_repeats} (auto)" if s.adaptive else str(s.repeats)
    warmup = f" + {s.warmup} warm-up" if s.warmup else ""
    console.print(
        Text.assemble(
            (printable(config.settings.name), "bold"),
            printable(
                f": {len(plan.cells)} cells x {repeats} repeats{warmup} = "
                f"{len(plan.runs)} runs, engine {config.settings.engine}, "
                f"order {config.settings.order}; folder {archive_root}"
            ),
        ),
        highlight=False,
    )
    if config.settings.executor == "ray":
        resources = ", ".join(f"{s.name} ({s.ray_resource})" for s in config.targets)
        console.print(literal(f"on the Ray cluster at {config.settings.address}; "
                              f"targets: {resources}"), highlight=False)  # fmt: skip
    try:
        for run in plan.runs:
            target = targets[assigned[run.id]]
            console.print(Text.assemble((f"{run.order + 1:>4}", "bold"), " ", printable(run.id),
                                        "  ", (printable(target.name), "cyan")),
                          highlight=False)  # fmt: skip
            console.file.write("      " + printable(planned_command(run, target, ctx)) + "\n")
            console.file.flush()
    finally:
        for target in targets.values():
            target.close()
    _print_predicted_duration(config, plan)


def _print_predicted_duration(config, plan) -> None:
    from bmoe.sweep.predictions import sweep_predictions

    predicted = sweep_predictions(config, plan)
    if predicted is None:
        return
    total = float(predicted["predicted_s"].sum())
    kind = "at most" if bool(predicted["bound"].any()) else "about"
    console.print(
        f"predicted duration ({config.settings.profile}): {kind} {total / 60:.1f} min of engine "
        f"time for {len(predicted)} runs (gates and cool-downs not included)",
        highlight=False,
    )


def _check_flags(config, plan) -> None:
    """Every cell's flags against the engine on its targets (:mod:`bmoe.sweep.flags`)."""
    import tempfile

    from bmoe.sweep.flags import check_flags
    from bmoe.sweep.targets import open_target

    with tempfile.TemporaryDirectory(prefix="bmoe-check-") as state:
        targets = [open_target(s, Path(state)) for s in config.targets]
        try:
            local = config.settings.executor == "local"
            for note in check_flags(config, plan.cells, targets, probe=local):
                err_console.print(f"note: {note}", highlight=False, markup=False)
        finally:
            for target in targets:
                target.close()


def _install_sigterm() -> None:
    def to_interrupt(signum, frame):
        raise KeyboardInterrupt

    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, to_interrupt)


def _refuse_a_tune_folder(folder: Path) -> None:
    """A tune's folder is carried on by ``bmoe tune``: as a sweep it would run the whole grid
    past the tune's budget and its ``sweep.toml`` would lose the ``[tune]`` table."""
    from bmoe.sweep.archive import is_tune_folder, resume_command

    if is_tune_folder(folder):
        raise BmoeError(
            f"{folder}: made by bmoe tune; resume it with: {resume_command(folder)} "
            "(bmoe sweep CONFIG without --resume runs the whole grid in a new folder)"
        )


@app.command("sweep")
def sweep_command(
    config: Path = typer.Argument(
        ..., help="Sweep configuration (TOML), or a sweep folder to resume."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print every run, its target and its exact command; run nothing."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the latest folder of this sweep: skip complete runs."
    ),
    output: OutputRoot = None,
    plain: PlainProgress = False,
    keep_going: bool = typer.Option(
        False,
        "--keep-going",
        help="Run the other cells when every attempt of a cell failed the same way "
        "(default: stop the sweep with that error).",
    ),
) -> None:
    """Run an engine across a grid of flags on one or more targets; archive every run.

    Example: bmoe sweep sweeps/tiny-embedded.toml --dry-run
    (every run, its target and its exact command; nothing runs)
    Example: bmoe sweep sweeps/tiny-embedded.toml
    Example: bmoe sweep sweeps/tiny-embedded.toml --resume
    (after a crash or Ctrl-C: the complete runs are skipped)
    Example: bmoe sweep bench-data/2026-12-01-tiny-embedded
    (the same: resume that folder)
    """
    from bmoe.sweep.archive import CONFIG, find_latest, new_folder
    from bmoe.sweep.config import load_config
    from bmoe.sweep.plan import make_plan

    folder: Path | None = None
    if config.is_dir():
        folder = config
        config = config / CONFIG
        resume = True
        _refuse_a_tune_folder(folder)
    if config.exists():  # a FIFO or a device would block or never end: named instead
        from bmoe.formats.inputs import regular_file

        regular_file(config)
    cfg = load_config(config)
    plan = make_plan(cfg)
    root = output or Path(cfg.settings.output)
    if resume and folder is None:
        folder = find_latest(root, cfg.settings.name)
        if folder is None:
            raise BmoeError(f"no earlier folder of sweep {cfg.settings.name!r} under {root}")
        _refuse_a_tune_folder(folder)
    _check_flags(cfg, plan)  # before the folder exists: a refused config leaves nothing
    if dry_run:
        _dry_run(cfg, plan, folder or new_folder(root, cfg.settings.name))
        return
    _run(cfg, plan, folder, root, plain, keep_going)


def note(text: str) -> None:
    """A note for the user on stderr (a lock taken over, a manifest mended)."""
    err_console.print(literal(f"note: {text}"), highlight=False)


def with_progress(plain: bool, work: Callable[[ProgressSink], T], log: TextIO | None = None) -> T:
    """`work` under the live display (plain log lines with `plain` or off a terminal, written
    to `log`, default stdout), SIGTERM taken as Ctrl-C; an interrupted sweep or tune says the
    command that resumes it (exit 130)."""
    from bmoe.render.progress import LiveProgress, PlainProgress
    from bmoe.sweep.archive import resume_command
    from bmoe.sweep.lifecycle import SweepInterrupted

    _install_sigterm()
    use_plain = plain or not console.is_terminal
    sink = PlainProgress(log or sys.stdout) if use_plain else LiveProgress(console)
    try:
        with sink:
            return work(sink)
    except SweepInterrupted as stop:
        err_console.print(literal(f"interrupted; resume with: {resume_command(stop.root)}"))
        raise typer.Exit(130) from None


def _run(cfg, plan, folder: Path | None, root: Path, plain: bool, keep_going: bool) -> None:
    from bmoe.sweep.archive import resume_command
    from bmoe.sweep.lifecycle import run_sweep_folder

    outcome = with_progress(plain, lambda sink: run_sweep_folder(
        cfg, output=root, folder=folder, plan=plan, sink=sink, say=note, flags_checked=True,
        keep_going=keep_going))  # fmt: skip
    failed = outcome.failed_runs
    not_run = outcome.not_run
    console.print(
        literal(
            f"{outcome.completed}/{outcome.total} runs complete ({outcome.skipped} from before), "
            f"{len(failed)} failed"
            + (f", {not_run} not run" if not_run else "")
            + f" -> {outcome.root}"
        ),
        highlight=False,
        soft_wrap=True,  # one line, never broken before the folder (a pipe is 80 wide)
    )
    if failed:
        err_console.print(literal("failed: " + ", ".join(failed)), highlight=False)
    if not_run:
        err_console.print(literal(f"resume with: {resume_command(outcome.root)}"), highlight=False)
    if failed or not_run:
        raise typer.Exit(1)


@analyze_app.command("sweep")
def analyze_sweep_command(
    folder: Path = typer.Argument(
        ...,
        help="A sweep folder (bench-data/<date>-<name>), or a sweep configuration: its "
        "latest folder.",
    ),
    outcome: str = typer.Option(
        "tok_s_mean", "--outcome", help="The figure cells are ranked by (a results column)."
    ),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    plots: Path | None = typer.Option(
        None,
        "--plots",
        help="Also write, in this folder, the outcome against the main axis (one line per "
        "value of another axis, the spread across repeats shown), and predicted against "
        "measured tok/s when the sweep recorded predictions.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite --plots files that exist."),
) -> None:
    """Say whether the ranking of a sweep's cells is settled (and why not), compare
    neighbours in the ranking with intervals, show how stable each cell is, each outcome
    against each axis, contaminated cells and drift with execution order.

    Example: bmoe analyze sweep bench-data/2026-11-29-tiny-cache-lanes
    Example: bmoe analyze sweep bench-data/2026-11-29-tiny-cache-lanes --plots plots/
    (or: bmoe analyze sweep sweeps/bench-tiny-cache-lanes.toml, for its latest folder)
    """
    check_format(fmt)
    from bmoe.analyze.sweep import analyze_sweep
    from bmoe.analyze.views import SWEEP
    from bmoe.formats.archive import read_predictions
    from bmoe.render.tables import render
    from bmoe.sweep.archive import find_latest, load_results

    if folder.is_file():
        cfg = _config_named(folder)
        latest = find_latest(Path(cfg.settings.output), cfg.settings.name)
        if latest is None:
            raise BmoeError(f"no folder of sweep {cfg.settings.name!r} under {cfg.settings.output}")
        folder = latest

    results = load_results(folder)
    if results.empty:
        raise BmoeError(f"{folder}: no attempts recorded yet")
    predictions = read_predictions(folder)
    views = analyze_sweep(results, outcome=outcome, predictions=predictions)
    shown = views
    if fmt == "table":  # cell folders as c1, c2, ... with a legend (see bmoe.render.cells)
        from bmoe.analyze.sweep import axes_of
        from bmoe.render.cells import with_short_ids

        shown = with_short_ids(views, results["cell"], axes_of(results))
    text = render(shown, fmt, console, titles=SWEEP.titles(outcome=outcome))
    if text is not None:
        console.out(text, end="")
    else:  # the terminal: the verdict again where the eye lands, after the tables
        console.print(views["verdict"]["verdict"], highlight=False)
    if plots is not None:
        _answer_plots(results, outcome, plots, force)
        compared = views.get("predicted")
        if compared is not None and len(compared):
            from bmoe.formats.outputs import check_output
            from bmoe.render.plots import save_figure
            from bmoe.render.plots.predict import predicted_vs_measured_plot

            check_output(plots / "predicted.png", force=force)
            path = save_figure(predicted_vs_measured_plot(compared), plots / "predicted.png")
            err_console.print(literal(f"wrote {path}"), highlight=False)


def _config_named(path: Path):
    """The sweep configuration named in place of its folder; a file that is not one (not
    TOML, or no [sweep] table) is refused as neither."""
    import tomllib

    from bmoe.sweep.config import config_text, parse_config

    neither = BmoeError(
        f"{path}: not a sweep folder or configuration (give the folder a sweep wrote, such as "
        "bench-data/<date>-<name>, or the TOML file with a [sweep] table it ran)"
    )
    try:
        text = config_text(path)
        doc = tomllib.loads(text)
    except (BmoeError, tomllib.TOMLDecodeError):
        raise neither from None
    except RecursionError:  # nested deeper than the parser descends: the checks say so
        return parse_config(text, str(path), base_dir=path.resolve().parent)
    if not isinstance(doc.get("sweep"), dict):
        raise neither
    return parse_config(text, str(path), base_dir=path.resolve().parent)


def _answer_plots(results, outcome: str, folder: Path, force: bool = False) -> None:
    """The outcome against the main axis, one line per value of another (one figure per
    combination of any further axes); by axis value when no axis is numeric."""
    from bmoe.analyze import sweep as sw
    from bmoe.formats.outputs import check_output
    from bmoe.render.plots import save_figure
    from bmoe.render.plots.sweep import outcome_figures, plot_axis_effects

    main = sw.main_axes(results)
    if main is None:
        effects = sw.axis_effects(results, [outcome])
        figures = list(plot_axis_effects(effects[effects["n"] > 0]))
    else:
        x, by = main
        rest = [a for a in sw.axes_of(results) if a not in (x, by)]
        ranked = sw.rank_cells(results, outcome)
        figures = list(outcome_figures(ranked, sw.ok_attempts(results), outcome, x, by, rest))
    try:  # every file checked before the first is written
        for name, _ in figures:
            check_output(folder / f"{name}.png", force=force)
    except BmoeError:
        import matplotlib.pyplot as plt

        for _, fig in figures:
            plt.close(fig)
        raise
    for name, fig in figures:
        path = save_figure(fig, folder / f"{name}.png")
        err_console.print(literal(f"wrote {path}"), highlight=False)
