"""Predictions from a busy machine, and of one: profiles recorded while the CPUs were taken by
spinning processes, predicting cells measured on the quiet machine, and the reverse.

Each round runs, in each of two conditions (``quiet``: nothing started by the benchmark;
``busy``: one spinning process per CPU, started before the block and stopped after it), seven
profile runs of the embedded engine on the ``small`` model (generated, ~1 GB) -- one with route
and io traces (the routing, the reads' alignment) and six untraced ones at budgets and lanes
whose reads per token span the cells' (the timing), each ``--profile-repeats`` times in passes
-- then six untraced cells no profile run used (``cache_mb`` x ``io_threads``), each
``--repeats`` times in passes over the cells. The
order of the conditions is reversed every second round. Each condition's profile then predicts
each condition's cells (``against_files`` with the traced run's routing): quiet->quiet,
busy->quiet, quiet->busy, busy->busy. A cell is compared by its mean tok/s over its repeats;
it is firm when no repeat is labelled (mostly off-CPU, or its compute waited for a core).
Printed per pair: the median |tok/s error| over the firm cells (and over all), the share of
firm cells the stated 80 % interval covers (apart from intervals too wide to count: more than
100 % of the prediction) and the share within its bounds, the median interval width, the
cells' own repeat CV (how far a perfect prediction would still miss), whether the count within
the bounds is consistent with 80 % (and which coverages it is consistent with), per pair and
over every pair's firm cells, the same for the firm runs one by one (what the interval
speaks of: a run, not a mean of repeats), and the 1-minute load average the runs saw.
``--use`` picks the profile runs a profile is made of (``0,1,2``: the traced run and two
timing runs, the earlier design).

Usage: python benchmarks/bench_predict_busy.py [--rounds 1] [--tokens 48] [--repeats 2]
       [--profile-repeats 2]
       [--threads 2] [--spinners N] [--model PATH] [--out DIR [--again]] [--use 0,1,...]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bmoe.analyze.device import (  # noqa: E402
    WIDEST_INTERVAL_PCT,
    against_files,
    build_profile,
    coverage_check,
    profile_runs,
)
from bmoe.formats.runfiles import read_recorded_runs  # noqa: E402

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."
PROFILE_RUNS = (  # (cache_mb, io_threads, traced)
    (64, 1, True),
    (64, 1, False),
    (256, 4, False),
    (640, 1, False),
    (160, 4, False),
    (320, 1, False),
    (480, 4, False),
)
CELLS = list(itertools.product((96, 192, 384), (1, 4)))
CONDITIONS = ("quiet", "busy")


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class Spinners:
    """`n` processes spinning a CPU each while the block runs (none when n is 0)."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]))
        time.sleep(1.0 if self.n else 0.0)
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def _run(model: Path, folder: Path, name: str, cache_mb: int, lanes: int, traced: bool, args):
    argv = [
        sys.executable, "-m", "bmoe", "run", "-m", str(model), "-p", PROMPT,
        "-n", str(args.tokens), "-t", str(args.threads), "--seed", "1", "--moe-stream",
        "--cache-mb", str(cache_mb), "--io-threads", str(lanes), "--csv", f"{name}.csv",
    ]  # fmt: skip
    if traced:
        argv += ["--route-trace", f"{name}.route.csv", "--io-trace", f"{name}.io.csv"]
    load = _load()
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, errors="replace",
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{name}: bmoe run failed: {done.stderr.strip()[-400:]}")
    (folder / f"{name}.load").write_text(f"{load}\n")
    return load


def _block(model: Path, folder: Path, condition: str, args) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    spinners = args.spinners if condition == "busy" else 0
    with Spinners(spinners):
        for rep in range(1, args.profile_repeats + 1):  # passes over the profile runs
            for i, (cache_mb, lanes, traced) in enumerate(PROFILE_RUNS):
                if traced and rep > 1:
                    continue  # the routing needs one traced run
                name = f"profile{i}" if rep == 1 else f"profile{i}_r{rep}"
                load = _run(model, folder, name, cache_mb, lanes, traced, args)
                print(f"  {condition} {name} {cache_mb} MiB {lanes}L traced={traced}: "
                      f"load {load:.1f}", flush=True)  # fmt: skip
        for rep in range(1, args.repeats + 1):  # passes over the cells, interleaved
            for cache_mb, lanes in CELLS:
                name = f"cell_{cache_mb}_{lanes}_r{rep}"
                load = _run(model, folder, name, cache_mb, lanes, False, args)
                print(f"  {condition} cell {cache_mb} MiB {lanes}L repeat {rep}: "
                      f"load {load:.1f}", flush=True)  # fmt: skip


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


