"""``bmoe report``: one self-contained HTML page for a run, a trace or a sweep folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from bmoe.cli import app, err_console
from bmoe.errors import BmoeError
from bmoe.formats.outputs import check_output
from bmoe.render.messages import literal

_KINDS = ("metrics", "route", "compute", "io")


@app.command("report")
def report_command(
    paths: list[Path] = typer.Argument(
        ...,
        metavar="PATH",
        help="A metrics CSV, a route / compute / io trace, or a sweep folder; several sweep "
        "folders give an index page with their trends and a page per sweep.",
    ),
    out: Path = typer.Option(Path("report.html"), "--output", "-o", help="The HTML file."),
    runs: list[str] = typer.Option(
        [], "--run", help="Sweep folders: also show this run (or cell) in full; repeatable."
    ),
    metrics: Path | None = typer.Option(
        None, "--metrics", "-m", help="Traces: the run's metrics CSV (budget, per-token join)."
    ),
    outcome: str = typer.Option("tok_s_mean", "--outcome", help="Sweeps: rank cells by this."),
    title: str | None = typer.Option(None, "--title", help="The page title."),
    force: bool = typer.Option(False, "--force", help="Overwrite HTML files that exist."),
) -> None:
    """Write a single HTML page that opens offline in any browser: run parameters, summary
    tables, stall attribution, plots, the routing matrix, cache replay and the caveats the
    analyses raised. A metrics CSV brings its .metrics sidecar, stdout and the traces
    recorded beside it; a sweep folder (or a folder of loose engine files) gives the ranking,
    the outcome over the axes, stall attribution per cell and the contamination tells.

    Example: bmoe report bench-data/2026-11-29-tiny-cache-lanes -o sweep.html
    Example: bmoe report run.csv -o run.html
    Example: bmoe report run.route.csv --metrics run.csv -o routing.html
    Example: bmoe report bench-data/*-tiny-cache-lanes -o history.html

    An HTML file that exists already is left alone unless --force; an input never is
    overwritten.
    """
    inputs = [*paths, *([metrics] if metrics is not None else [])]
    check_output(out, inputs, force=True)  # first: an input is named as such
    if out.suffix.lower() not in (".html", ".htm"):
        raise BmoeError(f"{out}: the report is HTML; name it .html")
    if len(paths) > 1:
        _history_pages(paths, out, outcome, title, inputs, force)
        return
    check_output(out, inputs, force=force)
    path = paths[0]
    with err_console.status(literal(f"reading {path}")):
        if path.is_dir():
            text = _sweep_page(path, runs, outcome, title)
        else:
            if runs:
                raise BmoeError("--run is for sweep folders")
            text = _file_page(path, metrics, title)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    size_kib = len(text.encode("utf-8")) / 1024
    err_console.print(literal(f"wrote {out} ({size_kib:.0f} KiB)"), highlight=False)


def _history_pages(
    paths: list[Path], out: Path, outcome: str, title: str | None, inputs: list[Path], force: bool
) -> None:
    """The index page at `out` and one page per sweep beside it (``<out stem>-<folder>.html``)."""
    import bmoe
    from bmoe.render import pages as page

    not_folders = [str(p) for p in paths if not p.is_dir()]
    if not_folders:
        raise BmoeError(f"several paths make a history of sweep folders; not a folder: "
                        f"{', '.join(not_folders)}")  # fmt: skip
    archives, links = {}, {}
    for path in paths:
        label = path.resolve().name
        if label in archives:
            raise BmoeError(f"{path}: two sweep folders named {label}")
        archives[label] = bmoe.load_archive(path)
        links[label] = f"{out.stem}-{label}.html"
    for dest in (out, *(out.parent / link for link in links.values())):
        check_output(dest, inputs, force=force)
    out.parent.mkdir(parents=True, exist_ok=True)
    with err_console.status("analysing the sweeps"):
        for label, archive in archives.items():
            text = page.sweep_report(archive, None, (), outcome)
            (out.parent / links[label]).write_text(text, encoding="utf-8")
        index = page.history_report(archives, links, outcome, title=title)
    out.write_text(index, encoding="utf-8")
    err_console.print(f"wrote {out} and {len(links)} sweep pages beside it", highlight=False)


def _sweep_page(path: Path, runs: list[str], outcome: str, title: str | None) -> str:
    import bmoe
    from bmoe.render import pages as page

    archive = bmoe.load_archive(path)
    if len(archive) == 1 and not runs:
        only = next(iter(archive))
        if only.has("metrics"):
            return page.run_report(
                only.metrics, only.pressure,
                {k: only.trace(k) for k in ("route", "compute", "compute_layers", "io")
                 if only.has(k)},
                only.output if only.has("output") else None, title,
            )  # fmt: skip
    with err_console.status("analysing the sweep"):
        return page.sweep_report(archive, title, runs, outcome)


def _file_page(path: Path, metrics: Path | None, title: str | None) -> str:
    from bmoe.formats.load import detect_kind, load_file
    from bmoe.formats.metrics import read_metrics
    from bmoe.formats.runfiles import load_run_files
    from bmoe.render import pages as page

    kind = detect_kind(path)
    obj = load_file(path, kind)
    if kind == "parquet":
        kind = _kind_of(obj)
    if kind not in _KINDS:
        what = kind or "not a telemetry file"
        raise BmoeError(
            f"{path}: {what}; a report takes a metrics CSV, a route / compute / io trace or a "
            "sweep folder"
        )
    if kind == "metrics":
        if metrics is not None:
            raise BmoeError("--metrics is for traces; a metrics CSV is the run itself")
        files = load_run_files(path)
        traces: dict[str, Any] = {}
        for trace_path in files.traces:
            trace_kind = detect_kind(trace_path)
            if trace_kind is None:  # changed since it was found beside the run
                continue
            key = trace_kind
            if trace_kind == "compute" and "compute-layers" in Path(trace_path).name:
                key = "compute_layers"
            traces.setdefault(key, load_file(trace_path, trace_kind))
        output = _output_beside(path)
        return page.run_report(files.run, files.pressure, traces, output, title)
    run = read_metrics(metrics) if metrics is not None else None
    if kind == "compute" and getattr(obj, "layer_granular", False):
        kind = "compute_layers"
    return page.trace_report(obj, kind, title, run)


def _kind_of(obj) -> str | None:
    from bmoe.formats.metrics import MetricsRun
    from bmoe.formats.op_traces import ComputeTrace, IoTrace
    from bmoe.formats.route import RouteTrace

    for cls, kind in ((MetricsRun, "metrics"), (RouteTrace, "route"), (ComputeTrace, "compute"),
                      (IoTrace, "io")):  # fmt: skip
        if isinstance(obj, cls):
            return kind
    return None


def _output_beside(path: Path):
    """The run's stdout / log beside its CSV (``<stem>.out`` or ``<stem>.log``), read."""
    from bmoe.formats.load import detect_kind, load_file

    for suffix in (".out", ".log"):
        candidate = path.with_suffix(suffix)
        if candidate.is_file() and candidate != path:
            kind = detect_kind(candidate)
            if kind in ("protocol", "log"):
                return load_file(candidate, kind)
    return None
