"""Predictions on generated models the device model was not developed on: other families,
shapes, seeds and weight types, the laptop's case.

Per model (``--models``; :data:`MODELS` says which were used to decide the model, ``dev``,
and which were measured only once it was settled, ``held-out``, and after the next change,
``held-out-2``): the model is generated, a
route-traced calibration run gives the routing, and its replay picks the cache budgets at
which the hit rate is :data:`PROFILE_HITS` (the profile's two configurations, at 1 and 4
read lanes) and :data:`CELL_HITS` (the cells, at every lane count of :data:`CELL_LANES`).
Then: the two profile configurations once each with route and io traces, and
``--profile-repeats`` untraced runs of each (their twins: the timing), and every cell
``--repeats`` times, untraced, in passes whose order is reversed every second pass, the
untraced profile runs among the first pass's cells. The profile (``bmoe profile`` of its
runs) predicts every cell from the first traced run's routing; per cell the measured mean
over its repeats, the prediction, the error, the interval and whether it covers the mean,
and, to find where an error comes from, each term measured against predicted (compute,
flash wait, management ms per token) beside the hit rate. Closing: per model and over all
the held-out ones, the median |tok/s error| over the cells inside the profile's range (its
budgets and lanes) and over all, the interval's median width, the share of cells and of
single runs within their bounds and the coverages that share is consistent with, and the
1-minute load average the runs saw (the machine may be shared: the runs are under ``nice``
and the cells interleaved, so drift shows as disagreement between repeats, not as a tilt).
The profile prices the machine uncontended (its contended runs' times divided by their
slowdown); on a shared machine every figure is also given against each cell's runs scaled
by the same estimate, which judges everything but that estimate. ``--bookend N`` runs each
profile configuration N more times after the last pass: those late runs against its twins,
and each pass's flash wait against the priced one, tell the machine's drift over the
recording from an effect of the read volume.

Usage: python benchmarks/bench_predict_models.py [--models dev] [--tokens 48] [--threads 2]
       [--repeats 2] [--profile-repeats 1] [--bookend 0] [--out DIR [--again]]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bmoe.analyze import replay  # noqa: E402
from bmoe.analyze.device import against_files, build_profile, coverage_check, predict, profile_runs  # noqa: E402
from bmoe.analyze.verdict import CONTENDED_RATIO  # noqa: E402
from bmoe.formats.metrics import read_metrics  # noqa: E402
from bmoe.formats.route import read_route_trace  # noqa: E402
from bmoe.formats.runfiles import read_recorded_runs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_predict import _quiet, run_recorded  # noqa: E402  (the same runs and waits)

PROMPT = "Explain how a mixture-of-experts model decides which experts handle each token."
#: name -> (role, synth settings). Shapes of a few hundred MiB: a 48-token run takes seconds.
MODELS: dict[str, tuple[str, dict]] = {
    "qwen2moe-s11": ("dev", {"arch": "qwen2moe", "layers": 12, "experts": 64, "top_k": 6,
                             "n_ff_exp": 256, "type": "q8_0", "seed": 11}),
    "llama-s5": ("dev", {"arch": "llama", "layers": 10, "experts": 48, "top_k": 4,
                         "n_ff_exp": 384, "type": "q8_0", "seed": 5}),
    "deepseek2-s23": ("held-out", {"arch": "deepseek2", "layers": 13, "experts": 64,
                                   "top_k": 6, "n_ff_exp": 256, "type": "q5_0", "seed": 23}),
    "gemma4-s31": ("held-out", {"arch": "gemma4", "layers": 16, "experts": 48, "top_k": 4,
                                "n_ff_exp": 320, "type": "q8_0", "seed": 31}),
    "qwen3moe-mixed-s41": ("held-out", {"arch": "qwen3moe", "layers": 12, "experts": 64,
                                        "top_k": 8, "n_ff_exp": 256, "type": "q8_0",
                                        "layer_types": ("q8_0", "q4_0", "q5_0"),
                                        "seed": 41}),
    "gptoss-mxfp4-s61": ("held-out-2", {"arch": "gpt-oss", "layers": 12, "experts": 32,
                                        "top_k": 4, "n_ff_exp": 384, "type": "mxfp4",
                                        "seed": 61}),
    "mixtral-q4-s53": ("held-out-2", {"arch": "llama", "layers": 14, "experts": 56,
                                      "top_k": 2, "n_ff_exp": 448, "type": "q4_0",
                                      "seed": 53}),
}  # fmt: skip
#: The profile's two configurations: (decode hit % the budget is chosen for, read lanes).
PROFILE_HITS = ((35.0, 1), (78.0, 4))
#: The cells: the budgets for these decode hit rates at every lane count below.
CELL_HITS = (30.0, 50.0, 65.0, 82.0)
CELL_LANES = (1, 4)


def _run(model: Path, folder: Path, name: str, cache_mb: float, lanes: int, traced: bool, args):
    argv = [
        "nice", sys.executable, "-m", "bmoe", "run", "-m", str(model), "-p", PROMPT,
        "-n", str(args.tokens), "-t", str(args.threads), "--seed", "1", "--moe-stream",
        "--cache-mb", f"{cache_mb:g}", "--io-threads", str(lanes), "--csv", f"{name}.csv",
    ]  # fmt: skip
    load = run_recorded(argv, folder, name, traced, args.wait_load)
    print(f"  {name}: {cache_mb:g} MiB {lanes}L traced={traced} load {load:.1f}", flush=True)


def budgets_for(trace_path: Path, hits) -> list[float]:
    """The smallest budgets (MiB, 1 MiB steps) whose LRU replay of the routing reaches each
    decode hit rate of `hits`."""
    trace = read_route_trace(trace_path)
    batches = replay.prepare_batches(trace)
    total = sum(trace.expert_bytes().values()) * int(trace.meta.get("n_expert") or 1) / 2**20
    decode = batches.decode
    grid = np.arange(1.0, np.ceil(total) + 1.0)
    rates = []
    for mib in grid:
        h = replay.simulate(batches, "lru", mib * 2**20)
        rates.append(100.0 * h[decode].sum() / batches.n_lookups[decode].sum())
    rates = np.maximum.accumulate(np.asarray(rates))
    return [float(grid[min(np.searchsorted(rates, hit), len(grid) - 1)]) for hit in hits]


def record(model_name: str, out: Path, args) -> None:
    """Generate the model, calibrate, and run the profile runs and the cells (see the module
    docstring); the plan is kept in ``plan.json``."""
    import json

    from bmoe.engine.synth import synth_model

    folder = out / model_name
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.gguf"
    if not model.exists():
        print(f"{model_name}: generating", flush=True)
        synth_model(model, "small", **MODELS[model_name][1])
    _run(model, folder, "calibrate", 0, 4, True, args)
    profile_mb = budgets_for(folder / "calibrate.route.csv", [h for h, _ in PROFILE_HITS])
    cell_mb = budgets_for(folder / "calibrate.route.csv", CELL_HITS)
    plan = {
        "profile": [[mb, lanes] for mb, (_h, lanes) in zip(profile_mb, PROFILE_HITS, strict=True)],
        "cells": [[mb, lanes] for mb in cell_mb for lanes in CELL_LANES],
    }
    (folder / "plan.json").write_text(json.dumps(plan))
    for i, (mb, lanes) in enumerate(plan["profile"]):
        _run(model, folder, f"profile{i}", mb, lanes, True, args)
    twins = [(i, r, mb, lanes) for r in range(1, args.profile_repeats + 1)
             for i, (mb, lanes) in enumerate(plan["profile"])]  # fmt: skip
    for rep in range(1, args.repeats + 1):
        cells = plan["cells"] if rep % 2 else list(reversed(plan["cells"]))
        order: list[tuple] = [("cell", mb, lanes) for mb, lanes in cells]
        if rep == 1:  # the untraced profile runs among the first pass's cells
            step = max(1, len(order) // max(len(twins), 1))
            for j, twin in enumerate(twins):
                order.insert(min(len(order), j * (step + 1)), ("twin", *twin))
        for item in order:
            if item[0] == "twin":
                _i, i, r, mb, lanes = item
                _run(model, folder, f"profile{i}_u{r}", mb, lanes, False, args)
            else:
                _c, mb, lanes = item
                _run(model, folder, f"cell_{mb:g}_{lanes}_r{rep}", mb, lanes, False, args)
    for r in range(1, args.bookend + 1):  # the profile's configurations again, after the cells
        for i, (mb, lanes) in enumerate(plan["profile"]):
            _run(model, folder, f"profile{i}_late{r}", mb, lanes, False, args)


def _measured(path: Path) -> dict:
    summary = read_metrics(path).summary
    return {
        "tok_s": summary["tok/s"],
        "hit_pct": summary["cache_hit_pct"],
        "compute_ms": 1e3 * summary["compute_s/tok"],
        "flash_ms": 1e3 * summary["io_s/tok"],
        "mgmt_ms": 1e3 * summary["mgmt_s/tok"],
        "cpu_ms": 1e3 * summary.get("cpu_s/tok", float("nan")),
        "mib_per_token": summary["read_MiB"] / summary["tokens"],
    }


def _slowdowns(measured: pd.DataFrame, baseline: float, threads: int) -> np.ndarray:
    """Per run, the slowdown the profile's own estimator gives a contended run (its compute
    over its CPU time per thread, over `baseline`; 1 where not contended)."""
    ratio = (measured["compute_ms"] / (measured["cpu_ms"] / max(threads, 1))).to_numpy()
    factor = np.where(ratio > CONTENDED_RATIO, np.maximum(ratio / baseline, 1.0), 1.0)
    return np.where(np.isfinite(factor), factor, 1.0)


def _baseline(profile) -> float:
    """The compute over CPU-per-thread ratio of the profile's uncontended runs (1 without
    any), as the profile's contention estimate takes it."""
    clean = [Path(r["name"]) for r in profile.runs if not r.get("contended")]
    if not clean:
        return 1.0
    rows = pd.DataFrame([_measured(f) for f in clean])
    per_thread = rows["cpu_ms"].sum() / max(int(profile.compute.get("threads") or 1), 1)
    return float(rows["compute_ms"].sum() / per_thread) if per_thread > 0 else 1.0


