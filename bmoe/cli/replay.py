"""``bmoe analyze replay`` and ``bmoe analyze drop``: the recorded routing through other
caches, and what cache-aware expert dropping would have saved."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

# A replay uses no linear algebra: the thread pool OpenBLAS starts when numpy loads would
# only spend CPU time. Set before numpy is imported; a value the user chose is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer

from bmoe.analyze import drop as drop_analysis  # imports no pandas: the --fracs default
from bmoe.analyze import replay as replay_analysis
from bmoe.cache import POLICIES, REFERENCE_POLICIES
from bmoe.cli import analyze_app, console, err_console
from bmoe.cli.options import check_format, check_plot
from bmoe.errors import BmoeError
from bmoe.formats.outputs import check_output
from bmoe.formats.route import RouteColumns, RouteTrace, read_route_columns, read_route_trace
from bmoe.render.messages import literal, note_line, warning_line
from bmoe.render.outputs import FORMAT_HELP
from bmoe.render.tables import render


def parse_numbers(text: str, option: str) -> list[float]:
    """``250,500,1e3`` -> [250.0, 500.0, 1000.0]."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(float(part))
        except ValueError:
            raise BmoeError(f"{option} {text!r}: {part!r} is not a number") from None
    if not out:
        raise BmoeError(f"{option} {text!r} names nothing")
    return out


def read_trace(path: Path, columns: Iterable[str] | None = None) -> RouteTrace:
    """The trace at `path` (only `columns` of its rows, when given), warnings printed."""
    return _read(read_route_trace, path, columns)


def read_columns(path: Path, columns: Iterable[str] | None = None) -> RouteColumns:
    """:func:`read_trace` as numpy columns (no pandas for a plain CSV trace)."""
    return _read(read_route_columns, path, columns)


def _read(reader, path: Path, columns: Iterable[str] | None):
    with (
        warnings.catch_warnings(record=True) as caught,
        _busy(literal("reading trace")),
    ):
        warnings.simplefilter("always")
        trace = reader(path, columns)
    for w in caught:
        err_console.print(warning_line(w.message), highlight=False, soft_wrap=True)
    return trace


def _busy(what):
    """A spinner on stderr while `what` runs, where stderr is a terminal (elsewhere rich's
    status shows nothing, and would only start its refresh thread)."""
    return err_console.status(what) if err_console.is_terminal else contextlib.nullcontext()


def _warn_ids(trace: RouteTrace | RouteColumns) -> None:
    """Warn about expert ids at or above the preamble's n_expert (validate calls them errors)."""
    from bmoe.analyze.ids import experts_beyond_declared

    if (said := experts_beyond_declared(trace)) is not None:
        err_console.print(warning_line(said), highlight=False, soft_wrap=True)


def _recorded_point(views, validate: float | None, metrics_summary, metrics_params):
    """(budget MiB, recorded decode hit %) for the plot: the residency column's hit rate at
    the run's budget (--validate, else the metrics file's), when both are known."""
    budget = validate
    if budget is None and metrics_summary:
        budget = metrics_summary.get("cache_budget_MiB")
    if budget is None and metrics_params:
        budget = metrics_params.get("cache_mb")
    hit = views["shape"].get("recorded_hit_pct_decode")
    if not isinstance(budget, int | float) or hit is None or hit != hit:
        return None
    return (float(budget), float(hit))


DROPPING_NOTE = (
    "this trace was recorded with expert dropping on: the replay looks up every expert the "
    "router asked for, dropped ones included"
)


Command = TypeVar("Command", bound=Callable[..., None])


def _with_policy_list(command: Command) -> Command:
    """`command` with ``{policies}`` in its docstring (the help) replaced by the registry's
    policies, one line each: its name and what it evicts."""
    listed = "".join(f"    - {name}: {cls.summary}\n" for name, cls in POLICIES.items())
    command.__doc__ = (command.__doc__ or "").replace("    {policies}\n", listed)
    return command


