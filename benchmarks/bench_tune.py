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
    ap.add_argument("--grid-repeats", type=int, default=4)
    ap.add_argument("--tunes", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument(
        "--pairs",
        type=int,
        default=20,
        help="rounds of the paired confirmation of each pick against the grid's best",
    )
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
    figures["confirmed"] = confirm(tmp, figures, args)
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
    if not args.tunes:  # only the report (and the paired confirmation) of the tunes there
        tunes = sorted((tmp / "out").glob("*-tune*"))
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
    figures["confirmed"] = confirm(tmp, figures, args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 0 if figures["success"] else 1


def confirm(tmp: Path, figures: dict, args: argparse.Namespace) -> list[dict]:
    """Each distinct pick against the grid's best feasible cell, run back to back for
    ``--pairs`` rounds (every second round in the other order): the mean of the rounds'
    log ratios removes the machine's drift, and its t interval says whether the pick is
    within 5 % of the best."""
    from bmoe.analyze.device.tune import t_at
    from bmoe.sweep.archive import load_results

    best = figures["truth_best"]
    picks = sorted({r["pick"] for r in figures["tunes"] if r.get("pick") and r["pick"] != best})
    out = []
    for k, pick in enumerate(picks):
        cells = "".join(
            "\n[[cells]]\n"
            + "".join(
                f"{a} = {float(v) if a == 'drop_cold_experts' else int(float(v))}\n"
                for a, v in zip(AXES, key.split(), strict=True)
            )
            for key in (best, pick)
        )
        text = CONFIG.format(
            name=f"pair{k}",
            order="alternate",
            output=tmp / "out",
            model=tmp / "bench.gguf",
            tokens=args.tokens,
            ref=tmp / "ref.npz",
        )
        text = text.split("[grid]")[0].replace("repeats = 1", f"repeats = {args.pairs}")
        path = tmp / f"pair-{k}.toml"
        path.write_text(text + cells)
        before = load()
        done = bmoe("sweep", str(path), "--plain")
        results = load_results(_latest(tmp / "out", f"pair{k}"))
        results = results[results["status"] == "ok"]
        results["key"] = _axes(results)
        wide = results.pivot_table(index="round", columns="key", values="tok_s_reported")
        ratio = np.log(wide[best] / wide[pick]).dropna()
        n = len(ratio)
        half = t_at(0.95, n - 1) * ratio.std() / np.sqrt(n)
        gap = 100 * (1 - np.exp(-ratio.mean()))
        low, high = (
            100 * (1 - np.exp(-(ratio.mean() - half))),
            100 * (1 - np.exp(-(ratio.mean() + half))),
        )
        word = (
            "within 5 %"
            if high <= 5
            else "more than 5 % below"
            if low > 5
            else "not decided at 5 %"
        )
        print(
            f"paired: {pick} against {best}, {n} rounds (exit {done.returncode}, load "
            f"{before:.1f} -> {load():.1f}): {gap:.1f} % below (95 %: {low:.1f} to {high:.1f} "
            f"%): {word}"
        )
        out.append(
            {
                "pick": pick,
                "best": best,
                "rounds": n,
                "gap_pct": gap,
                "low_pct": low,
                "high_pct": high,
                "verdict": word,
            }
        )
    if not picks:
        print("paired: every tune picked the grid's best feasible cell")
    return out


def _latest(out: Path, name: str) -> Path:
    return sorted(out.glob(f"*-{name}*"))[-1]


AXES = ("cache_mb", "io_threads", "prefetch", "drop_cold_experts")


def _axes(frame: pd.DataFrame) -> pd.Series:
    return frame[list(AXES)].astype(float).astype(str).agg(" ".join, axis=1)


def two_way(runs: pd.DataFrame) -> tuple[pd.Series, pd.Series, float, int]:
    """log tok/s = cell + pass (+ noise), fitted by alternating means: each cell's effect with
    the load of each grid pass taken out. Returns the cells' and passes' effects (log), the
    residual standard deviation and its degrees of freedom."""
    y = np.log(runs["tok_s_reported"].to_numpy(float))
    cell, grid = runs["key"].to_numpy(), runs["grid"].to_numpy()
    passes = pd.Series(0.0, index=np.unique(grid))
    for _ in range(100):
        cells = pd.Series(y - passes.reindex(grid).to_numpy()).groupby(cell).mean()
        passes = pd.Series(y - cells.reindex(cell).to_numpy()).groupby(grid).mean()
        passes -= passes.mean()
    resid = y - cells.reindex(cell).to_numpy() - passes.reindex(grid).to_numpy()
    dof = len(y) - len(cells) - len(passes) + 1
    return cells, passes, float(np.sqrt((resid**2).sum() / max(dof, 1))), dof


def report(grids, tunes, floor: float, loads) -> dict:
    from bmoe.analyze.device.tune import t_at
    from bmoe.sweep.archive import load_results

    runs = pd.concat([load_results(g).assign(grid=i) for i, g in enumerate(grids)])
    runs = runs[runs["status"] == "ok"]
    runs["key"] = _axes(runs)
    truth = runs.groupby("key").agg(
        raw=("tok_s_reported", "mean"),
        sd=("tok_s_reported", "std"),
        n=("tok_s_reported", "count"),
        fidelity=("fidelity", "min"),
    )
    cells, passes, resid, dof = two_way(runs)
    truth["mean"] = np.exp(cells.reindex(truth.index))
    truth["feasible"] = truth["fidelity"] >= floor
    feasible = truth[truth["feasible"]]
    best_key = feasible["mean"].idxmax()
    best = feasible.loc[best_key]
    fastest = truth["mean"].idxmax()
    grid_time = [float(load_results(g)["duration_s"].sum()) for g in grids]
    cv = (truth["sd"] / truth["raw"]).median() * 100
    # the gap between two cells' effects: each a mean over the passes (balanced design)
    half = t_at(0.95, dof) * resid * np.sqrt(2.0 / len(grids))
    print()
    print(
        f"ground truth: {len(truth)} cells x {len(grids)} grid passes; median repeat CV "
        f"{cv:.1f} %; the passes' load effects "
        + ", ".join(f"{np.exp(v):.2f}x" for v in passes)
        + f"; residual sd {100 * resid:.1f} % (a gap between two cells known to +-"
        f"{100 * (np.exp(half) - 1):.1f} % at 95 %); one grid pass {np.mean(grid_time):.0f} s "
        f"of device time (min {min(grid_time):.0f}, max {max(grid_time):.0f})"
    )
    verdict = "feasible" if truth.at[fastest, "feasible"] else "breaks the floor"
    print(
        f"  fastest cell: {fastest}: {truth.at[fastest, 'mean']:.1f} tok/s, fidelity "
        f"{truth.at[fastest, 'fidelity']:.3f} ({verdict})"
    )
    print(
        f"  best feasible (fidelity >= {floor}): {best_key}: {best['mean']:.1f} tok/s "
        f"(pass-adjusted; raw mean {best['raw']:.1f}, sd {best['sd']:.1f}, n {int(best['n'])})"
    )
    top = feasible.sort_values("mean", ascending=False).head(6)
    print("  the feasible top: " + "; ".join(f"{k} {v:.0f}" for k, v in top["mean"].items()))
    rows = []
    for i, folder in enumerate(tunes):
        state = json.loads((folder / "tune.json").read_text())
        result = state["result"]
        pick = result.get("best")
        row = {
            "tune": i + 1,
            "runs": result["used_runs"],
            "device_s": result["used_device_s"],
            "grid_predicted_s": result.get("grid_predicted_device_s"),
            "stop": result["stop"]["reason"],
        }
        if pick:
            params = {k: float(v) for k, v in pick["flags"].items() if k in AXES}
            key = " ".join(str(params.get(a, 0.0)) for a in AXES)
            t = truth.loc[key]
            gap = np.log(best["mean"] / t["mean"])
            row.update(
                pick=key,
                tune_measured=pick["objective"],
                true_mean=float(t["mean"]),
                gap_pct=100 * (1 - t["mean"] / best["mean"]),
                gap_low_pct=100 * (1 - np.exp(-(gap - half))),
                gap_high_pct=100 * (1 - np.exp(-(gap + half))),
                feasible=bool(t["feasible"]),
                indistinguishable=bool(gap - half <= 0),
            )
        rows.append(row)
    print()
    for r in rows:
        share = 100 * r["runs"] / 48
        saved = 100 * (1 - r["device_s"] / np.mean(grid_time))
        if "pick" not in r:
            print(f"tune {r['tune']}: no recommendation ({r['stop']}), {r['runs']} runs")
            continue
        print(
            f"tune {r['tune']}: {r['pick']}: {r['true_mean']:.1f} tok/s in the grid, "
            f"{r['gap_pct']:.1f} % below the best feasible (95 %: {r['gap_low_pct']:.1f} to "
            f"{r['gap_high_pct']:.1f} %; distinguishable from it: "
            f"{'no' if r['indistinguishable'] else 'yes'}); "
            f"feasible {r['feasible']}; {r['runs']} runs = {share:.0f} % of 48; "
            f"{r['device_s']:.0f} s of device time, {saved:.0f} % less than a grid pass "
            f"(the tune predicted {r['grid_predicted_s']:.0f} s for the grid); stopped: {r['stop']}"
        )
    print()
    for name, before, after, seconds in loads:
        print(f"  {name}: {seconds:.0f} s wall, load average {before:.1f} -> {after:.1f}")
    ok = [
        "pick" in r and r["feasible"] and r["gap_pct"] <= 5.0 and r["runs"] <= 0.3 * 48
        for r in rows
    ]
    tied = ["pick" in r and r["feasible"] and r["indistinguishable"] for r in rows]
    print(
        f"\nwithin 5 % of the best feasible (pass-adjusted means) with <= 30 % of the runs: "
        f"{sum(ok)} of {len(ok)} tunes; not distinguishable from it at 95 %: {sum(tied)} of "
        f"{len(tied)}; a pick under the fidelity floor: "
        f"{sum(1 for r in rows if 'pick' in r and not r['feasible'])}"
    )
    return {
        "truth_best": best_key,
        "truth_best_mean": float(best["mean"]),
        "cv_pct": cv,
        "residual_sd_pct": 100 * resid,
        "grid_device_s": grid_time,
        "tunes": rows,
        "loads": loads,
        "success": all(ok) and bool(ok),
    }


if __name__ == "__main__":
    sys.exit(main())