def analyze(model_name: str, out: Path, args) -> pd.DataFrame:
    """Every cell of one model: measured (mean over repeats) against predicted."""
    import json

    folder = out / model_name
    plan = json.loads((folder / "plan.json").read_text())
    names = [folder / f"profile{i}.csv" for i in range(len(plan["profile"]))]
    names += sorted(folder.glob("profile*_u*.csv"))
    if args.profile_repeats:
        names = [n for n in names if "_u" not in n.stem
                 or int(n.stem.rsplit("_u", 1)[1]) <= args.profile_repeats]  # fmt: skip
    runs = profile_runs(_quiet(read_recorded_runs, names))
    profile = _quiet(build_profile, runs)
    trace = runs[0].route
    grid = pd.DataFrame(plan["cells"], columns=["cache_mb", "io_threads"])
    predicted = _quiet(predict, trace, profile, grid)
    cell_files = sorted(folder.glob("cell_*.csv"))
    labels = _quiet(
        against_files, trace, profile, profile_runs(_quiet(read_recorded_runs, cell_files))
    )["cells"]
    firm_files = {Path(f).stem for f, m in zip(labels["file"], labels["measurement"], strict=True)
                  if not isinstance(m, str)}  # fmt: skip
    baseline = _baseline(profile)
    budgets = [mb for mb, _l in plan["profile"]]
    lanes_measured = sorted({lanes for _mb, lanes in plan["profile"]})
    rows = []
    for cell, pred in zip(plan["cells"], predicted.to_dict("records"), strict=True):
        mb, lanes = cell
        files = sorted(folder.glob(f"cell_{mb:g}_{lanes}_r*.csv"))
        measured = pd.DataFrame([_measured(f) for f in files])
        mean = measured.mean()
        low, high = pred["tok_s_low"], pred["tok_s_high"]
        within_runs = int(((measured["tok_s"] >= low) & (measured["tok_s"] <= high)).sum())
        # the cell as the profile would have read it: a contended run's times divided by
        # its slowdown (the profile's runs were), so that the comparison is like with like
        slowdown = _slowdowns(measured, baseline, args.threads)
        scaled = float((measured["tok_s"] * slowdown).mean())
        rows.append(
            {
                "model": model_name,
                "role": MODELS[model_name][0],
                "cache_mb": mb,
                "lanes": lanes,
                "inside": bool(min(budgets) <= mb <= max(budgets)
                               and min(lanes_measured) <= lanes <= max(lanes_measured)),
                "repeats": len(measured),
                "firm": all(f.stem in firm_files for f in files),
                "hit_pct": mean["hit_pct"],
                "tok_s": mean["tok_s"],
                "repeat_cv_pct": 100 * measured["tok_s"].std(ddof=1) / mean["tok_s"]
                if len(measured) > 1 else np.nan,
                "tok_s_p": pred["tok_s"],
                "error_pct": 100.0 * (pred["tok_s"] / mean["tok_s"] - 1.0),
                "width_pct": 100.0 * (high - low) / pred["tok_s"],
                "within": bool(low <= mean["tok_s"] <= high),
                "slowdown": float(slowdown.mean()),
                "tok_s_scaled": scaled,
                "error_scaled_pct": 100.0 * (pred["tok_s"] / scaled - 1.0),
                "within_scaled": bool(low <= scaled <= high),
                "runs_within": within_runs,
                "compute_ms": mean["compute_ms"],
                "compute_ms_p": pred["compute_ms"],
                "flash_ms": mean["flash_ms"],
                "flash_ms_p": pred["flash_ms"],
                "mgmt_ms": mean["mgmt_ms"],
                "mgmt_ms_p": pred["mgmt_ms"],
                "cpu_ms": mean["cpu_ms"],
                "mib": mean["mib_per_token"],
                "mib_p": pred["mib_per_token"],
                "unpriced": pred.get("unpriced"),
            }
        )  # fmt: skip
    loads = [float(p.read_text()) for p in folder.glob("*.load")]
    table = pd.DataFrame(rows)
    table.attrs["drift"] = _drift(folder, plan, predicted, args)  # records, which concat compares
    table.attrs["load"] = (min(loads), max(loads)) if loads else (np.nan, np.nan)
    table.attrs["profile"] = profile
    return table