def loads(folder: Path) -> list[float]:
    return [float(p.read_text()) for p in folder.glob("*.load")]


def per_cell(files: pd.DataFrame) -> pd.DataFrame:
    """The against table's files as cells: the mean measured tok/s over a cell's repeats
    against its prediction (the same for every repeat), whether every repeat is firm, the
    interval's width and whether it covers the mean (within its bounds and no wider than
    :data:`WIDEST_INTERVAL_PCT`), and how much the repeats disagree."""
    rows = []
    for (cache_mb, lanes), part in files.groupby(["cache_mb", "io_threads"], sort=True):
        measured = float(part["tok_s"].mean())
        predicted = float(part["tok_s_predicted"].iloc[0])
        low = float(part["tok_s_low_predicted"].iloc[0])
        high = float(part["tok_s_high_predicted"].iloc[0])
        width = 100.0 * (high - low) / predicted
        within = low <= measured <= high
        cv = 100.0 * float(part["tok_s"].std(ddof=1)) / measured if len(part) > 1 else np.nan
        labels = sorted({m.split(" (")[0] for m in part["measurement"] if isinstance(m, str) and m})
        rows.append(
            {
                "cell": f"{cache_mb:g} MiB {lanes:g}L",
                "repeats": len(part),
                "tok_s": measured,
                "repeat_cv_pct": cv,
                "tok_s_predicted": predicted,
                "error_pct": 100.0 * (predicted / measured - 1.0),
                "width_pct": width,
                "within": within,
                "covered": bool(within and width <= WIDEST_INTERVAL_PCT),
                "firm": not labels,
                "measurement": "; ".join(labels) or None,
            }
        )
    return pd.DataFrame(rows)


def per_run(files: pd.DataFrame) -> tuple[int, int]:
    """(how many firm runs lie within their interval's bounds, how many firm runs): the unit
    the interval speaks of, a run of the configuration; a cell's mean over its repeats moves
    less than one run does."""
    firm = files["measurement"].isna()
    within = (files["tok_s"] >= files["tok_s_low_predicted"]) & (
        files["tok_s"] <= files["tok_s_high_predicted"]
    )
    return int(within[firm].sum()), int(firm.sum())


