"""``bmoe sweep CONFIG`` (run a grid of engine runs on targets) and ``bmoe analyze sweep DIR``."""

from __future__ import annotations

import signal
import sys
import tomllib
from pathlib import Path

import typer
from rich.text import Text

from bmoe.cli import analyze_app, app, console, err_console
from bmoe.errors import BmoeError
from bmoe.formats.inputs import regular_file
from bmoe.render.messages import literal, printable
from bmoe.render.tables import FORMATS, render


def _dry_run(config, plan, archive_root: Path) -> None:
    from bmoe.sweep.archive import Archive
    from bmoe.sweep.runner import CellContext, assign_targets, planned_command
    from bmoe.sweep.targets import open_target

    archive = Archive(archive_root)
    ctx = CellContext(config, archive)
    targets = {s.name: open_target(s, archive_root / ".state" / "targets") for s in config.targets}
    assigned = assign_targets(plan, config.targets)
    console.print(
        Text.assemble(
            (printable(config.settings.name), "bold"),
            printable(
                f": {len(plan.cells)} cells x {config.settings.repeats} repeats = "
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


def _install_sigterm() -> None:
    def to_interrupt(signum, frame):
        raise KeyboardInterrupt

    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, to_interrupt)


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
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output root (default: the config's output, else bench-data/)."
    ),
    plain: bool = typer.Option(
        False,
        "--plain",
        help="Plain log lines instead of the live display (automatic "
        "when stdout is not a terminal).",
    ),
) -> None:
    """Run an engine across a grid of flags on one or more targets; archive every run.

    Example: bmoe sweep sweeps/tiny-embedded.toml
    Resume after a crash or Ctrl-C: bmoe sweep sweeps/tiny-embedded.toml --resume
    (or: bmoe sweep bench-data/2026-07-30-tiny-embedded)
    """
    from bmoe.render.progress import LiveProgress, PlainProgress
    from bmoe.sweep.archive import CONFIG, Archive, find_latest, folder_name, write_atomic
    from bmoe.sweep.config import load_config, resolved_toml
    from bmoe.sweep.plan import make_plan
    from bmoe.sweep.runner import run_sweep

    folder: Path | None = None
    if config.is_dir():
        folder = config
        config = config / CONFIG
        resume = True
    if config.exists():  # a FIFO or a device would block or never end: named instead
        regular_file(config)
    cfg = load_config(config)
    plan = make_plan(cfg)
    root = output or Path(cfg.settings.output)
    text = resolved_toml(cfg)
    if resume and folder is None:
        folder = find_latest(root, cfg.settings.name)
        if folder is None:
            raise BmoeError(f"no earlier folder of sweep {cfg.settings.name!r} under {root}")
    if dry_run:
        _dry_run(cfg, plan, folder or (root / folder_name(cfg.settings.name)))
        return
    if folder is not None:
        archive = Archive.open(folder)
        previous = (folder / CONFIG).read_text(encoding="utf-8")
        if tomllib.loads(previous) != tomllib.loads(text):
            n = 1
            while (folder / f"sweep.{n}.toml").exists():
                n += 1
            write_atomic(folder / f"sweep.{n}.toml", previous)
            write_atomic(folder / CONFIG, text)
    else:
        archive = Archive.create(root, cfg.settings.name, text)
    _install_sigterm()
    use_plain = plain or not console.is_terminal
    sink = PlainProgress(sys.stdout) if use_plain else LiveProgress(console)
    interrupted = False
    outcome = None
    with sink:
        try:
            outcome = run_sweep(cfg, plan, archive, sink=sink)
        except KeyboardInterrupt:
            interrupted = True
    _write_summary(archive.root)
    if interrupted:
        err_console.print(literal(f"interrupted; resume with: bmoe sweep {archive.root}"))
        raise typer.Exit(130)
    assert outcome is not None
    failed = outcome.failed_runs
    not_run = outcome.not_run
    console.print(
        literal(
            f"{outcome.completed}/{outcome.total} runs complete ({outcome.skipped} from before), "
            f"{len(failed)} failed"
            + (f", {not_run} not run" if not_run else "")
            + f" -> {archive.root}"
        ),
        highlight=False,
    )
    if failed:
        err_console.print(literal("failed: " + ", ".join(failed)), highlight=False)
    if not_run:
        err_console.print(literal(f"resume with: bmoe sweep {archive.root}"), highlight=False)
    if failed or not_run:
        raise typer.Exit(1)


def _write_summary(root: Path) -> None:
    """``summary.md``: the analysis of what the folder holds, as markdown."""
    from bmoe.analyze.sweep import analyze_sweep
    from bmoe.render.tables import render_markdown
    from bmoe.sweep.archive import SUMMARY, load_results, write_atomic

    try:
        results = load_results(root)
    except BmoeError:
        return
    if results.empty:
        return
    views = analyze_sweep(results)
    title = f"# Sweep {results.attrs.get('name') or root.name}\n\n"
    write_atomic(root / SUMMARY, title + render_markdown(views))


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
    fmt: str = typer.Option("table", "--format", "-f", help=f"One of {', '.join(FORMATS)}."),
    plots: Path | None = typer.Option(
        None, "--plots", help="Also write one figure per outcome against each axis here."
    ),
) -> None:
    """Rank a sweep's cells, show each outcome against each axis, flag contaminated cells
    and check for order effects.

    Example: bmoe analyze sweep bench-data/2026-07-30-tiny-embedded
    (or: bmoe analyze sweep sweeps/tiny-embedded.toml, for its latest folder)
    """
    from bmoe.analyze.sweep import analyze_sweep
    from bmoe.sweep.archive import find_latest, load_results
    from bmoe.sweep.config import load_config

    if folder.is_file():
        cfg = load_config(folder)
        latest = find_latest(Path(cfg.settings.output), cfg.settings.name)
        if latest is None:
            raise BmoeError(f"no folder of sweep {cfg.settings.name!r} under {cfg.settings.output}")
        folder = latest

    results = load_results(folder)
    if results.empty:
        raise BmoeError(f"{folder}: no attempts recorded yet")
    views = analyze_sweep(results, outcome=outcome)
    text = render(views, fmt, console)
    if text is not None:
        console.out(text, end="")
    if plots is not None:
        from bmoe.analyze.sweep import axis_effects
        from bmoe.render.plots import save_figure
        from bmoe.render.plots.sweep import plot_axis_effects

        effects = axis_effects(results)
        for name, fig in plot_axis_effects(effects):
            path = save_figure(fig, plots / f"{name}.png")
            err_console.print(literal(f"wrote {path}"), highlight=False)