@analyze_app.command("replay")
@_with_policy_list
def analyze_replay(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="A route trace (CSV or Parquet)."),
    budgets: str | None = typer.Option(
        None,
        "--budgets",
        help="Cache budgets in MiB, comma-separated (default: fractions of the model's expert "
        "set and multiples of one token's experts, plus --validate's).",
    ),
    policies: str | None = typer.Option(
        None,
        "--policies",
        help=f"Policies, comma-separated, from: {', '.join(POLICIES)} (default: "
        f"{', '.join(REFERENCE_POLICIES)}).",
    ),
    turn: int | None = typer.Option(None, "--turn", help="Only this session turn."),
    validate: float | None = typer.Option(
        None,
        "--validate",
        metavar="MIB",
        help="Put the LRU replay at the run's budget next to the hit rate it recorded.",
    ),
    metrics: Path | None = typer.Option(
        None, "--metrics", help="The run's metrics CSV: its summary's cache_hit_pct."
    ),
    csv_out: Path | None = typer.Option(
        None,
        "--csv",
        metavar="OUT",
        help="Write the reference CSV: columns budget_mib, policy, hit_pct_cum, "
        "hit_pct_decode, read_mib.",
    ),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Draw hit % against budget per policy (.png/.svg/.pdf), with the one-token-cycle "
        "line T and the recorded point; with --mrc also the exact LRU curve (OUT.mrc.png).",
    ),
    mrc: bool = typer.Option(
        False, "--mrc", help="Exact LRU miss-ratio curve: every budget, in one pass."
    ),
    prefetch: int | None = typer.Option(
        None,
        "--prefetch",
        metavar="K",
        min=1,
        help="Replay the previous-token bet: prefetch what layers l+1..l+K routed at the "
        "previous token.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random policy."),
    jobs: int | None = typer.Option(
        None,
        "--jobs",
        "-j",
        min=1,
        help="Replays run at once (default: the CPUs); the figures do not depend on it.",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing --csv / --plot files."),
    stream: bool = typer.Option(
        False,
        "--stream",
        help="Read the trace (CSV or Parquet) block by block in constant memory (traces larger "
        "than RAM); all but --prefetch. belady takes a second pass over its lookups spilled to "
        "$TMPDIR (~10 bytes a lookup).",
    ),
) -> None:
    """Replay the recorded routing through cache policies and budgets.

    The policies (each evicts, after a batch, until the cache fits its budget; never an expert
    of the current batch):

    {policies}

    Example: bmoe analyze replay trace.route.csv
    Example: bmoe analyze replay pf.route.csv --budgets 1,2,3,4,6 --validate 3 --metrics pf.csv
    Example: bmoe analyze replay trace.route.csv --policies lru,arc,s3fifo --mrc --plot curve.png
    Example: bmoe analyze replay big.route.parquet --jobs 1
    Example: bmoe analyze replay huge.route.csv --stream --budgets 1000,2000,4000
    Example: bmoe analyze replay huge.route.parquet --stream --policies lru,arc --mrc -f csv
    """
    check_format(fmt)
    budget_list = (
        replay_analysis.check_budgets(parse_numbers(budgets, "--budgets")) if budgets else None
    )
    if policies is None:
        policies = ",".join(REFERENCE_POLICIES)
    names = replay_analysis.check_policies(policies.split(","))
    if stream and prefetch is not None:
        raise BmoeError("--stream does not go with --prefetch (it reads the rows again)")
    inputs = [trace_path] + ([metrics] if metrics is not None else [])
    also = (_mrc_path(plot),) if plot is not None and mrc else ()
    check_plot(plot, inputs, force=force, also=also)
    if csv_out is not None:
        check_output(csv_out, inputs, force=force)
    if stream:
        views, summary, params = _stream_views(
            trace_path, budget_list, names, turn, mrc, validate, metrics, seed, jobs,
            frames=fmt != "table" or plot is not None,
        )  # fmt: skip
        _show(views, fmt, validate, csv_out, plot, summary, params)
        return
    columns = read_columns(trace_path, replay_analysis.REPLAY_COLUMNS)
    _warn_ids(columns)
    # the prefetch replay reads the rows again, as a DataFrame
    trace = columns.to_trace() if prefetch is not None else columns
    del columns
    if budget_list is None:
        budget_list = replay_analysis.default_budgets(trace, [validate] if validate else [])
    summary, params = _read_summary(metrics, validate)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
        console=err_console, transient=True, disable=not err_console.is_terminal,
    ) as bar:  # fmt: skip
        runs = len(budget_list) * len(names) * (2 if prefetch is not None else 1)
        task = bar.add_task("replay", total=runs)
        batches = replay_analysis.prepare_batches(trace, turn)
        if prefetch is None:  # nothing reads the rows again: free them before the replays
            from bmoe.formats.parquet import release_unused

            trace = replay_analysis.without_rows(trace)
            release_unused()
        views = replay_analysis.replay(
            trace,
            budget_list,
            names,
            turn=turn,
            validate_mib=validate,
            metrics_summary=summary,
            mrc=mrc,
            prefetch=prefetch,
            seed=seed,
            jobs=jobs,
            progress=lambda done, total: bar.update(task, completed=done),
            batches=batches,
            frames=fmt != "table" or plot is not None,  # the table's text needs no pandas
        )
    _show(views, fmt, validate, csv_out, plot, summary, params)


