"""``bmoe tune`` against the full grid, on the embedded engine and a generated model.

The search space is 48 cells: cache budget (4 values, all below the model's experts) x read
lanes (2) x prefetch (2) x dropping (0, 0.5, 1.0), with a fidelity floor (top-1 agreement with
the unmodified model, teacher-forced, >= 0.9) that the fastest dropping settings break. The
ground truth is the full grid run ``--grid-repeats`` times (3), interleaved with
``--tunes`` independent tunes (grid pass, tune, grid pass, tune, ...), so both meet the same
machine. A cell's truth is the mean of its grid runs; its feasibility the worst fidelity of
its grid runs (fidelity is deterministic: teacher-forced, greedy).

Success, judged on the ground truth only (never on the tune's own measurement of its pick):
every tune's recommendation is feasible, its true mean is within 5 % of the best feasible
true mean (or statistically indistinguishable from it at 95 %, said separately), and the tune
used at most 30 % of the grid's runs. Printed per tune: its pick, the gap, runs, device time
used against one grid pass's measured time, and the stop reason; with the load average and
the grid's repeat spread.

    flock /tmp/bmoe-bench.lock nice python benchmarks/bench_tune.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """
[sweep]
name = "{name}"
engine = "embedded"
repeats = 1
order = "{order}"
timeout_s = 300
retries = 1
output = "{output}"

[base]
model = "{model}"
prompt = "Explain how a mixture-of-experts model decides which experts handle each token."
n_predict = {tokens}
threads = 1
moe_stream = true
fidelity_ref = "{ref}"

