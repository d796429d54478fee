"""Per-run summary and stall attribution against a plain-Python script doing the same.

    python benchmarks/bench_runs.py [--tokens N]

Writes a long synthetic session-shaped metrics CSV (v2, 29 columns) with the project's own
writer, then times reading it and computing the reference summary plus the attribution panel:
once with bmoe, once with the csv module and `statistics` (what an ad-hoc script does). Both
are checked to agree before the ratio is printed.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bmoe.analyze.metrics import run_summary
from bmoe.analyze.stall import stall_attribution
from bmoe.formats.metrics import COLUMNS_V2, MetricsWriter, read_metrics


def write_long_run(path: Path, tokens: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    wall = rng.gamma(4.0, 50.0, tokens) + 80.0
    params = {"model": "m.gguf", "n_expert_used": 8, "threads": 4, "overlap": True}
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        writer = MetricsWriter(fh, params, COLUMNS_V2)
        for i in range(tokens):
            w = float(wall[i])
            row = {"step": i + 1, "steps": tokens, "wall_ms": w, "io_ms": w * 0.9,
                   "compute_ms": w * 0.6, "read_bytes": int(w * 1e6), "stall_ms": w * 0.25,
                   "mgmt_ms": w * 0.1, "cpu_ms": w * 2.8, "cache_hit_pct": 75.0, "mtp_batch": 1,
                   "rss_anon_mib": 3000.0, "cache_budget_mib": 3000.0}  # fmt: skip
            writer.row(row)
        writer.summary({"tokens": tokens, "read_MiB": float(wall.sum()) * 1e6 / 1048576,
                        "cache_hit_pct": 75.0, "load_s": 10.0, "prefill_s": 5.0})  # fmt: skip


def plain_script(path: Path) -> dict[str, float]:
    """What a hand-written analysis script computes, with the standard library only."""
    with open(path, encoding="utf-8") as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    rows = list(csv.DictReader(lines))
    wall = [float(r["wall_ms"]) for r in rows]
    rates = sorted(1000.0 / w for w in wall if w > 0)

    def quantile(q: float) -> float:
        pos = (len(rates) - 1) * q
        lo = math.floor(pos)
        hi = min(lo + 1, len(rates) - 1)
        return rates[lo] + (rates[hi] - rates[lo]) * (pos - lo)

    compute = [float(r["cpu_ms"]) / 4 for r in rows]
    flash = [float(r["stall_ms"]) for r in rows]
    mgmt = [float(r["mgmt_ms"]) for r in rows]
    rest = [max(0.0, w - c - f - m) for w, c, f, m in zip(wall, compute, flash, mgmt, strict=True)]
    return {
        "tok_s_mean": len(rows) / (sum(wall) / 1000),
        "tok_s_median": statistics.median(rates),
        "tok_s_p5": quantile(0.05),
        "tok_s_p95": quantile(0.95),
        "stall_ms_per_token": statistics.fmean(flash),
        "compute": statistics.fmean(compute),
        "unattributed": statistics.fmean(rest),
    }


def bmoe_figures(path: Path) -> dict[str, float]:
    return bmoe_analysis(read_metrics(path))


def bmoe_analysis(run) -> dict[str, float]:
    summary = run_summary(run)
    bars = stall_attribution(run).summary.set_index("component")["ms_per_token"]
    return {
        **{
            k: summary[k]
            for k in ("tok_s_mean", "tok_s_median", "tok_s_p5", "tok_s_p95", "stall_ms_per_token")
        },
        "compute": float(bars["compute"]),
        "unattributed": float(bars["unattributed"]),
    }


def best_of(fn, arg, repeat: int):
    best, result = math.inf, {}
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(arg)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.csv"
        write_long_run(path, args.tokens)
        size = path.stat().st_size / 1048576
        t_plain, plain = best_of(plain_script, path, args.repeat)
        t_bmoe, ours = best_of(bmoe_figures, path, args.repeat)
        t_read, run = best_of(read_metrics, path, args.repeat)
        t_analysis, _ = best_of(bmoe_analysis, run, args.repeat)
    for key, value in plain.items():
        if not math.isclose(value, ours[key], rel_tol=1e-9, abs_tol=1e-9):
            raise SystemExit(f"disagreement on {key}: plain {value} vs bmoe {ours[key]}")
    print(f"{args.tokens} tokens, {size:.1f} MiB CSV; figures agree")
    print(f"plain csv + statistics: {t_plain:.3f} s")
    print(f"bmoe summary + stall:   {t_bmoe:.3f} s (separately: reading {t_read:.3f} s, "
          f"analysis {t_analysis:.3f} s)")  # fmt: skip
    print(f"speed-up: {t_plain / t_bmoe:.1f}x")


if __name__ == "__main__":
    main()