def _drift(folder: Path, plan: dict, predicted: pd.DataFrame, args) -> list[dict]:
    """How the machine moved while the cells ran: per profile configuration its twins (run
    among the first pass) against its late runs (``--bookend``, after the last pass), and per
    pass of the cells their flash wait measured over predicted (the geometric mean over the
    cells). A late run that waits longer than its twin at the same configuration is drift, not
    a read volume the profile did not measure."""
    rows = []
    for i, (mb, lanes) in enumerate(plan["profile"]):
        early = [_measured(f) for f in sorted(folder.glob(f"profile{i}_u*.csv"))]
        late = [_measured(f) for f in sorted(folder.glob(f"profile{i}_late*.csv"))]
        if not early or not late:
            continue
        e, lt = pd.DataFrame(early).mean(), pd.DataFrame(late).mean()
        rows.append(
            {
                "what": f"profile {mb:g} MiB {lanes}L, late / twins",
                "flash": lt["flash_ms"] / e["flash_ms"],
                "compute": lt["compute_ms"] / e["compute_ms"],
                "tok_s": lt["tok_s"] / e["tok_s"],
            }
        )
    cells = [tuple(c) for c in plan["cells"]]
    flash_p = dict(zip(cells, predicted["flash_ms"], strict=True))
    for rep in range(1, args.repeats + 1):
        ratios = []
        for (mb, lanes), priced in flash_p.items():
            f = folder / f"cell_{mb:g}_{lanes}_r{rep}.csv"
            if f.exists() and priced > 0:
                ratios.append(_measured(f)["flash_ms"] / priced)
        if ratios:
            flash = float(np.exp(np.mean(np.log(ratios))))
            what = f"cells, pass {rep}: flash measured / priced"
            rows.append({"what": what, "flash": flash, "compute": np.nan, "tok_s": np.nan})
    return rows


