"""``bmoe profile`` and ``bmoe predict``: calibrate a device from recorded runs, then predict
the speed of configurations that were never run."""

from __future__ import annotations

import re
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.text import Text

from bmoe.cli import app, console, err_console
from bmoe.cli.options import check_format
from bmoe.errors import BmoeError
from bmoe.render.messages import labelled, literal, printable, warning_line
from bmoe.render.outputs import CSV_FORMULAS, FORMAT_HELP

if TYPE_CHECKING:
    pass

DIGITS = {
    "tok_s": 3,
    "tok_s_low": 3,
    "tok_s_high": 3,
    "steady_tok_s": 3,
    "steady_tok_s_low": 3,
    "steady_tok_s_high": 3,
    "warmup_tokens": 0,
    "mib_per_token": 3,
    "hit_pct": 2,
    "hit_pct_decode": 2,
    "token_ms": 1,
    "compute_ms": 1,
    "flash_ms": 1,
    "mgmt_ms": 1,
    "compute_pct": 1,
    "flash_pct": 1,
    "mgmt_pct": 1,
    "misses_per_token": 1,
    "prefetched_per_token": 1,
    "latency_ms": 3,
    "latency_ms_p10": 3,
    "latency_ms_p90": 3,
    "batch_overhead_ms": 3,
    "mib_s": 0,
    "tok_s_predicted": 3,
    "tok_s_low_predicted": 3,
    "tok_s_high_predicted": 3,
    "steady_tok_s_predicted": 3,
    "steady_tok_s_low_predicted": 3,
    "steady_tok_s_high_predicted": 3,
    "steady_tok_s_error_pct": 1,
    "mib_per_token_predicted": 3,
    "hit_pct_predicted": 2,
    "tok_s_error_pct": 1,
    "mib_per_token_error": 3,
    "hit_pct_error": 2,
    "interval_pct": 1,
    "interval_width_pct": 1,
    "faults_per_token": 1,
    "interval_pct_predicted": 1,
    "faults_per_token_predicted": 1,
}


def _show(views: dict, fmt: str, group: str, **params: object) -> None:
    """`views` (by slug) in `fmt`, tables and markdown under their titles in the catalogue's
    `group` (filled with `params`)."""
    from bmoe.analyze.views import GROUPS
    from bmoe.render.predict import VIEW_DIGITS
    from bmoe.render.tables import render

    titles = GROUPS[group].titles(**params)
    out = render(views, fmt, console, {**DIGITS, **VIEW_DIGITS}, titles)
    if out is not None:
        console.out(out, end="")


def _numbers(text: str, option: str) -> list[int]:
    try:
        values = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BmoeError(f"{option} {text!r}: not a list of whole numbers") from None
    if not values or min(values) < 1:
        raise BmoeError(f"{option} {text!r}: give whole numbers >= 1")
    return values


