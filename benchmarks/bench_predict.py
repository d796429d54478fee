"""Predicted vs measured speed on the embedded engine (the ``small`` model, ~1 GB, generated):
a profile of LRU runs without prefetch predicting cells inside its range, and cells that change
a lever it never measured (another cache policy, prefetch, a larger cache than any of its runs).

Each round runs the profile's two configurations (LRU, prefetch 0: :data:`PROFILE_RUNS`) once
with route and io traces and ``--profile-repeats`` times untraced (the timing), interleaved
with the cells (:data:`CELLS`, untraced, ``--repeats`` passes, the order reversed every second
pass). The round's profile (``bmoe profile`` of its runs) predicts every cell from the first
traced run's routing, each cell with its own configuration (``bmoe predict --against``:
policy and prefetch from each file's preamble). Printed per cell: the lever it changes (none
for the cells inside the profile's range), measured tok/s (mean over its repeats) against
predicted, the error, the interval's width, whether it covers the mean and how many single
runs lie within it, whether the prediction was declared unpriced, MiB/token and hit % (the
replay's, which should agree with the runs'), and the load average. Then per kind of cell
over the rounds: the median |tok/s error|, the count within the bounds with the coverages it is
consistent with, the median width, and how many were declared unpriced (every lever cell
should be, and none of the cells inside the range).

Usage: python benchmarks/bench_predict.py [--rounds 1] [--tokens 24] [--threads 2]
       [--repeats 2] [--profile-repeats 2] [--model PATH] [--out DIR [--again]]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bmoe.analyze.device import (  # noqa: E402
    against_files,
    build_profile,
    coverage_check,
    profile_runs,
)
from bmoe.engine.synth import synth_model  # noqa: E402
from bmoe.formats.runfiles import read_recorded_runs  # noqa: E402

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."
#: The profile's configurations: (cache_mb, io_threads), LRU, prefetch 0.
PROFILE_RUNS = ((64, 1), (256, 4))
#: The cells: (cache_mb, io_threads, prefetch, policy, the lever it changes).
CELLS = (
    (96, 1, 0, "lru", None),
    (96, 4, 0, "lru", None),
    (192, 1, 0, "lru", None),
    (192, 4, 0, "lru", None),
    (128, 2, 0, "lru", None),
    (128, 2, 0, "lfu", "policy"),
    (128, 2, 0, "s3fifo", "policy"),
    (128, 2, 1, "lru", "prefetch"),
    (192, 4, 1, "lru", "prefetch"),
    (512, 1, 0, "lru", "cache_mb"),
    (512, 4, 0, "lru", "cache_mb"),
)


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _wait_for_load(limit: float | None, longest_s: float = 900.0) -> None:
    """Wait (at most `longest_s`) until the 1-minute load average is under `limit`: on a
    shared machine, runs made while other jobs take the cores measure the jobs."""
    import time

    if limit is None:
        return
    deadline = time.monotonic() + longest_s
    while _load() >= limit and time.monotonic() < deadline:
        time.sleep(5.0)


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


def _name(cell) -> str:
    cache_mb, lanes, prefetch, policy, _lever = cell
    return f"cell_{cache_mb}_{lanes}_{prefetch}_{policy}"


def _run(model: Path, folder: Path, name: str, cell, args, traced: bool) -> None:
    cache_mb, lanes, prefetch, policy = cell[:4]
    argv = [
        "nice", sys.executable, "-m", "bmoe", "run", "-m", str(model), "-p", PROMPT,
        "-n", str(args.tokens), "-t", str(args.threads), "--seed", "1", "--moe-stream",
        "--cache-mb", str(cache_mb), "--io-threads", str(lanes), "--prefetch", str(prefetch),
        "--cache-policy", policy, "--csv", f"{name}.csv",
    ]  # fmt: skip
    load = run_recorded(argv, folder, name, traced, args.wait_load)
    print(f"  {name}: load {load:.1f}", flush=True)


def run_recorded(argv: list[str], folder: Path, name: str, traced: bool, wait_load) -> float:
    """Run `argv` (a ``bmoe run`` writing ``<name>.csv``) in `folder`, with the route and io
    traces when `traced`, once the load allows (``--wait-load``); the load average it started
    at is kept as ``<name>.load`` and returned."""
    if traced:
        argv = [*argv, "--route-trace", f"{name}.route.csv", "--io-trace", f"{name}.io.csv"]
    _wait_for_load(wait_load)
    load = _load()
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, errors="replace",
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{name}: bmoe run failed: {done.stderr.strip()[-400:]}")
    (folder / f"{name}.load").write_text(f"{load}\n")
    return load


def _round(model: Path, out: Path, r: int, args) -> None:
    folder = out / f"round{r}"
    folder.mkdir(parents=True, exist_ok=True)
    for i, (cache_mb, lanes) in enumerate(PROFILE_RUNS):
        _run(model, folder, f"profile{i}", (cache_mb, lanes, 0, "lru"), args, traced=True)
    twins = [(i, k) for k in range(1, args.profile_repeats + 1) for i in range(len(PROFILE_RUNS))]
    for rep in range(1, args.repeats + 1):
        cells = list(CELLS) if (rep + r) % 2 else list(reversed(CELLS))
        order: list = [("cell", c) for c in cells]
        if rep == 1:  # the untraced profile runs spread among the first pass's cells
            step = max(1, len(order) // max(len(twins), 1))
            for j, twin in enumerate(twins):
                order.insert(min(len(order), j * (step + 1)), ("twin", twin))
        for kind, item in order:
            if kind == "twin":
                i, k = item
                cache_mb, lanes = PROFILE_RUNS[i]
                _run(model, folder, f"profile{i}_u{k}", (cache_mb, lanes, 0, "lru"), args, False)
            else:
                _run(model, folder, f"{_name(item)}_r{rep}", item, args, False)


def analyze_round(folder: Path, r: int, profile_repeats: int) -> pd.DataFrame:
    """The round's profile from its profile runs, every cell predicted with its own
    configuration; one row per cell (its repeats' mean)."""
    names = [folder / f"profile{i}.csv" for i in range(len(PROFILE_RUNS))]
    names += [folder / f"profile{i}_u{k}.csv" for k in range(1, profile_repeats + 1)
              for i in range(len(PROFILE_RUNS))]  # fmt: skip
    runs = profile_runs(_quiet(read_recorded_runs, [n for n in names if n.is_file()]))
    profile = _quiet(build_profile, runs)
    trace = next(run.route for run in runs if run.route is not None)
    files = profile_runs(_quiet(read_recorded_runs, sorted(folder.glob("cell_*.csv"))))
    cells = _quiet(against_files, trace, profile, files)["cells"]
    loads = {p.stem: float(p.read_text()) for p in folder.glob("*.load")}
    rows = []
    for cell in CELLS:
        part = cells[cells["cell"].astype(str).str.startswith(_name(cell) + "_r")]
        if not len(part):
            continue
        first = part.iloc[0]
        measured = float(part["tok_s"].mean())
        low, high = first["tok_s_low_predicted"], first["tok_s_high_predicted"]
        rows.append(
            {
                "round": r,
                "cell": _name(cell)[5:],
                "lever": cell[4],
                "tok_s": measured,
                "repeat_cv_pct": 100 * float(part["tok_s"].std(ddof=1)) / measured
                if len(part) > 1 else np.nan,
                "tok_s_p": first["tok_s_predicted"],
                "error_pct": 100.0 * (first["tok_s_predicted"] / measured - 1.0),
                "width_pct": 100.0 * (high - low) / first["tok_s_predicted"],
                "within": bool(low <= measured <= high),
                "runs": len(part),
                "runs_within": int(((part["tok_s"] >= low) & (part["tok_s"] <= high)).sum()),
                "firm": bool(part["measurement"].isna().all()),
                "unpriced": first["unpriced_levers"],
                "mib": float(part["mib_per_token"].mean()),
                "mib_p": first["mib_per_token_predicted"],
                "hit_pct": float(part["hit_pct"].mean()),
                "hit_pct_p": first["hit_pct_predicted"],
                "load": float(np.mean([loads.get(Path(f).stem, np.nan) for f in part["file"]])),
            }
        )  # fmt: skip
    table = pd.DataFrame(rows)
    table.attrs["profile"] = profile
    return table


def _summary(table: pd.DataFrame) -> None:
    for lever, part in table.groupby(table["lever"].fillna("none (inside the range)"),
                                     sort=False):  # fmt: skip
        check = coverage_check(int(part["within"].sum()), len(part), 0.8)
        runs = coverage_check(int(part["runs_within"].sum()), int(part["runs"].sum()), 0.8)
        declared = int(part["unpriced"].notna().sum())
        print(
            f"{lever}: median |tok/s error| {part['error_pct'].abs().median():.1f} % over "
            f"{len(part)} cells ({int(part['firm'].sum())} firm), median width "
            f"{part['width_pct'].median():.0f} %, declared unpriced {declared} of {len(part)}"
        )
        print(f"  cells: {check['verdict']}")
        print(f"  runs:  {runs['verdict']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each cell")
    parser.add_argument("--profile-repeats", type=int, default=2,
                        help="untraced runs of each profile configuration")  # fmt: skip
    parser.add_argument("--model", type=Path, default=None, help="the small model (generated)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--wait-load", type=float, default=None,
                        help="before each run, wait (up to 15 min) for a 1-minute load "
                             "average under this")  # fmt: skip
    parser.add_argument(
        "--again", action="store_true", help="analyse the rounds already in --out, run nothing"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    out = args.out or tmp
    model = args.model or tmp / "small.gguf"
    try:
        if not args.again:
            if not model.exists():
                print(f"generating {model} (~1 GB)", flush=True)
                synth_model(model, preset="small")
            for r in range(1, args.rounds + 1):
                print(f"round {r}", flush=True)
                _round(model, out, r, args)
        folders = sorted(out.glob("round*"), key=lambda p: int(p.name[5:]))
        rounds = [analyze_round(f, int(f.name[5:]), args.profile_repeats) for f in folders]
        table = pd.concat(rounds, ignore_index=True)
        (out / "bench_predict.csv").write_text(table.to_csv(index=False))
        with pd.option_context("display.width", 220, "display.max_columns", 30):
            print(table.round(2).to_string(index=False))
        for part in rounds:
            profile = part.attrs["profile"]
            print(f"round {part['round'].iloc[0]}: profile "
                  f"{'settled' if profile.settled else 'unsettled'}; "
                  + "; ".join(profile.unsettled[:3]))  # fmt: skip
        _summary(table)
        mib_gap = (table["mib"] - table["mib_p"]).abs().max()
        hit_gap = (table["hit_pct"] - table["hit_pct_p"]).abs().max()
        print(f"largest MiB/token gap {mib_gap:.3f}, largest hit % gap {hit_gap:.3f} (the "
              "summaries round to 0.1)")  # fmt: skip
        print(f"load average {table['load'].min():.1f}-{table['load'].max():.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the generated model; --out keeps the runs


if __name__ == "__main__":
    main()