def _read_summary(metrics: Path | None, validate: float | None):
    """The summary and parameters of the run's metrics file (None, None without one)."""
    if metrics is None:
        return None, None
    from bmoe.formats.metrics import read_metrics

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = read_metrics(metrics)
    if run.summary.get("cache_hit_pct") is None:
        err_console.print(
            warning_line(f"{metrics}: no cache_hit_pct in its summary"), highlight=False
        )
    if validate is None:
        err_console.print(
            note_line("--metrics is read for --validate MIB; pass the run's budget", "note:"),
            highlight=False,
        )
    return run.summary, run.params


def _show(views, fmt: str, validate, csv_out: Path | None, plot: Path | None, summary, params):
    """Print the views, write the --csv and --plot files."""
    if views["shape"].get("recorded_with_dropping"):
        err_console.print(note_line(DROPPING_NOTE), highlight=False)
    _print_replay(views, fmt, validate)
    if csv_out is not None:
        from bmoe.render.replay import curve_csv

        csv_out.parent.mkdir(parents=True, exist_ok=True)
        csv_out.write_text(curve_csv(views["curve"]), encoding="utf-8")
        err_console.print(literal(f"wrote {csv_out}"), highlight=False)
    if plot is not None:
        _plot(views, plot, _recorded_point(views, validate, summary, params))


#: Rows per block of --stream: the peak follows it (30 M rows: 408 MiB at 256 k rows, 521 MiB
#: at 1 M), the time does not.
STREAM_BLOCK_ROWS = 1 << 18


def _stream_views(
    trace_path: Path,
    budget_list: list[float] | None,
    names: list[str],
    turn: int | None,
    mrc: bool,
    validate: float | None,
    metrics: Path | None,
    seed: int,
    jobs: int | None,
    frames: bool = True,
):
    """The replay's views of the file read block by block (numpy columns), and the metrics
    summary and parameters; the curve and validation as columns without `frames`."""
    from bmoe.analyze.replay_stream import stream_replay
    from bmoe.formats.route import iter_route_columns, read_route_head
    from bmoe.formats.spill import SpillFolder

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        preamble = read_route_head(trace_path)
    if budget_list is None:
        budget_list = replay_analysis.default_budgets(preamble, [validate] if validate else [])
    summary, params = _read_summary(metrics, validate)
    blocks = iter_route_columns(trace_path, STREAM_BLOCK_ROWS, replay_analysis.REPLAY_COLUMNS)
    if turn is not None:
        blocks = (_of_turn(b, turn) for b in blocks)
    with (
        warnings.catch_warnings(record=True) as also,
        err_console.status(literal("replaying block by block")),
        SpillFolder("bmoe-belady-") as spill,  # made only when belady is replayed
    ):
        warnings.simplefilter("always")
        try:
            views = stream_replay(
                preamble, blocks, budget_list, names, mrc=mrc, validate_mib=validate,
                metrics_summary=summary, seed=seed, jobs=jobs, frames=frames, spill=spill,
            )  # fmt: skip
        except BmoeError as exc:
            if turn is not None and "no routing rows" in str(exc):
                raise BmoeError(f"{trace_path}: no turn {turn}") from None
            raise
    for w in [*caught, *also]:
        err_console.print(warning_line(w.message), highlight=False, soft_wrap=True)
    return views, summary, params