def summarise(table: pd.DataFrame, label: str) -> None:
    firm = table[table["firm"]]
    print(
        f"{label}: {len(firm)} of {len(table)} cells firm (every run's compute on a core); "
        f"median |tok/s error| over the firm ones {firm['error_pct'].abs().median():.1f} %"
    )
    inside = table[table["inside"]]
    n_runs = int(table["repeats"].sum())
    runs = coverage_check(int(table["runs_within"].sum()), n_runs, 0.8)
    cells = coverage_check(int(table["within"].sum()), len(table), 0.8)
    print(
        f"{label}: median |tok/s error| {inside['error_pct'].abs().median():.1f} % over "
        f"{len(inside)} cells inside the profile's range, {table['error_pct'].abs().median():.1f}"
        f" % over all {len(table)} (signed median {table['error_pct'].median():+.1f} %); "
        f"median interval width {table['width_pct'].median():.0f} % (inside the range "
        f"{inside['width_pct'].median():.0f} %)"
    )
    print(f"  cells: {cells['verdict']}")
    print(f"  runs:  {runs['verdict']}")
    by_hit = table.groupby(table["hit_pct"].round(-1))["error_pct"].mean()
    print("  signed error by hit rate (a tilt shows as a trend): "
          + ", ".join(f"{h:.0f} %: {e:+.1f} %" for h, e in by_hit.items()))  # fmt: skip
    scaled = coverage_check(int(table["within_scaled"].sum()), len(table), 0.8)
    print(
        f"  against the cells scaled as the profile scales its contended runs (median "
        f"slowdown {table['slowdown'].median():.2f}x): median |tok/s error| "
        f"{inside['error_scaled_pct'].abs().median():.1f} % inside the range, "
        f"{table['error_scaled_pct'].abs().median():.1f} % over all (signed "
        f"{table['error_scaled_pct'].median():+.1f} %); cells: {scaled['verdict']}"
    )
    by_hit = table.groupby(table["hit_pct"].round(-1))["error_scaled_pct"].mean()
    print("  scaled, signed by hit rate: "
          + ", ".join(f"{h:.0f} %: {e:+.1f} %" for h, e in by_hit.items()))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="dev",
                        help="dev, held-out, held-out-2, all, or model names "
                             "(comma-separated)")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each cell")
    parser.add_argument("--profile-repeats", type=int, default=1,
                        help="untraced runs of each profile configuration")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--wait-load", type=float, default=None,
                        help="before each run, wait (up to 15 min) for a 1-minute load "
                             "average under this")  # fmt: skip
    parser.add_argument("--bookend", type=int, default=0,
                        help="untraced runs of each profile configuration after the cells "
                             "(the machine's drift over the recording)")  # fmt: skip
    parser.add_argument("--again", action="store_true", help="analyse --out, run nothing")
    args = parser.parse_args()
    if args.models in ("dev", "held-out", "held-out-2"):
        names = [n for n, (role, _s) in MODELS.items() if role == args.models]
    elif args.models == "all":
        names = list(MODELS)
    else:
        names = args.models.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-models-"))
    out = args.out or tmp
    try:
        tables = []
        for name in names:
            if not args.again:
                print(f"{name}:", flush=True)
                record(name, out, args)
            table = analyze(name, out, args)
            tables.append(table)
            show = table.drop(columns=["model", "role", "unpriced"]).round(2)
            print(f"\n{name} ({MODELS[name][0]}), load {table.attrs['load'][0]:.1f}-"
                  f"{table.attrs['load'][1]:.1f}:")  # fmt: skip
            with pd.option_context("display.width", 250, "display.max_columns", 30):
                print(show.to_string(index=False))
            summarise(table, name)
            if table.attrs["drift"]:
                print("  drift (ratios):")
                print(pd.DataFrame(table.attrs["drift"]).round(3).to_string(index=False))
        for role in ("dev", "held-out", "held-out-2"):
            part = [t for t in tables if t["role"].iloc[0] == role]
            if part:
                summarise(pd.concat(part, ignore_index=True), f"every {role} model")
    finally:
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
