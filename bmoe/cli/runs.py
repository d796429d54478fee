"""``bmoe analyze metrics | stall | compare | contamination``: run-level analysis commands."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import typer

from bmoe.analyze.compare import REFUSE, compare_many
from bmoe.analyze.contamination import contamination_flags
from bmoe.analyze.metrics import STABLE_FIELDS, summarize_runs, summary_tables
from bmoe.analyze.stall import memory_picture, stall_attribution
from bmoe.cli import analyze_app, console, err_console
from bmoe.cli.options import check_format, check_plot
from bmoe.formats.runfiles import load_run_files
from bmoe.render.messages import literal, note_line
from bmoe.render.outputs import FORMAT_HELP
from bmoe.render.runs import DIGITS
from bmoe.render.tables import render, transposed


def _emit(views: dict, fmt: str, titles: dict | None = None) -> None:
    text = render(views, fmt, console, DIGITS, titles)
    if text is not None:
        console.out(text, end="")


def _emit_comparisons(comparisons: list, fmt: str) -> None:
    """Each comparison's table and method under its pair's titles; json and csv give one
    ``comparison``, ``method`` and ``concerns`` view, every row led by its pair's files
    (``baseline``, ``candidate``)."""
    from bmoe.analyze.views import COMPARE

    pairs = [{"baseline": Path(c.a).name, "candidate": Path(c.b).name} for c in comparisons]
    if fmt == "table" or fmt == "markdown":
        for comp, pair in zip(comparisons, pairs, strict=True):
            views: dict = {"comparison": comp.table, "method": comp.method}
            if fmt != "table" and len(comp.concerns):
                views["concerns"] = comp.concerns
            _emit(views, fmt, COMPARE.titles(a=pair["baseline"], b=pair["candidate"]))
        return

    both = list(zip(comparisons, pairs, strict=True))

    def led(frames: list[pd.DataFrame]) -> pd.DataFrame:
        parts = [pd.concat([pd.DataFrame(p, index=f.index), f], axis=1)
                 for f, (_c, p) in zip(frames, both, strict=True)]  # fmt: skip
        return pd.concat(parts, ignore_index=True)

    _emit({
        "comparison": led([c.table for c in comparisons]),
        "method": pd.DataFrame([{**p, **c.method} for c, p in both]),
        "concerns": led([c.concerns for c in comparisons]),
    }, fmt)  # fmt: skip


@analyze_app.command("metrics")
def metrics_command(
    files: list[Path] = typer.Argument(..., help="Metrics CSVs (any version)."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Per-run summary: tok/s (mean, median, p5/p95, min/max, steady state, effective),
    prefill, TTFT, cache hit, MiB/token, stall and mgmt ms/token, and the pressure table from a
    `.metrics` sidecar beside each CSV. json/csv give one record per file with stable names
    (null where the file cannot say); markdown gives the tables for a benchmarks page.

    Example: bmoe analyze metrics bench/*.csv --format markdown
    """
    check_format(fmt)
    files = _metrics_only(files)
    loaded = [load_run_files(path) for path in files]
    frame = summarize_runs([f.run for f in loaded], [f.pressure for f in loaded])
    if fmt in ("json", "csv"):
        _emit({"runs": frame}, fmt)
        return
    views = summary_tables(frame)
    if fmt == "table":
        legend = None
        labels = next(iter(views.values()))["run"] if views else []
        if any(len(str(label)) > LONG_LABEL for label in labels):  # run1, run2, ... and a key
            from bmoe.render.cells import short_ids

            ids = short_ids(labels, "run")
            legend = pd.DataFrame({"run": list(ids.values()), "file": frame["file"]})
            views = {n: v.assign(run=v["run"].map(ids)) for n, v in views.items()}
        views = {name: transposed(view, "run", DIGITS) for name, view in views.items()}
        if legend is not None:
            views = {"runs": legend, **views}
    _emit(views, fmt)


#: Run labels longer than this are shown as run1, run2, ... with a table naming their files.
LONG_LABEL = 16


#: How a skipped file is described (its kind as bmoe reads it).
KIND_NAMES = {
    "route": "route trace", "compute": "compute trace", "io": "io trace",
    "protocol": "progress stream", "log": "run log", "pressure": ".metrics sidecar",
    "state": "state snapshot",
}  # fmt: skip