@app.command("profile")
def profile_command(
    paths: list[Path] = typer.Argument(
        None,
        metavar="DIR|FILES",
        help="Metrics CSVs of any version (their route / io / compute traces, end-of-run log, "
        ".metrics sidecar and sweep record beside them are found by name) or folders of runs "
        "(a sweep folder).",
    ),
    out: Path | None = typer.Option(None, "--output", "-o", help="Write the profile (JSON)."),
    trace_path: Path | None = typer.Option(
        None,
        "--trace",
        metavar="ROUTE_TRACE",
        help="A route trace of the same model: the expert sizes (refused when its n_layer, "
        "n_expert, top-k or sizes disagree with the runs').",
    ),
    model_path: Path | None = typer.Option(
        None,
        "--model",
        "-m",
        metavar="GGUF",
        help="The model file: the expert sizes from its tensor table (refused when its "
        "n_layer or n_expert, or the expert sizes the runs' summaries imply, disagree with "
        "the runs').",
    ),
    allow_traced: bool = typer.Option(
        False,
        "--allow-traced",
        help="Take compute time from compute-traced runs when there is no other (the profile "
        "records the caveat: instrumented compute is slower).",
    ),
    coverage: float = typer.Option(
        0.8, "--coverage", help="Coverage of the prediction intervals (0.8: an 80 % interval)."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Refuse (exit 2) a profile with an unsettled term."
    ),
    probe: str | None = typer.Option(
        None,
        "--probe",
        metavar="TARGET",
        help="Measure flash on a target directly (local, adb[:SERIAL], ssh:[USER@]HOST): "
        "O_DIRECT reads at several sizes and lane counts; replaces the runs' flash table.",
    ),
    probe_file: str | None = typer.Option(
        None, "--probe-file", metavar="PATH", help="The file the probe reads (on the target)."
    ),
    probe_sizes: str = typer.Option(
        "65536,262144,1048576", "--probe-sizes", help="Request sizes in bytes."
    ),
    probe_lanes: str = typer.Option("1,2,4", "--probe-lanes", help="Lane counts."),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite an -o file that exists."),
) -> None:
    """Build a device profile from recorded runs: flash latency by lanes, compute,
    cache-management and overlap-stall time per token, memory pressure (major faults against
    the memory a configuration asks for), the prefill rate, the model's expert sizes. Each
    term says which runs and columns it came from and whether it is settled; a term no run
    measured is named absent. The model's own error is measured by holding out each
    configuration the runs measured and predicting it from the others (unknown, and the
    intervals the spread's only, with one configuration).

    Example: bmoe profile bench-data/2026-11-29-tiny-cache-lanes -o tiny.json
    Example: bmoe profile phone/*.csv --trace gemma.route.csv -o gemma.json
    Example: bmoe profile a.csv b.csv --model model.gguf --strict -o device.json
    Example: bmoe profile runs/ --probe local --probe-file model.gguf -o device.json
    """
    check_format(fmt)
    if not 0 < coverage < 1:
        raise BmoeError(f"--coverage {coverage}: give a fraction between 0 and 1 (e.g. 0.8)")
    if out is not None:
        from bmoe.formats.outputs import check_output

        check_output(out, [*(paths or ()), trace_path, model_path], force=force)
    if probe is not None and probe_file is None:
        raise BmoeError("--probe needs --probe-file (the file to read on the target)")
    flash = None
    if probe is not None and probe_file is not None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from bmoe.sweep.probe import probe as run_probe

        sizes = _numbers(probe_sizes, "--probe-sizes")
        lanes = _numbers(probe_lanes, "--probe-lanes")
        with Progress(
            TextColumn("probing"), BarColumn(), MofNCompleteColumn(),
            console=err_console, transient=True, disable=not err_console.is_terminal,
        ) as bar:  # fmt: skip
            task = bar.add_task("probe", total=None)
            with tempfile.TemporaryDirectory(prefix="bmoe-probe-") as state:
                flash = run_probe(
                    probe, probe_file, Path(state), sizes, lanes,
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )  # fmt: skip
    if not paths:
        if flash is None:
            raise BmoeError("give runs to build a profile from (or --probe TARGET)")
        _show({"flash": flash}, fmt, "profile")
        if out is not None:
            err_console.print(
                labelled("note:", "yellow", "a probe alone measures flash only; give runs too "
                         "to write a profile"),
                highlight=False,
            )  # fmt: skip
        return
    from bmoe.analyze.device import build_profile, check_settled, profile_runs
    from bmoe.formats.profile import write_profile
    from bmoe.formats.runfiles import read_recorded_runs

    sizes_given, sizes_from, model_meta = _model_sizes(model_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = profile_runs(read_recorded_runs(paths))
        trace = _read_route(trace_path) if trace_path is not None else None
        profile = build_profile(
            runs,
            allow_traced=allow_traced,
            trace=trace,
            expert_sizes=sizes_given,
            sizes_from=sizes_from,
            coverage=coverage,
            model_meta=model_meta,
        )
    for w in caught:
        err_console.print(warning_line(w.message), highlight=False)
    if flash is not None:
        from bmoe.analyze.device import with_probe

        profile = with_probe(profile, flash, f"{probe} ({probe_file})")
    _show_profile(profile, fmt)
    check_settled(profile, strict)
    if out is not None:
        read = [f.path for r in runs for f in (r.metrics, r.route, r.io, r.compute) if f]
        check_output(out, [*read, trace_path, model_path], force=force)
        write_profile(profile, out)
        err_console.print(literal(f"wrote {out} ({len(runs)} runs)"), highlight=False)


def _model_sizes(path: Path | None):
    """Expert sizes per MoE layer from a GGUF's tensor table, where they came from, and the
    model's shape (n_layer, n_expert) to check the runs against (None without a model)."""
    if path is None:
        return None, None, None
    from bmoe.engine.embedded.layout import read_layout

    layout = read_layout(path)
    sizes = layout.expert_sizes()
    if not sizes:
        raise BmoeError(f"{path}: no expert tensors (not a mixture-of-experts model)")
    meta = {"n_layer": layout.n_layer, "n_expert": layout.n_expert}
    return sizes, f"the model file {path}", meta


def _read_route(path: Path):
    from bmoe.cli.replay import read_trace

    return read_trace(path)


def _show_profile(profile, fmt: str) -> None:
    """The profile, its answer first: what a token costs (the headline), then what to weigh
    (implausible fits, notes, absent and unsettled terms, grouped), then the terms, the flash
    table, the runs and the held-out predictions per configuration. JSON and CSV carry
    every figure, and the caveats go to stderr."""
    from bmoe.analyze.device.checks import implausible_fits
    from bmoe.render.predict import (
        profile_caveats,
        profile_headline,
        profile_notes,
        profile_tables,
        profile_views,
    )

    caveats = profile_caveats(profile, implausible_fits(profile))
    if fmt in ("json", "csv"):
        _show(profile_views(profile), fmt, "profile")
        _print_caveat_lines([*caveats, *profile_notes(profile)], err_console)
        return
    _print_lines(profile_headline(profile), fmt)
    _print_caveat_lines(caveats, console, fmt)
    _show(profile_tables(profile), fmt, "profile")
    _print_caveat_lines(profile_notes(profile), console, fmt, "notes")


def _print_lines(lines: list[str], fmt: str = "table") -> None:
    """Headline lines, each wrapped to the console under its own text (``  compute  ...``
    goes on in line with ``1.45``)."""
    for line in lines:
        head = re.match(r"( *\S+(?: \S+)?: | +\S+(?: error)? +)", line)
        indent = len(head.group(1)) if head and len(head.group(1)) < 20 else 2
        for part in _wrap(line, console.width, indent):
            console.print(literal(part), highlight=False)
    if fmt == "markdown":
        console.print()


def _wrap(text: str, width: int, indent: int) -> list[str]:
    import textwrap

    return textwrap.wrap(
        text, width=max(width, 40), subsequent_indent=" " * indent, break_on_hyphens=False
    ) or [""]


def _print_caveat_lines(caveats, target, fmt: str = "table", heading: str = "to weigh") -> None:
    """(label, text) lines, indented under a heading that counts them (stdout in a table or
    markdown view, after the answer; stderr with JSON and CSV)."""
    if not caveats:
        return
    styles = {"implausible:": "bold red", "unsettled:": "red", "caveat:": "yellow",
              "absent:": "yellow"}  # fmt: skip
    mine = target is console and fmt in ("table", "markdown")
    if mine:
        target.print(literal(f"{heading} ({len(caveats)}):"), highlight=False)
    lead = ("- " if fmt == "markdown" else "  ") if mine else ""
    for label, text in caveats:
        parts = _wrap(f"{lead}{label} {printable(text)}", target.width, len(lead) + 2)
        first = Text(parts[0])
        first.stylize(styles.get(label, "cyan"), len(lead), len(lead) + len(label))
        target.print(first, highlight=False)
        for part in parts[1:]:
            target.print(literal(part), highlight=False)


def _split_paths(paths: list[Path]):
    """The route trace among `paths` (at most one) and the measured things (sweep folders,
    metrics files, folders of them)."""
    from bmoe.formats.detect import detect_bytes
    from bmoe.formats.load import read_head

    trace, measured = None, []
    for path in paths:
        kind = None
        if path.is_file():
            try:
                kind = detect_bytes(read_head(path, 4096))
            except OSError as exc:
                raise BmoeError(f"{path}: cannot read ({exc.strerror})") from None
        elif not path.exists():
            raise BmoeError(f"{path}: no such file or folder")
        if kind == "parquet":
            from bmoe.formats.parquet import parquet_kind

            kind = parquet_kind(path)
        if kind == "route":
            if trace is not None:
                raise BmoeError(f"two route traces given ({trace}, {path}): give one routing")
            trace = path
        else:
            measured.append(path)
    return trace, measured


@app.command("predict")
def predict_command(
    paths: list[Path] = typer.Argument(
        None,
        metavar="[TRACE] [MEASURED]...",
        help="The route trace of one recorded run (CSV or Parquet), and with --against what "
        "to compare with: a sweep folder, or metrics files (or folders of them).",
    ),
    profile_path: Path = typer.Option(
        ..., "--profile", "-p", help="A device profile (bmoe profile -o)."
    ),
    grid: list[str] = typer.Option(
        None,
        "--grid",
        "-g",
        help="Configurations, an axis a --grid (or several in one: "
        "cache_mb=64,128,io_threads=1,4): -g cache_mb=64,128 -g io_threads=1,4 -g prefetch=0,1 "
        "-g overlap=0,1. Every combination is predicted.",
    ),
    policy: str = typer.Option("lru", "--policy", help="Cache policy of the replay."),
    drop: float | None = typer.Option(
        None,
        "--drop",
        metavar="F",
        help="Replay --drop-cold-experts F: a decode miss with gate weight below F/k is not "
        "read (never a token's top slot).",
    ),
    against_flag: bool = typer.Option(
        False,
        "--against",
        help="Put every measured cell of the sweep folder or metrics files given next to its "
        "prediction (each file matched to its configuration by its preamble), with the "
        "error, the interval's coverage and width. Cells a profile run measured are labelled "
        "in sample and left out of the headline. Without a route trace, each file's own "
        "reads are priced (the time model checked, given the reads).",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Refuse (exit 2) a profile with an unsettled term."
    ),
    csv_out: Path | None = typer.Option(
        None, "--csv", metavar="OUT", help=f"Also write the table as CSV ({CSV_FORMULAS})."
    ),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    force: bool = typer.Option(False, "--force", help="Overwrite a --csv file that exists."),
) -> None:
    """Predict tok/s, MiB/token, hit % and the stall attribution (compute / flash wait /
    mgmt) of configurations from one run's routing and a device profile. MiB/token and hit %
    come from the replay; tok/s has an interval of the profile's stated coverage (the terms'
    spread and the model's own error; the spread's only, and said so, when the profile could
    not measure its error). A serial cell from a profile of --overlap runs only is marked
    unpriced. tok_s is
    the whole decode's rate (what a sweep measures), steady_tok_s the rate after the warm-up
    (the run analysis's steady-state rule on the predicted tokens; none under 32 tokens).

    Example: bmoe predict run.route.csv --profile device.json --grid cache_mb=64,256,1024
    Example: bmoe predict run.route.csv -p device.json -g cache_mb=128,256 -g io_threads=1,4
    Example: bmoe predict run.route.csv -p device.json --against bench-data/2026-11-29-small-traces
    Example: bmoe predict -p phone.json --against phone/*.csv
    """
    check_format(fmt)
    from bmoe.analyze import device as prediction
    from bmoe.formats.profile import read_profile

    trace_path, measured = _split_paths(list(paths or []))
    if measured and not against_flag:
        raise BmoeError(
            f"{measured[0]} is not a route trace: to compare with measured runs, add --against"
        )
    if against_flag and not measured:
        raise BmoeError("--against needs a sweep folder or metrics files to compare with")
    if not grid and not against_flag:
        raise BmoeError("give --grid (the configurations to predict) or --against SWEEP_DIR")
    if csv_out is not None:
        from bmoe.formats.outputs import check_output

        check_output(csv_out, (trace_path, profile_path, *measured), force=force)
    profile = read_profile(profile_path)
    prediction.check_settled(profile, strict)
    cells = prediction.parse_grid(grid) if grid else None
    trace = _read_route(trace_path) if trace_path is not None else None
    if trace is None and not against_flag:
        raise BmoeError("give the route trace of a recorded run to predict --grid from")
    from bmoe.analyze.device import interval_kind
    from bmoe.analyze.device.checks import implausible_fits
    from bmoe.render.predict import (
        against_headline,
        against_summary,
        against_view,
        interval_words,
        predict_headline,
        predict_views,
        profile_caveats,
    )

    readable = fmt in ("table", "markdown")
    if against_flag:
        views = _against(trace, profile, measured, policy, drop)
        table = views["cells"]
        if readable:
            _print_lines(against_headline(views["summary"]), fmt)
            compared, notes = against_view(table)
            shown = {"compared": compared}
            if notes:
                shown["left_out"] = notes
            shown["summary"] = against_summary(views["summary"])
        else:
            shown = views
        params = {}
    else:
        assert trace is not None and cells is not None  # checked above
        table = prediction.predict(trace, profile, cells, policy=policy, drop=drop)
        claimed = interval_kind(profile)[1]
        params = {"interval": interval_words(profile.coverage, claimed)}
        if readable:
            _print_lines(predict_headline(table, profile.coverage, claimed), fmt)
            shown = predict_views(table)
        else:
            shown = {"predicted": table}
    _show(shown, fmt, "predict", **params)
    # then what to weigh: the intervals, unpriced cells, the profile's own caveats
    weigh = _interval_notes(profile, table if not against_flag else None)
    if trace is not None and trace.recorded_with_dropping:
        weigh.append(("note:", "this trace was recorded with expert dropping on: the "
                      "prediction reads every expert the router asked for, dropped ones "
                      "included"))  # fmt: skip
    weigh += profile_caveats(profile, implausible_fits(profile))
    _print_caveat_lines(weigh, console if readable else err_console, fmt)
    if csv_out is not None:
        csv_out.parent.mkdir(parents=True, exist_ok=True)
        import pandas as pd

        from bmoe.render.tables import frame_csv

        csv_out.write_text(frame_csv(pd.DataFrame(table)), encoding="utf-8")
        err_console.print(f"wrote {csv_out}", highlight=False)


def _interval_notes(profile, table) -> list[tuple[str, str]]:
    """What the intervals are made of, and the cells whose time the profile does not price,
    as (label, line)."""
    from bmoe.analyze.device import interval_kind
    from bmoe.render.predict import unpriced_notes

    kind, claimed = interval_kind(profile)
    out = []
    if not claimed:
        out.append(("note:", f"intervals: {kind}; they do not claim "
                    f"{100 * profile.coverage:.0f} % coverage (give the profile runs of two "
                    "configurations or more)"))  # fmt: skip
    out += [("unpriced:", line) for line in (unpriced_notes(table) if table is not None else [])]
    memory = unpriced_notes(table, "memory_note") if table is not None else []
    out += [("memory:", line) for line in memory]
    return out


def _against(trace, profile, measured: list[Path], policy: str, drop: float | None) -> dict:
    """A sweep folder (one, with a manifest) or loose metrics files, next to the prediction."""
    from bmoe.analyze import device as prediction
    from bmoe.formats.archive import MANIFEST

    sweeps = [p for p in measured if p.is_dir() and (p / MANIFEST).is_file()]
    if sweeps:
        if len(measured) > 1:
            raise BmoeError("--against takes one sweep folder, or metrics files: not both")
        if trace is None:
            raise BmoeError(
                f"{sweeps[0]} is a sweep: give the route trace of one of its runs to replay"
            )
        from bmoe.sweep.archive import load_results

        return prediction.against(trace, profile, load_results(sweeps[0]), policy=policy,
                                  drop=drop, sweep_dir=sweeps[0])  # fmt: skip
    from bmoe.analyze.device import against_files, profile_runs
    from bmoe.formats.runfiles import read_recorded_runs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = profile_runs(read_recorded_runs(measured))
    for w in caught:
        err_console.print(warning_line(w.message), highlight=False)
    return against_files(trace, profile, runs, drop=drop)