def analyze(out: Path, use: tuple[int, ...]) -> pd.DataFrame:
    """Every (profile condition, cells condition) pair of every round, the profiles made of
    the profile runs numbered `use`; and every cell of every pair."""
    rows, pooled = [], []
    for round_dir in sorted(out.glob("round*")):
        profiles, cells = {}, {}
        for condition in CONDITIONS:
            folder = round_dir / condition
            if not folder.is_dir():
                continue
            files = [folder / f"profile{i}.csv" for i in use]
            files += [f for i in use for f in sorted(folder.glob(f"profile{i}_r*.csv"))]
            runs = profile_runs(_quiet(read_recorded_runs, files))
            profiles[condition] = (_quiet(build_profile, runs), runs[0].route)
            cells[condition] = profile_runs(
                _quiet(read_recorded_runs, sorted(folder.glob("cell_*.csv")))
            )
        for (p_cond, (profile, trace)), c_cond in itertools.product(profiles.items(), cells):
            result = _quiet(against_files, trace, profile, cells[c_cond])
            table = per_cell(result["cells"])
            runs_within, runs_firm = per_run(result["cells"])
            pooled.append(table.assign(profile=p_cond, cells=c_cond, runs_within=0, runs_firm=0))
            pooled[-1].loc[0, ["runs_within", "runs_firm"]] = (runs_within, runs_firm)
            err = table["error_pct"].abs()
            firm = table["firm"]
            lo = loads(round_dir / p_cond) + loads(round_dir / c_cond)
            rows.append(
                {
                    "round": round_dir.name,
                    "profile": p_cond,
                    "cells": c_cond,
                    "firm": int(firm.sum()),
                    "median_err_firm": float(err[firm].median()),
                    "median_err_all": float(err.median()),
                    "signed_median": float(table["error_pct"].median()),
                    "coverage_firm": 100.0 * float(table.loc[firm, "covered"].mean()),
                    "coverage_all": 100.0 * float(table["covered"].mean()),
                    "within_all": 100.0 * float(table["within"].mean()),
                    "width": float(table["width_pct"].median()),
                    "repeat_cv": float(table["repeat_cv_pct"].median()),
                    "settled": profile.settled,
                    "profile_compute_ms": profile.compute["token_ms"],
                    "load_min": min(lo) if lo else np.nan,
                    "load_max": max(lo) if lo else np.nan,
                }
            )
            print(f"\n{round_dir.name}: profile {p_cond} -> cells {c_cond}")
            print(table.drop(columns=["within"]).round(2).to_string(index=False))
            print(f"  intervals: {result['summary']['interval']}")
            if not profile.settled:
                print("  profile unsettled: " + "; ".join(profile.unsettled))
    return pd.DataFrame(rows), pd.concat(pooled, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each cell")
    parser.add_argument(
        "--profile-repeats", type=int, default=2, help="runs of each untraced profile run"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spinners", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--model", type=Path, default=None, help="the small model (generated)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--again", action="store_true", help="analyse --out, run nothing")
    parser.add_argument(
        "--use",
        default=",".join(str(i) for i in range(len(PROFILE_RUNS))),
        help="the profile runs a profile is made of (numbers into PROFILE_RUNS; default all)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-busy-"))
    out = args.out or tmp
    model = args.model or tmp / "small.gguf"
    try:
        if not args.again:
            if not model.exists():
                from bmoe.engine.synth import synth_model

                print(f"generating {model} (~1 GB)", flush=True)
                synth_model(model, preset="small")
            for r in range(1, args.rounds + 1):
                order = CONDITIONS if r % 2 else tuple(reversed(CONDITIONS))
                print(f"round {r}: {' then '.join(order)}", flush=True)
                for condition in order:
                    _block(model, out / f"round{r}" / condition, condition, args)
        table, cells = analyze(out, tuple(int(i) for i in args.use.split(",")))
        print()
        with pd.option_context("display.width", 220, "display.max_columns", 20):
            print(table.round(1).to_string(index=False))
        for (p_cond, c_cond), part in cells.groupby(["profile", "cells"], sort=False):
            firm = part[part["firm"]]
            print(
                f"profile {p_cond:5s} -> cells {c_cond:5s}: median |error| "
                f"{firm['error_pct'].abs().median():.1f} % over {len(firm)} firm cells of "
                f"{len(part)} ({part['error_pct'].abs().median():.1f} % all); 80 % interval "
                f"covers {100 * firm['covered'].mean():.0f} % of firm cells "
                f"({100 * firm['within'].mean():.0f} % within the bounds), median width "
                f"{part['width_pct'].median():.0f} %; cells' repeat CV "
                f"{part['repeat_cv_pct'].median():.0f} %"
            )
            check = coverage_check(int(firm["within"].sum()), len(firm), 0.8)
            print(f"  cells: {check['verdict']}")
            runs = coverage_check(int(part["runs_within"].sum()), int(part["runs_firm"].sum()), 0.8)
            print(f"  runs:  {runs['verdict']}")
        firm = cells[cells["firm"]]
        check = coverage_check(int(firm["within"].sum()), len(firm), 0.8)
        print(f"every pair's firm cells together: {check['verdict']}")
        runs = coverage_check(int(cells["runs_within"].sum()), int(cells["runs_firm"].sum()), 0.8)
        print(f"every pair's firm runs together: {runs['verdict']} (a cell's runs share its "
              "prediction: not independent, the range is narrower than it should be)")  # fmt: skip
        print(f"load average {table['load_min'].min():.1f}-{table['load_max'].max():.1f}")
    finally:
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
