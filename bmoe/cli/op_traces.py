"""``bmoe analyze decode compute|io`` and ``bmoe export trace``: decode-trace views and the
Perfetto export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from bmoe.cli import analyze_app, console, err_console, export_app
from bmoe.cli.options import check_format, check_plot
from bmoe.errors import BmoeError
from bmoe.formats.outputs import check_output
from bmoe.render.messages import literal
from bmoe.render.op_traces import COMPUTE_NOTE, DIGITS, IO_NOTE, STREAM_NOTE
from bmoe.render.outputs import FORMAT_HELP
from bmoe.render.tables import render

decode_app = typer.Typer(
    help="Decode traces: where a token's time went (compute) and how the reads behaved (io).",
    no_args_is_help=True,
)
analyze_app.add_typer(decode_app, name="decode")


def _check_options(
    fmt: str,
    plot: Path | None = None,
    inputs: tuple[Path | None, ...] = (),
    force: bool = False,
    also: tuple[Path, ...] = (),
) -> None:
    check_format(fmt)
    check_plot(plot, inputs, force=force, also=also)


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``A-B`` (inclusive) or ``A`` -> (lo, hi)."""
    if text is None:
        return None
    lo, sep, hi = text.partition("-")
    try:
        first = int(lo)
        last = int(hi) if sep else first
    except ValueError:
        raise BmoeError(f"--steps {text!r}: expected A-B or A (trace steps)") from None
    if last < first:
        raise BmoeError(f"--steps {text!r}: the range ends before it starts")
    return first, last


def _header(path: Path, meta: dict[str, Any]) -> str:
    shown = ("model", "arch", "n_layer", "n_threads", "io_threads", "o_direct", "overlap")
    tokens = " ".join(f"{k}={_spell(meta[k])}" for k in shown if k in meta)
    return f"{path}  {tokens}".rstrip()


def _spell(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


#: Columns of the per-token join the terminal table shows (every column: csv/json/markdown).
PER_TOKEN_COMPUTE = (
    "turn",
    "step",
    "trace_step",
    "wall_ms",
    "io_ms",
    "compute_ms",
    "traced_ms",
    "router_ms",
    "expert_matmul_ms",
)
PER_TOKEN_IO = (
    "turn",
    "step",
    "trace_step",
    "wall_ms",
    "io_ms",
    "busy_ms",
    "busiest_lane_ms",
    "reads",
    "read_bytes",
)


def _emit(
    views: dict, fmt: str, notes: list[str], header: str, per_token: tuple[str, ...] = ()
) -> None:
    if fmt == "table":
        console.print(literal(header), highlight=False)
        for note in notes:
            console.print(literal(f"note: {note}", "dim"), highlight=False)
        if "per_token" in views:
            frame = views["per_token"]
            keep = [c for c in per_token if c in frame]
            if "turn" in frame and frame["turn"].nunique() <= 1:
                keep = [c for c in keep if c != "turn"]
            views = {**views, "per_token": frame[keep]}
            console.print(
                literal("note: per_token shows every column with --format csv or json", "dim")
            )
    text = render(views, fmt, console, DIGITS)
    if text is not None:
        console.out(text, end="")


def _read_trace(path: Path, kind: str):
    """Read `path` as a `kind` trace, or say in one line what it is instead."""
    from bmoe.formats.detect import detect_bytes
    from bmoe.formats.load import read_head
    from bmoe.formats.op_traces import read_compute_trace, read_io_trace

    found = detect_bytes(read_head(path))
    if found not in (kind, "parquet", None):
        command = "compute" if found == "compute" else "io"
        hint = f" (try: bmoe analyze decode {command})" if found in ("compute", "io") else ""
        article = "an" if kind == "io" else "a"
        raise BmoeError(f"{path}: this is a {found} file, not {article} {kind} trace{hint}")
    return read_compute_trace(path) if kind == "compute" else read_io_trace(path)


def _read_metrics(path: Path | None):
    if path is None:
        return None
    from bmoe.formats.metrics import read_metrics

    return read_metrics(path)


def _derived(path: Path, tag: str) -> Path:
    return path.with_name(f"{path.stem}.{tag}{path.suffix}")


@decode_app.command("compute")
def compute(
    file: Path = typer.Argument(
        ..., help="A compute trace (--compute-trace or --compute-trace-layers)."
    ),
    top: int = typer.Option(12, "--top", "-n", help="Ops to list by time (0 = all)."),
    layers: bool = typer.Option(
        False, "--layers", help="Also list time by op class for every layer."
    ),
    metrics: Path | None = typer.Option(
        None, "--metrics", "-m", help="The run's metrics CSV: join per token on step."
    ),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Write time by op class per layer (or per segment) to this .png/.svg/.pdf.",
    ),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite a --plot file that exists."),
) -> None:
    """Where a token's compute time went: by op, faults, by layer, by op class (per-node
    traces) or by segment (layer-granular traces).

    Example: bmoe analyze decode compute ct.compute.csv --layers --metrics ct.csv
    """
    from bmoe.analyze import op_traces as dec

    _check_options(fmt, plot, (file, metrics), force)
    with err_console.status(literal(f"reading {file}")):
        trace = _read_trace(file, "compute")
        run = _read_metrics(metrics)
    with err_console.status("analysing"):
        views = dec.analyze_compute(trace, top or None, run, class_by_layer=layers or bool(plot))
    granularity = views["summary"]["granularity"]
    per_layer = views.get("class_by_layer")
    if not layers:
        views.pop("class_by_layer", None)
    notes = [COMPUTE_NOTE[granularity]]
    if granularity == "node":
        notes.append(STREAM_NOTE)
    _emit(views, fmt, notes, _header(file, trace.meta), PER_TOKEN_COMPUTE)
    if plot is not None:
        from bmoe.render.plots import op_traces as plots
        from bmoe.render.plots import save_figure

        if granularity == "layer":
            fig = plots.segments_bar(views["segments"])
        else:
            fig = plots.class_by_layer(per_layer)
        err_console.print(literal(f"wrote {save_figure(fig, plot)}"), highlight=False)