def _metrics_only(files: list[Path]) -> list[Path]:
    """The metrics files among `files` (a glob such as ``runs/*.csv`` also matches the traces
    written beside each run); the others are named in one note. A single file, or a list
    holding no metrics file, is read as given, so its error says what is wrong with it."""
    if len(files) < 2:
        return files
    from bmoe.formats.load import content_kind

    kinds = [content_kind(path) for path in files]
    keep = [path for path, kind in zip(files, kinds, strict=True) if kind == "metrics"]
    if not keep:
        return files
    skipped = [
        f"{path} ({KIND_NAMES.get(kind or '', 'not a telemetry file')})"
        for path, kind in zip(files, kinds, strict=True)
        if kind != "metrics"
    ]
    if skipped:
        err_console.print(
            note_line(f"skipped {len(skipped)} of {len(files)} files, not metrics CSVs: "
                      + ", ".join(skipped), "note:"),
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    return keep


@analyze_app.command("stall")
def stall_command(
    file: Path = typer.Argument(..., help="A metrics CSV."),
    plot: Path | None = typer.Option(
        None, "--plot", help="Write the per-token attribution and memory picture (.png/.svg/.pdf)."
    ),
    threads: int | None = typer.Option(
        None, "--threads", help="Compute threads, for files whose preamble does not say."
    ),
    overlap: bool | None = typer.Option(
        None,
        "--overlap/--serial",
        help="Override the overlap mode (default: preamble or inferred).",
    ),
    tokens: bool = typer.Option(False, "--tokens", help="Also print the per-token rows."),
    force: bool = typer.Option(False, "--force", help="Overwrite a --plot file that exists."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Where each token's time went, in parts that add up to the wall time: flash wait (io_ms
    serial, stall_ms under overlap), cache mgmt, compute (cpu_ms / threads, up to the wall the
    waits left) and the unattributed remainder (off-CPU). Busy time beyond the wall (the I/O
    lanes' and other threads' CPU during the waits) is shown apart as overlapped. Falls back to
    the compute_ms residual, labelled, where cpu_ms is unmeasured.

    Example: bmoe analyze stall run.csv --plot run-stall.png
    """
    check_format(fmt)
    check_plot(plot, (file,), force=force)
    files = load_run_files(file)
    att = stall_attribution(files.run, threads=threads, overlap=overlap)
    run_figures = {"file": str(file), **att.figures()}
    if att.notes:
        run_figures["notes"] = "; ".join(att.notes)
    views: dict = {"run": run_figures, "attribution": att.summary}
    if tokens:
        views["tokens"] = att.tokens
    _emit(views, fmt)
    if plot is not None and att.tokens.empty:
        err_console.print(literal(f"note: {file.name} has no token rows; no plot written"))
    elif plot is not None:
        from bmoe.render.plots import save_figure
        from bmoe.render.plots.runs import stall_figure

        memory = memory_picture(files.run)
        if len(memory.columns) <= 2:
            err_console.print("note: no memory columns in this file; plotting attribution only")
        fig = stall_figure(
            att.tokens,
            memory,
            title=f"{file.name}: stall attribution",
            compute_label=att.compute_source,
        )  # fmt: skip
        err_console.print(literal(f"wrote {save_figure(fig, plot)}"))


@analyze_app.command("compare")
def compare_command(
    files: list[Path] = typer.Argument(..., help="Baseline CSV first, then one or more others."),
    force: bool = typer.Option(False, "--force", help="Compare even where the runs differ."),
    boot: int = typer.Option(2000, "--boot", help="Bootstrap resamples."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Is B faster than A? Difference in mean and median tok/s with a bootstrap interval over
    steady-state tokens, change in hit rate, MiB/token and each attribution component. Refuses
    runs the telemetry contract says are not comparable (different model or n_expert_used,
    speculation mismatch, instrumented or partial runs) unless --force; warns loudly about
    temp>0, load_all and drop runs.

    Example: bmoe analyze compare baseline.csv candidate.csv
    """
    check_format(fmt)
    loaded = [load_run_files(path) for path in files]
    comparisons = compare_many(loaded, force=force, n_boot=boot, seed=seed)
    _emit_comparisons(comparisons, fmt)
    for comp in comparisons:  # after the figures, where they are read
        title = f"{Path(comp.a).name} (A) vs {Path(comp.b).name} (B)"
        for row in comp.concerns.itertuples():
            level = "FORCED PAST A REFUSAL" if row.level == REFUSE else "WARNING"
            err_console.print(
                note_line(f"({title}, {row.run}): {row.reason}", level),
                highlight=False, soft_wrap=True,
            )  # fmt: skip


@analyze_app.command("contamination")
def contamination_command(
    paths: list[Path] = typer.Argument(
        ..., help="Metrics files, directories, or a sweep folder (its results.parquet)."
    ),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
) -> None:
    """Flag cells whose numbers measure the device rather than the config: compute s/token
    rising as n_expert_used falls, major faults per token an order of magnitude above
    comparable cells, entry states that differ, throughput tracking execution order.

    Example: bmoe analyze contamination bench-data/2026-11-29-tiny-cache-lanes --format json
    """
    from bmoe.sweep.results import runs_table

    check_format(fmt)
    cells = runs_table(paths)
    flags = contamination_flags(cells)
    not_checked = flags.attrs.get("not_checked", [])
    if fmt == "json":
        _emit({"flags": flags}, fmt)
    else:
        shown = flags.assign(cells=[", ".join(map(str, c)) for c in flags["cells"]])
        views: dict = {}
        if fmt == "table":
            views["cells"] = _cells_overview(cells)
        if not shown.empty or fmt != "table":
            views["flags"] = shown
        if not_checked:
            views["not_checked"] = pd.DataFrame({"reason": not_checked})
        if fmt == "table" and "cell" in cells:  # c1, c2, ... and a legend
            from bmoe.render.cells import with_short_ids

            views = with_short_ids(views, cells["cell"])
        from bmoe.analyze.views import CONTAMINATION

        _emit(views, fmt, CONTAMINATION.titles())
    if fmt == "table" and flags.empty:
        console.print("no contamination tells fired")


def _cells_overview(cells: pd.DataFrame) -> pd.DataFrame:
    wanted = ["cell", "order", "n_expert_used", "tok_s_mean", "compute_s_per_token",
              "majflt_per_token", "entry_cpu_temp_c", "entry_mem_available_mb"]  # fmt: skip
    cols = [c for c in wanted if c in cells]
    out = cells[cols]
    return out.sort_values("order") if "order" in out else out


__all__ = ["STABLE_FIELDS"]
