"""Predicted vs measured speed on the embedded engine (the ``small`` model, ~1 GB, generated).

Each round runs three profile runs (route and io traces on, a different budget and lane count
each) and one untraced run of the first one's configuration (the profile takes compute and
management from it, and measures the tracing overhead), interleaved with twelve measured cells
that no profile run used (``cache_mb`` x
``io_threads`` x ``prefetch``, untraced, the order reversed every second round). The round's
profile is built from its three runs only (``bmoe profile``), its first run's routing is
predicted through the twelve cells (``bmoe predict``), and each cell's prediction is printed
next to what it measured: tok/s and its error, MiB/token and hit % (which come from the replay
and should agree exactly), and the 1-minute load average when the cell ran, so that drift from
whatever else runs on the machine is visible. The median absolute tok/s error per round and
over all rounds closes the output.

Usage: python benchmarks/bench_predict.py [--rounds 2] [--tokens 16] [--threads 2]
       [--model PATH] [--out DIR [--again]] [--keep]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from bmoe.analyze.predict import predict  # noqa: E402
from bmoe.analyze.profile import build_profile, read_runs  # noqa: E402
from bmoe.engine.synth import synth_model  # noqa: E402
from bmoe.formats.metrics import read_metrics  # noqa: E402

PROMPT = "Explain mixture of experts."
PROFILE_RUNS = (  # (cache_mb, io_threads, prefetch)
    (64, 1, 0),
    (256, 4, 0),
    (128, 2, 1),
)
#: the untraced twin of the first profile run: the timing without the tracing overhead
UNTRACED = PROFILE_RUNS[0]
GRID = {"cache_mb": (96, 192, 384), "io_threads": (1, 4), "prefetch": (0, 1)}


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _run(model: Path, folder: Path, name: str, cell, args, traced: bool) -> dict:
    cache_mb, lanes, prefetch = cell
    argv = [
        sys.executable, "-m", "bmoe", "run", "-m", str(model), "-p", PROMPT,
        "-n", str(args.tokens), "-t", str(args.threads), "--seed", "1", "--moe-stream",
        "--cache-mb", str(cache_mb), "--io-threads", str(lanes), "--prefetch", str(prefetch),
        "--csv", f"{name}.csv",
    ]  # fmt: skip
    if traced:
        argv += ["--route-trace", f"{name}.route.csv", "--io-trace", f"{name}.io.csv"]
    load = _load()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, errors="replace"
    )
    if done.returncode:
        raise SystemExit(f"{name}: bmoe run failed: {done.stderr.strip()[-400:]}")
    summary = read_metrics(folder / f"{name}.csv").summary
    return {
        "cache_mb": cache_mb,
        "io_threads": lanes,
        "prefetch": prefetch,
        "tok_s": summary["tok/s"],
        "mib_per_token": summary["read_MiB"] / summary["tokens"],
        "hit_pct": summary["cache_hit_pct"],
        **_parts(summary),
        "load": load,
        "run_s": time.perf_counter() - t0,
    }


def _parts(summary: dict) -> dict:
    """Measured ms per token: compute (the residual), flash wait, cache management."""
    return {
        "compute_ms": 1e3 * summary["compute_s/tok"],
        "flash_ms": 1e3 * summary["io_s/tok"],
        "mgmt_ms": 1e3 * summary["mgmt_s/tok"],
    }


def _measured(path: Path) -> dict | None:
    cache_mb, lanes, prefetch = (int(x) for x in path.stem.split("_")[1:])
    summary = read_metrics(path).summary
    if "tok/s" not in summary:
        return None  # the run did not finish
    return {
        "cache_mb": cache_mb,
        "io_threads": lanes,
        "prefetch": prefetch,
        "tok_s": summary["tok/s"],
        "mib_per_token": summary["read_MiB"] / summary["tokens"],
        "hit_pct": summary["cache_hit_pct"],
        **_parts(summary),
        "load": float("nan"),
    }


def _round(model: Path, out: Path, r: int, args) -> pd.DataFrame:
    folder = out / f"round{r}"
    folder.mkdir(parents=True, exist_ok=True)
    cells = list(itertools.product(*GRID.values()))
    if r % 2 == 0:
        cells.reverse()
    runs = [*PROFILE_RUNS, UNTRACED]
    chunks = [cells[i :: len(runs)] for i in range(len(runs))]
    measured, profiled = [], []
    for i, profile_cell in enumerate(runs):
        traced = i < len(PROFILE_RUNS)
        p = _run(model, folder, f"profile{i}", profile_cell, args, traced=traced)
        profiled.append(p)
        print(
            f"round {r} profile run {i} {profile_cell}: {p['tok_s']:.3f} tok/s, "
            f"load {p['load']:.1f}",
            flush=True,
        )
        for cell in chunks[i]:
            name = "cell_{}_{}_{}".format(*cell)
            measured.append(_run(model, folder, name, cell, args, traced=False))
            m = measured[-1]
            print(f"  {name}: {m['tok_s']:.3f} tok/s, load {m['load']:.1f}", flush=True)
    pd.DataFrame(measured).to_csv(folder / "runs.csv", index=False)
    pd.DataFrame(profiled).to_csv(folder / "profile_runs.csv", index=False)
    return analyze_round(folder, r)


def analyze_round(folder: Path, r: int) -> pd.DataFrame:
    """Profile from the round's profile runs, predictions of its measured cells."""
    names = sorted(folder.glob("profile*.csv"))
    runs = read_runs(names)
    profile = build_profile(runs)
    if (folder / "runs.csv").is_file():
        frame = pd.read_csv(folder / "runs.csv")
    else:  # a round cut short: its finished cells, load unknown
        found = [_measured(p) for p in sorted(folder.glob("cell_*.csv"))]
        frame = pd.DataFrame([m for m in found if m is not None])
    trace = next(r.route for r in runs if r.route is not None)
    predicted = predict(trace, profile, frame[["cache_mb", "io_threads", "prefetch"]])
    both = frame.merge(predicted, on=["cache_mb", "io_threads", "prefetch"], suffixes=("", "_p"))
    both.insert(0, "round", r)
    both["tok_s_err_pct"] = 100.0 * (both["tok_s_p"] - both["tok_s"]) / both["tok_s"]
    # the same prediction with the compute the machine gave this cell: isolates the flash and
    # management model from the load other processes put on the CPU
    own = 1e3 / (both["compute_ms"] + both["flash_ms_p"] + both["mgmt_ms_p"])
    both["own_compute_err_pct"] = 100.0 * (own - both["tok_s"]) / both["tok_s"]
    return both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None, help="the small model (generated)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--again", action="store_true", help="analyse the rounds already in --out, run nothing"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    out = args.out or tmp
    model = args.model or tmp / "small.gguf"
    if not model.exists() and not args.again:
        print(f"generating {model} (~1 GB)", flush=True)
        synth_model(model, preset="small")
    try:
        if args.again:
            folders = sorted(out.glob("round*"), key=lambda p: int(p.name[5:]))
            rounds = [analyze_round(f, int(f.name[5:])) for f in folders]
        else:
            rounds = [_round(model, out, r, args) for r in range(1, args.rounds + 1)]
        table = pd.concat(rounds, ignore_index=True)
        (out / "bench_predict.csv").write_text(table.to_csv(index=False))
        show = table[
            ["round", "cache_mb", "io_threads", "prefetch", "load", "tok_s", "tok_s_p",
             "tok_s_low", "tok_s_high", "tok_s_err_pct", "mib_per_token", "mib_per_token_p",
             "hit_pct", "hit_pct_p", "compute_ms", "compute_ms_p", "flash_ms", "flash_ms_p",
             "mgmt_ms", "mgmt_ms_p", "own_compute_err_pct"]
        ]  # fmt: skip
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(show.round(3).to_string(index=False))
        for r, part in table.groupby("round"):
            print(
                f"round {r}: median |tok/s error| {part['tok_s_err_pct'].abs().median():.1f} % "
                f"over {len(part)} cells, load {part['load'].min():.1f}-{part['load'].max():.1f}"
            )
        mib_gap = (table["mib_per_token"] - table["mib_per_token_p"]).abs().max()
        hit_gap = (table["hit_pct"] - table["hit_pct_p"]).abs().max()
        print(
            f"all rounds: median |tok/s error| {table['tok_s_err_pct'].abs().median():.1f} % "
            f"over {len(table)} cells (target <= 15 %); largest MiB/token gap {mib_gap:.3f} "
            f"(summary rounds to 0.1 MiB), largest hit % gap {hit_gap:.3f} "
            "(summary rounds to 0.1 %)"
        )
        print(
            "with each cell's own measured compute (flash and management predicted): median "
            f"|tok/s error| {table['own_compute_err_pct'].abs().median():.1f} %"
        )
        within = (table["tok_s"] >= table["tok_s_low"]) & (table["tok_s"] <= table["tok_s_high"])
        print(f"measured inside the predicted interval: {int(within.sum())} of {len(table)}")
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