[grid]
cache_mb = [6, 10, 14, 18]
io_threads = [1, 4]
prefetch = [0, 1]
drop_cold_experts = [0.0, 0.5, 1.0]
"""
TUNE = """
[tune]
objective = "tok_s"
budget = {budget}
min_fidelity = {floor}
"""


def bmoe(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "bmoe", *args],
        env=env,
        text=True,
        errors="replace",
        capture_output=True,
        check=False,
    )


def load() -> float:
    return os.getloadavg()[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid-repeats", type=int, default=3)
    ap.add_argument("--tunes", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--floor", type=float, default=0.9)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--reuse",
        type=Path,
        help="a folder kept by an earlier run (--keep): its "
        "model and grid passes are the ground truth again, only the tunes run",
    )
    args = ap.parse_args()
    if args.reuse:
        return reuse(args)
    tmp = Path(tempfile.mkdtemp(prefix="bmoe-bench-tune-"))
    model = tmp / "bench.gguf"
    made = bmoe(
        "model",
        "synth",
        str(model),
        "--preset",
        "tiny",
        "--experts",
        "16",
        "--top-k",
        "4",
        "--n-embd",
        "256",
        "--n-ff-exp",
        "256",
        "--type",
        "f16",
    )
    if made.returncode:
        print(made.stderr)
        return 1
    # the grid's fidelity reference: one unmodified run (the tune makes its own)
    ref = tmp / "ref.npz"
    bmoe(
        "run",
        "-m",
        str(model),
        "-n",
        str(args.tokens),
        "-t",
        "1",
        "--moe-stream",
        "--cache-mb",
        "6",
        "--fidelity-save",
        str(ref),
    )
    budget = int(0.3 * 48)
    grids, tunes, loads = [], [], []
    for i in range(max(args.grid_repeats, args.tunes)):
        if i < args.grid_repeats:
            order = "as-written" if i % 2 == 0 else "reverse"
            path = tmp / f"grid-{i}.toml"
            path.write_text(
                CONFIG.format(
                    name=f"grid{i}",
                    order=order,
                    output=tmp / "out",
                    model=model,
                    tokens=args.tokens,
                    ref=ref,
                )
            )
            before, t0 = load(), time.monotonic()
            done = bmoe("sweep", str(path), "--plain")
            grids.append(_latest(tmp / "out", f"grid{i}"))
            loads.append((f"grid {i + 1}", before, load(), time.monotonic() - t0))
            print(
                f"grid pass {i + 1}: exit {done.returncode}, {loads[-1][3]:.0f} s, load "
                f"{before:.1f} -> {loads[-1][2]:.1f}",
                flush=True,
            )
        if i < args.tunes:
            path = tmp / f"tune-{i}.toml"
            text = CONFIG.format(
                name=f"tune{i}",
                order="as-written",
                output=tmp / "out",
                model=model,
                tokens=args.tokens,
                ref=ref,
            )
            text = text.replace(f'fidelity_ref = "{ref}"\n', "")
            path.write_text(text + TUNE.format(budget=budget, floor=args.floor))
            before, t0 = load(), time.monotonic()
            done = bmoe("tune", str(path), "--plain")
            tunes.append(_latest(tmp / "out", f"tune{i}"))
            loads.append((f"tune {i + 1}", before, load(), time.monotonic() - t0))
            print(
                f"tune {i + 1}: exit {done.returncode}, {loads[-1][3]:.0f} s, load "
                f"{before:.1f} -> {loads[-1][2]:.1f}",
                flush=True,
            )
            if done.returncode not in (0, 1):
                print(done.stdout[-3000:], done.stderr[-3000:])
    figures = report(grids, tunes, args.floor, loads)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept: {tmp}")
    return 0 if figures["success"] else 1


def reuse(args: argparse.Namespace) -> int:
    """Tunes against the grid passes of an earlier run (not interleaved with them)."""
    tmp = args.reuse
    grids = sorted((tmp / "out").glob("*-grid*"))
    if not grids:
        print(f"{tmp}: no grid pass to reuse")
        return 1
    model, ref = tmp / "bench.gguf", tmp / "ref.npz"
    tunes, loads = [], []
    start = len(list((tmp / "out").glob("*-tune*")))
    for i in range(start, start + args.tunes):
        path = tmp / f"tune-{i}.toml"
        text = CONFIG.format(
            name=f"tune{i}",
            order="as-written",
            output=tmp / "out",
            model=model,
            tokens=args.tokens,
            ref=ref,
        )
        text = text.replace(f'fidelity_ref = "{ref}"\n', "")
        path.write_text(text + TUNE.format(budget=int(0.3 * 48), floor=args.floor))
        before, t0 = load(), time.monotonic()
        done = bmoe("tune", str(path), "--plain")
        tunes.append(_latest(tmp / "out", f"tune{i}"))
        loads.append((f"tune {i + 1}", before, load(), time.monotonic() - t0))
        print(
            f"tune {i + 1}: exit {done.returncode}, {loads[-1][3]:.0f} s, load "
            f"{before:.1f} -> {loads[-1][2]:.1f}",
            flush=True,
        )
    figures = report(grids, tunes, args.floor, loads)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 0 if figures["success"] else 1


def _latest(out: Path, name: str) -> Path:
    return sorted(out.glob(f"*-{name}*"))[-1]


def _axes(frame: pd.DataFrame) -> pd.Series:
    cols = ["cache_mb", "io_threads", "prefetch", "drop_cold_experts"]
    return frame[cols].astype(float).astype(str).agg(" ".join, axis=1)


def report(grids, tunes, floor: float, loads) -> dict:
    from bmoe.analyze.verdict import ratio_interval
    from bmoe.sweep.archive import load_results

    runs = pd.concat([load_results(g).assign(grid=i) for i, g in enumerate(grids)])
    runs = runs[runs["status"] == "ok"]
    runs["key"] = _axes(runs)
    truth = runs.groupby("key").agg(
        mean=("tok_s_reported", "mean"),
        sd=("tok_s_reported", "std"),
        n=("tok_s_reported", "count"),
        fidelity=("fidelity", "min"),
    )
    truth["feasible"] = truth["fidelity"] >= floor
    feasible = truth[truth["feasible"]]
    best_key = feasible["mean"].idxmax()
    best = feasible.loc[best_key]
    fastest = truth["mean"].idxmax()
    grid_time = [float(load_results(g)["duration_s"].sum()) for g in grids]
    cv = (truth["sd"] / truth["mean"]).median() * 100
    print()
    print(
        f"ground truth: {len(truth)} cells x {len(grids)} grid passes; median repeat CV "
        f"{cv:.1f} %; one grid pass {np.mean(grid_time):.0f} s of device time "
        f"(min {min(grid_time):.0f}, max {max(grid_time):.0f})"
    )
    verdict = "feasible" if truth.at[fastest, "feasible"] else "breaks the floor"
    print(
        f"  fastest cell: {fastest}: {truth.at[fastest, 'mean']:.1f} tok/s, fidelity "
        f"{truth.at[fastest, 'fidelity']:.3f} ({verdict})"
    )
    print(
        f"  best feasible (fidelity >= {floor}): {best_key}: {best['mean']:.1f} tok/s "
        f"(sd {best['sd']:.1f}, n {int(best['n'])})"
    )
    rows = []
    for i, folder in enumerate(tunes):
        state = json.loads((folder / "tune.json").read_text())
        result = state["result"]
        pick = result.get("best")
        row = {
            "tune": i + 1,
            "runs": result["used_runs"],
            "device_s": result["used_device_s"],
            "stop": result["stop"]["reason"],
        }
        if pick:
            params = {
                k: float(v)
                for k, v in pick["flags"].items()
                if k in ("cache_mb", "io_threads", "prefetch", "drop_cold_experts")
            }
            key = " ".join(
                str(params.get(a, 0.0))
                for a in ("cache_mb", "io_threads", "prefetch", "drop_cold_experts")
            )
            t = truth.loc[key]
            ratio, low, high = (
                float(x[0])
                for x in ratio_interval(
                    [best["mean"]], [best["sd"]], [best["n"]], [t["mean"]], [t["sd"]], [t["n"]]
                )
            )
            row.update(
                pick=key,
                tune_measured=pick["objective"],
                true_mean=t["mean"],
                gap_pct=100 * (1 - t["mean"] / best["mean"]),
                feasible=bool(t["feasible"]),
                indistinguishable=not (low > 1.0),
                ratio=(ratio, low, high),
            )
        rows.append(row)
    table = pd.DataFrame(rows)
    share = table["runs"] / 48 * 100
    saved = 100 * (1 - table["device_s"] / np.mean(grid_time))
    print()
    for r, s, sv in zip(rows, share, saved, strict=True):
        if "pick" not in r:
            print(f"tune {r['tune']}: no recommendation ({r['stop']}), {r['runs']} runs")
            continue
        print(
            f"tune {r['tune']}: {r['pick']}: true {r['true_mean']:.1f} tok/s, "
            f"{r['gap_pct']:+.1f} % below the best (ratio {r['ratio'][0]:.3f}, 95 % "
            f"{r['ratio'][1]:.3f}-{r['ratio'][2]:.3f}); feasible {r['feasible']}; "
            f"{r['runs']} runs = {s:.0f} % of 48; {r['device_s']:.0f} s device time, "
            f"{sv:.0f} % less than a grid pass; stopped: {r['stop']}"
        )
    print()
    for name, before, after, seconds in loads:
        print(f"  {name}: {seconds:.0f} s wall, load average {before:.1f} -> {after:.1f}")
    ok = [
        "pick" in r and r["feasible"] and r["gap_pct"] <= 5.0 and r["runs"] <= 0.3 * 48
        for r in rows
    ]
    print(
        f"\nwithin 5 % of the best feasible with <= 30 % of the runs: {sum(ok)} of {len(ok)} tunes"
    )
    return {
        "truth_best": best_key,
        "truth_best_mean": float(best["mean"]),
        "cv_pct": cv,
        "grid_device_s": grid_time,
        "tunes": rows,
        "loads": loads,
        "success": all(ok) and bool(ok),
    }


if __name__ == "__main__":
    sys.exit(main())
