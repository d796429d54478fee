"""Predictions from a busy machine, and of one: profiles recorded while the CPUs were taken by
spinning processes, predicting cells measured on the quiet machine, and the reverse.

Each round runs, in each of two conditions (``quiet``: nothing started by the benchmark;
``busy``: one spinning process per CPU, started before the block and stopped after it), three
profile runs of the embedded engine on the ``small`` model (generated, ~1 GB) -- one with route
and io traces (the routing, the reads' alignment) and two untraced ones at other budgets and
lanes (the timing) -- and six untraced cells no profile run used (``cache_mb`` x
``io_threads``). The order of the conditions is reversed every second round. Each condition's
profile then predicts each condition's cells (``against_files`` with the traced run's routing):
quiet->quiet, busy->quiet, quiet->busy, busy->busy. Printed per pair: the median |tok/s error|
over the cells whose measurement is firm (and over all), the interval's achieved coverage
against its stated 80 % (the share within its bounds apart from intervals too wide to count,
and what the interval is made of: the profile's two configurations held out in turn give its
model error), its median width, whether the profile says it is settled, and the 1-minute load
average the runs saw (min-max).

Usage: python benchmarks/bench_predict_busy.py [--rounds 1] [--tokens 24] [--threads 2]
       [--spinners N] [--model PATH] [--out DIR [--again]]
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

from bmoe.analyze.profile import against_files, build_profile, read_runs  # noqa: E402

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
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{name}: bmoe run failed: {done.stderr.strip()[-400:]}")
    (folder / f"{name}.load").write_text(f"{load}\n")
    return load


def _block(model: Path, folder: Path, condition: str, args) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    spinners = args.spinners if condition == "busy" else 0
    with Spinners(spinners):
        for i, (cache_mb, lanes, traced) in enumerate(PROFILE_RUNS):
            load = _run(model, folder, f"profile{i}", cache_mb, lanes, traced, args)
            print(f"  {condition} profile{i} {cache_mb} MiB {lanes}L traced={traced}: "
                  f"load {load:.1f}", flush=True)  # fmt: skip
        for cache_mb, lanes in CELLS:
            load = _run(model, folder, f"cell_{cache_mb}_{lanes}", cache_mb, lanes, False, args)
            print(f"  {condition} cell {cache_mb} MiB {lanes}L: load {load:.1f}", flush=True)


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


def loads(folder: Path) -> list[float]:
    return [float(p.read_text()) for p in folder.glob("*.load")]


def analyze(out: Path, use: tuple[int, ...]) -> pd.DataFrame:
    """Every (profile condition, cells condition) pair of every round, the profiles made of
    the profile runs numbered `use`."""
    rows = []
    for round_dir in sorted(out.glob("round*")):
        profiles, cells = {}, {}
        for condition in CONDITIONS:
            folder = round_dir / condition
            if not folder.is_dir():
                continue
            runs = _quiet(read_runs, [folder / f"profile{i}.csv" for i in use])
            profiles[condition] = (_quiet(build_profile, runs), runs[0].route)
            cells[condition] = _quiet(read_runs, sorted(folder.glob("cell_*.csv")))
        for (p_cond, (profile, trace)), c_cond in itertools.product(profiles.items(), cells):
            result = _quiet(against_files, trace, profile, cells[c_cond])
            table, summary = result["cells"], result["summary"]
            err = table["tok_s_error_pct"].abs()
            lo = loads(round_dir / p_cond) + loads(round_dir / c_cond)
            rows.append(
                {
                    "round": round_dir.name,
                    "profile": p_cond,
                    "cells": c_cond,
                    "compared": summary["compared"],
                    "median_err_firm": summary["median_abs_tok_s_error_pct"],
                    "median_err_all": float(err.median()),
                    "signed_median": float(table["tok_s_error_pct"].median()),
                    "coverage_firm": summary["coverage_pct"],
                    "coverage_all": 100.0 * float(table["inside_interval"].astype(bool).mean()),
                    "within_firm": summary["within_bounds_pct"],
                    "claimed": summary["coverage_claimed"],
                    "width": summary["median_interval_width_pct"],
                    "settled": profile.settled,
                    "profile_compute_ms": profile.compute["token_ms"],
                    "compute_from": profile.compute.get("source"),
                    "load_min": min(lo) if lo else np.nan,
                    "load_max": max(lo) if lo else np.nan,
                }
            )
            detail = table[["cell", "tok_s", "tok_s_predicted", "tok_s_error_pct",
                            "inside_interval", "measurement", "off_cpu_pct"]]  # fmt: skip
            print(f"\n{round_dir.name}: profile {p_cond} -> cells {c_cond}")
            print(detail.round(2).to_string(index=False))
            print(f"  intervals: {summary['interval']}")
            if not profile.settled:
                print("  profile unsettled: " + "; ".join(profile.unsettled))
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=24)
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
        table = analyze(out, tuple(int(i) for i in args.use.split(",")))
        print()
        with pd.option_context("display.width", 220, "display.max_columns", 20):
            print(table.round(1).to_string(index=False))
        for (p_cond, c_cond), part in table.groupby(["profile", "cells"], sort=False):
            print(
                f"profile {p_cond:5s} -> cells {c_cond:5s}: median |error| "
                f"{part['median_err_firm'].median():.1f} % over firm cells "
                f"({part['median_err_all'].median():.1f} % all), 80 % interval covers "
                f"{part['coverage_all'].mean():.0f} % of all cells, median width "
                f"{part['width'].median():.0f} %, load {part['load_min'].min():.1f}-"
                f"{part['load_max'].max():.1f}"
            )
    finally:
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