def _of_turn(block: dict, turn: int) -> dict:
    """The rows of a block of columns in session turn `turn` (a trace without turns has
    turn 0 only)."""
    if "turn" in block:
        keep = block["turn"] == turn
        return {c: v[keep] for c, v in block.items()}
    return {c: v[: len(v) * (turn == 0)] for c, v in block.items()}


def _print_replay(views, fmt: str, validate: float | None) -> None:
    from bmoe.render import replay as text
    from bmoe.render.tables import print_table, table_cells

    if fmt != "table":
        out = render(views, fmt, console, text.DIGITS)
        console.out(out or "", end="")
        return
    console.out(text.replay_text(views, validate, console.width), highlight=False, end="")
    from bmoe.analyze.views import REPLAY

    extra = {}
    if "mrc_budgets" in views:
        extra["mrc_budgets"] = views["mrc_budgets"]
    depth = 0
    if "prefetch" in views:
        depth = int(views["prefetch"]["depth"].iloc[0]) if len(views["prefetch"]) else 0
        extra["prefetch"] = text.prefetch_display(views["prefetch"])
    for slug, table in extra.items():  # laid out for the console's width
        print_table(console, table_cells(table, text.DIGITS), REPLAY.title(slug, depth=depth))
    if "mrc" in views:
        console.print(
            f"exact LRU curve: {len(views['mrc'])} budget steps from 0 to "
            f"{views['mrc']['budget_mib'].iloc[-1]:.0f} MiB (the whole expert set); "
            "--format csv/json lists them, --plot draws them",
            highlight=False,
        )  # wrapped at the console's width


def _mrc_path(plot: Path) -> Path:
    """Where --mrc's LRU curve goes beside the --plot file."""
    return plot.with_name(f"{plot.stem}.mrc{plot.suffix}")


def _plot(views, plot: Path, recorded) -> None:
    from bmoe.render.plots import replay as plots
    from bmoe.render.plots import save_figure

    t_mib = views["shape"]["t_mib"]
    with err_console.status("drawing"):
        fig = plots.replay_curve_plot(
            views["curve"], t_mib=t_mib, recorded=recorded, mrc=views.get("mrc")
        )
        written = save_figure(fig, plot)
        err_console.print(literal(f"wrote replay plot to {written}"), highlight=False)
        if "mrc" in views:
            mrc_path = _mrc_path(plot)
            written = save_figure(
                plots.mrc_plot(views["mrc"], t_mib=t_mib, recorded=recorded), mrc_path
            )
            err_console.print(literal(f"wrote LRU miss-ratio plot to {written}"), highlight=False)


@analyze_app.command("drop")
def analyze_drop(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="A route trace (CSV or Parquet)."),
    fracs: str = typer.Option(
        ",".join(map(str, drop_analysis.DEFAULT_FRACS)),
        "--fracs",
        help="Thresholds as fractions of the uniform share 1/k, comma-separated.",
    ),
    turn: int | None = typer.Option(None, "--turn", help="Only this session turn."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Drop replay: the miss bytes cache-aware dropping would save, and the gate weight it
    would lose, against dropping the last slots (static top-k).

    Example: bmoe analyze drop trace.route.csv
    Example: bmoe analyze drop drop.route.csv --fracs 0.5,1 --format json
    """
    check_format(fmt)
    frac_list = parse_numbers(fracs, "--fracs")
    trace = read_trace(trace_path)
    _warn_ids(trace)
    result = drop_analysis.drop_replay(trace, frac_list, turn=turn)
    from bmoe.render import replay as text

    if fmt != "table":
        out = render(text.drop_views(result), fmt, console, text.DIGITS)
        console.out(out or "", end="")
        return
    k = next(iter(result.values()))["summary"]["k"]
    name = Path(trace.path).name if trace.path else str(trace_path)
    lines = [*text.drop_header(name, trace.meta, k), ""]
    console.out("\n".join(lines) + "\n", highlight=False, end="")
    for part in result.values():
        console.out(text.drop_phase_text(part, console.width), highlight=False, end="")