@decode_app.command("io")
def io(
    file: Path = typer.Argument(..., help="An io trace (--io-trace)."),
    adjacent: bool = typer.Option(
        False, "--adjacent", help="Also list the coalescing ceiling per layer."
    ),
    metrics: Path | None = typer.Option(
        None, "--metrics", "-m", help="The run's metrics CSV: join per token on step."
    ),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Write the latency CDF per lane here and the lane timeline "
        "beside it (<name>.timeline<suffix>).",
    ),
    steps: str | None = typer.Option(
        None, "--steps", help="Trace steps A-B the timeline shows (default: first 4 decodes)."
    ),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite the --plot files if they exist."),
) -> None:
    """How the flash reads behaved: latency percentiles, bandwidth, alignment waste, request
    sizes, lanes, speculative share and the coalescing ceiling.

    Example: bmoe analyze decode io run.io.csv --adjacent --plot io.png
    """
    from bmoe.analyze import op_traces as dec

    also = (_derived(plot, "timeline"),) if plot is not None else ()
    _check_options(fmt, plot, (file, metrics), force, also)
    window = parse_steps(steps)
    with err_console.status(literal(f"reading {file}")):
        trace = _read_trace(file, "io")
        run = _read_metrics(metrics)
    with err_console.status("analysing"):
        views = dec.analyze_io(trace, adjacent, run)
    notes = [IO_NOTE]
    _emit(views, fmt, notes, _header(file, trace.meta), PER_TOKEN_IO)
    if plot is not None:
        from bmoe.analyze.timeline import build_timeline
        from bmoe.render.plots import op_traces as plots
        from bmoe.render.plots import save_figure

        cdf = plots.latency_cdf(dec.io_latency_cdf(trace), views["latency_us"])
        err_console.print(literal(f"wrote {save_figure(cdf, plot)}"), highlight=False)
        if window is None:
            first = dec.decode_rows(trace.rows)["step"].min()
            window = (int(first), int(first) + 3)
        timeline = build_timeline(None, trace, decode_only=True, steps=window)
        fig = plots.lane_timeline(timeline, f"Flash reads by lane, steps {window[0]}-{window[1]}")
        written = save_figure(fig, _derived(plot, "timeline"))
        err_console.print(literal(f"wrote {written}"), highlight=False)


@export_app.command("trace")
def export_trace(
    files: list[Path] = typer.Argument(
        ..., help="A compute trace, an io trace, or one of each from the same run."
    ),
    out: Path = typer.Option(..., "--output", "-o", help="The Chrome trace-event JSON to write."),
    detail: str = typer.Option(
        "node",
        "--compute-detail",
        help="node: one slice per graph node; layer: one per "
        "layer segment (smaller files for long per-node traces).",
    ),
    decode_only: bool = typer.Option(False, "--decode-only", help="Leave the prefill out."),
    steps: str | None = typer.Option(None, "--steps", help="Only trace steps A-B."),
    force: bool = typer.Option(False, "--force", help="Overwrite the output if it exists."),
) -> None:
    """Decode traces as a Chrome trace-event JSON that Perfetto (ui.perfetto.dev) and
    chrome://tracing open: a track per io lane, a compute track, a step track.

    Example: bmoe export trace ct.compute.csv run.io.csv -o decode.json
    """
    from bmoe.analyze.timeline import build_timeline, layer_segments
    from bmoe.formats.load import load_file
    from bmoe.formats.op_traces import ComputeTrace, IoTrace
    from bmoe.render.perfetto import write_chrome_trace

    if detail not in ("node", "layer"):
        raise BmoeError(f"--compute-detail {detail!r}: choose node or layer")
    if len(files) > 2:
        raise BmoeError("export trace takes at most two files (a compute and an io trace)")
    check_output(out, files, force=force)
    compute = io_trace = None
    with err_console.status("reading"):
        for path in files:
            obj = load_file(path)
            if isinstance(obj, ComputeTrace) and compute is None:
                compute = obj
            elif isinstance(obj, IoTrace) and io_trace is None:
                io_trace = obj
            else:
                raise BmoeError(
                    f"{path}: expected a compute or an io trace (at most one of each), "
                    f"got {type(obj).__name__}"
                )
    with err_console.status("laying out"):
        timeline = build_timeline(
            compute, io_trace, decode_only=decode_only, steps=parse_steps(steps)
        )
        if detail == "layer" and timeline.compute is not None and "op_class" in timeline.compute:
            timeline.compute = layer_segments(timeline.compute)
    source = compute if compute is not None else io_trace
    assert source is not None  # FILES has one file at least, and each is a trace
    meta = dict(source.meta)
    with err_console.status(literal(f"writing {out}")):
        write_chrome_trace(timeline, out, meta)
    slices = sum(len(f) for f in (timeline.io, timeline.compute) if f is not None)
    console.print(
        literal(
            f"wrote {out}: {slices} slices over {len(timeline.steps)} steps "
            "(open in https://ui.perfetto.dev)"
        ),
        highlight=False,
    )
    for note in timeline.notes:
        console.print(literal(f"note: {note}"), highlight=False)
