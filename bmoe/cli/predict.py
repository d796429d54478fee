"""``bmoe profile`` and ``bmoe predict``: calibrate a device from recorded runs, then predict
the speed of configurations that were never run."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from bmoe.cli import app, console, err_console
from bmoe.cli.options import check_format
from bmoe.errors import BmoeError
from bmoe.render.messages import labelled, literal, note_line, warning_line
from bmoe.render.outputs import FORMATS

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
}


def _show(views: dict, fmt: str) -> None:
    from bmoe.render.tables import render

    out = render(views, fmt, console, DIGITS)
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
        help="Metrics CSVs (their route / io / compute traces beside them are found by name) "
        "or folders of runs (a sweep folder).",
    ),
    out: Path | None = typer.Option(None, "--output", "-o", help="Write the profile (JSON)."),
    allow_traced: bool = typer.Option(
        False,
        "--allow-traced",
        help="Take compute time from compute-traced runs when there is no other (the profile "
        "records the caveat: instrumented compute is slower).",
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
    fmt: str = typer.Option("table", "--format", "-f", help=f"One of {', '.join(FORMATS)}."),
    force: bool = typer.Option(False, "--force", help="Overwrite an -o file that exists."),
) -> None:
    """Build a device profile from recorded runs: flash latency by request size and lanes,
    compute and cache-management time per token, the prefill rate, the model's expert sizes.

    Example: bmoe profile runs/ -o device.json
    Example: bmoe profile a.csv b.csv c.csv -o device.json
    Example: bmoe profile runs/ --probe local --probe-file model.gguf -o device.json
    Example: bmoe profile --probe adb:R5CT --probe-file /data/local/tmp/model.gguf
    """
    check_format(fmt)
    if out is not None:
        from bmoe.formats.outputs import check_output

        check_output(out, paths or (), force=force)
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
        _show({"flash": flash}, fmt)
        if out is not None:
            err_console.print(
                labelled("note:", "yellow", "a probe alone measures flash only; give runs too "
                         "to write a profile"),
                highlight=False,
            )  # fmt: skip
        return
    from bmoe.analyze.profile import build_profile, read_runs
    from bmoe.formats.profile import write_profile

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = read_runs(paths)
        profile = build_profile(runs, allow_traced=allow_traced)
    for w in caught:
        err_console.print(warning_line(w.message), highlight=False)
    if flash is not None:
        from bmoe.analyze.profile import with_probe

        profile = with_probe(profile, flash, f"{probe} ({probe_file})")
    _show(_profile_views(profile), fmt)
    for caveat in profile.caveats:
        err_console.print(labelled("caveat:", "yellow", caveat), highlight=False)
    if out is not None:
        read = [f.path for r in runs for f in (r.metrics, r.route, r.io, r.compute) if f]
        check_output(out, read, force=force)
        write_profile(profile, out)
        err_console.print(literal(f"wrote {out} ({len(runs)} runs)"), highlight=False)


def _profile_views(profile) -> dict:
    figures = {
        "mode": profile.mode,
        "model": profile.model.get("name"),
        "moe_layers": len(profile.model["expert_bytes"]),
        "slices_per_expert": profile.model["slices_per_expert"],
        **{f"compute_{k}": v for k, v in profile.compute.items()},
        **{f"mgmt_{k}": v for k, v in profile.mgmt.items()},
        **{f"prefill_{k}": v for k, v in profile.prefill.items()},
        **{f"overlap_{k}": v for k, v in profile.overlap.items()},
        "runs": len(profile.sources),
    }
    return {"profile": figures, "flash": profile.flash}


@app.command("predict")
def predict_command(
    trace_path: Path = typer.Argument(
        ..., metavar="TRACE", help="The route trace of one recorded run (CSV or Parquet)."
    ),
    profile_path: Path = typer.Option(
        ..., "--profile", "-p", help="A device profile (bmoe profile -o)."
    ),
    grid: list[str] = typer.Option(
        None,
        "--grid",
        "-g",
        help="Configurations: cache_mb=64,128,io_threads=1,4,prefetch=0,1 (axes may also be "
        "given one per --grid). Every combination is predicted.",
    ),
    policy: str = typer.Option("lru", "--policy", help="Cache policy of the replay."),
    drop: float | None = typer.Option(
        None,
        "--drop",
        metavar="F",
        help="Replay --drop-cold-experts F: a decode miss with gate weight below F/k is not "
        "read (never a token's top slot).",
    ),
    against_dir: Path | None = typer.Option(
        None,
        "--against",
        metavar="SWEEP_DIR",
        help="Put every measured cell of this sweep next to its prediction, with the error.",
    ),
    csv_out: Path | None = typer.Option(
        None, "--csv", metavar="OUT", help="Also write the table as CSV."
    ),
    fmt: str = typer.Option("table", "--format", "-f", help=f"One of {', '.join(FORMATS)}."),
    force: bool = typer.Option(False, "--force", help="Overwrite a --csv file that exists."),
) -> None:
    """Predict tok/s, MiB/token, hit % and the stall attribution (compute / flash wait /
    mgmt) of configurations from one run's routing and a device profile. MiB/token and hit %
    come from the replay; tok/s has an interval from the profile's spread. tok_s is the whole
    decode's rate (what a sweep measures), steady_tok_s the rate after the warm-up (the run
    analysis's steady-state rule on the predicted tokens; none under 32 tokens).

    Example: bmoe predict run.route.csv --profile device.json --grid cache_mb=64,256,1024
    Example: bmoe predict run.route.csv -p device.json -g cache_mb=128,256 -g io_threads=1,4
    Example: bmoe predict run.route.csv -p device.json --against sweeps/2026-11-29-grid
    """
    check_format(fmt)
    from bmoe.analyze import predict as prediction
    from bmoe.cli.replay import read_trace
    from bmoe.formats.profile import read_profile

    if not grid and against_dir is None:
        raise BmoeError("give --grid (the configurations to predict) or --against SWEEP_DIR")
    if csv_out is not None:
        from bmoe.formats.outputs import check_output

        check_output(csv_out, (trace_path, profile_path, against_dir), force=force)
    profile = read_profile(profile_path)
    cells = prediction.parse_grid(grid) if grid else None
    trace = read_trace(trace_path)
    for caveat in profile.caveats:
        err_console.print(labelled("caveat:", "yellow", caveat), highlight=False)
    if trace.recorded_with_dropping:
        err_console.print(
            note_line("this trace was recorded with expert dropping on: the prediction reads "
                      "every expert the router asked for, dropped ones included"),
            highlight=False,
        )  # fmt: skip
    if against_dir is not None:
        from bmoe.sweep.archive import load_results

        views = prediction.against(
            trace, profile, load_results(against_dir), policy=policy, drop=drop
        )
        table = views["cells"]
    else:
        table = prediction.predict(trace, profile, cells, policy=policy, drop=drop)
        views = {"predicted": table}
    _show(views, fmt)
    if csv_out is not None:
        csv_out.parent.mkdir(parents=True, exist_ok=True)
        import pandas as pd

        csv_out.write_text(pd.DataFrame(table).to_csv(index=False), encoding="utf-8")
        err_console.print(f"wrote {csv_out}", highlight=False)
