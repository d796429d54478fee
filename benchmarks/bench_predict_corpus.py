"""Prediction on the phone: profiles from at most two archived phone runs predicting the others.

The corpus's phone matrices (``$BMOE_CORPUS/metrics``, default ``../shared/corpus``) are per-token
metrics files of two models: six v0 files of one Qwen MoE model (no preamble; cache budget,
lanes, prefetch and overlap vary, one plain-mmap baseline) and two v1 files of another
(Qwen3.6-35B-A3B: dense weights anon against ahwb with cold-expert dropping). Files are grouped
by model (v1: the preamble's ``model=``; v0: the files without a preamble, which route the
same token demand: MiB read per token over the miss share, printed as evidence). In each group
every profile from one and from two files predicts every other file with its own
configuration (``bmoe predict --against FILES`` without a trace: each file's own reads are
priced, so what is checked is the time model given the reads; the replay's reads are checked
on the traced runs, where they agree to 0.5 %). Printed per (profile, file): measured and
predicted decode tok/s, the error, the interval and whether it covers the measurement, and
why a file is out of the headline. Then the headline: the median |error| over every
out-of-sample prediction of a firm measurement, per profile size and interval kind (the terms'
spread and the model's own error, measured by holding out each configuration of the profile's
runs: the interval claims its stated 80 %; or the spread only, when the profile could not
measure its error), with how many measurements the interval covers (one over 100 % wide covers
nothing), how many lie within its bounds all the same, and its median width; beside them the
same for the spread-only interval on the same cells (the interval before the model error was
added). Serial files predicted from overlap-only profiles are listed apart (unpriced).

Three checks close the output: the gemma phone run's first half of tokens profiling its second
half (replay of its own trace); the native-tiny host runs (profile from ``run`` and ``pf``, the
others predicted from the ``pf`` routing); and, as a second data set for the interval, the
archived host sweep ``bench-data/2026-11-29-tiny-cache-lanes`` (15 configurations x 3 repeats
of 32 tokens): profiles of every seventh pair of configurations (all their repeats) predicting
the other configurations' files the same way.

Usage: python benchmarks/bench_predict_corpus.py [--corpus DIR] [--csv OUT]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bmoe.analyze import replay  # noqa: E402
from bmoe.analyze.device import (  # noqa: E402
    WIDEST_INTERVAL_PCT,
    ProfileRun,
    against_files,
    build_profile,
    cell_reads,
    coverage_check,
    interval_kind,
    profile_runs,
    run_config,
    token_times,
)
from bmoe.errors import BmoeError  # noqa: E402
from bmoe.formats.runfiles import read_recorded_runs  # noqa: E402
from bmoe.render.predict import cell_label, left_out  # noqa: E402


def corpus_dir(given: str | None = None) -> Path:
    return Path(given or os.environ.get("BMOE_CORPUS") or ROOT.parent / "shared" / "corpus")


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def demand_mib(run: ProfileRun) -> float | None:
    """MiB one token routes, from what the run read and its miss share (a model's
    fingerprint where the file does not name its model)."""
    hit = run.figure("cache_hit_pct")
    rows = run.metrics.rows
    if hit is None or hit < 0 or hit >= 100 or "read_bytes" not in rows:
        return None
    return float(rows["read_bytes"].mean()) / (1 << 20) / (1 - hit / 100)


def phone_groups(corpus: Path) -> dict[str, list[ProfileRun]]:
    """The phone metrics files, grouped by model."""
    files = sorted((corpus / "metrics").rglob("*.csv"))
    runs = profile_runs(_quiet(read_recorded_runs, files))
    groups: dict[str, list[ProfileRun]] = {}
    for run in runs:
        model = run.metrics.params.get("model")
        key = f"{model} (v{run.metrics.version})" if model else "v0 files (no preamble)"
        groups.setdefault(key, []).append(run)
    return groups


def phone_table(corpus: Path, max_runs: int = 2) -> pd.DataFrame:
    """Every profile of 1..`max_runs` streaming files of a group predicting every file of
    that group: one row per (profile, file)."""
    rows = []
    for group, runs in phone_groups(corpus).items():
        streaming = [r for r in runs if run_config(r).streaming]
        for size in range(1, max_runs + 1):
            for chosen in itertools.combinations(streaming, size):
                try:
                    profile = _quiet(build_profile, list(chosen))
                except BmoeError as exc:
                    rows.append({"group": group, "profile": _names(chosen), "file": "-",
                                 "left out": f"no profile: {exc}"})  # fmt: skip
                    continue
                cells = _quiet(against_files, None, profile, runs)["cells"]
                claimed = interval_kind(profile)[1]
                for cell in cells.to_dict("records"):
                    rows.append(_row(group, size, chosen, profile, claimed, cell))
    return pd.DataFrame(rows)


def _spread_only(cell: dict) -> tuple[float, bool, bool]:
    """The width (%) of the interval the spread alone gives (the interval before the model
    error was added), whether it covers the measurement (a too wide one never does) and
    whether the measurement lies within its bounds."""
    rel = cell["spread_pct_predicted"] / 100.0
    rate = cell["tok_s_predicted"]
    low = rate / (1 + rel)
    high = rate / (1 - rel) if rel < 1 else float("inf")
    width = 100.0 * (high - low) / rate
    within = bool(low <= cell["tok_s"] <= high)
    return width, within and width <= WIDEST_INTERVAL_PCT, within


def _row(group, size, chosen, profile, claimed: bool, cell: dict) -> dict:
    spread_width, spread_inside, spread_within = _spread_only(cell)
    return {
        "group": group,
        "runs": size,
        "profile": _names(chosen),
        "profile_settled": profile.settled,
        "model_error_pct": None if not claimed else 100 * profile.model_error["sd_rel"],
        "claimed": claimed,
        "file": cell["cell"],
        "config": _config(cell),
        "measured": cell["tok_s"],
        "predicted": cell["tok_s_predicted"],
        "low": cell["tok_s_low_predicted"],
        "high": cell["tok_s_high_predicted"],
        "error_pct": cell["tok_s_error_pct"],
        "inside": bool(cell["inside_interval"]),
        "within": _within(cell),
        "width_pct": cell["interval_width_pct"],
        "spread_inside": spread_inside,
        "spread_within": spread_within,
        "spread_width_pct": spread_width,
        "left out": left_out(cell),
        "unpriced": cell.get("unpriced"),
        "notes": cell["notes"],
    }


def _names(runs) -> str:
    return "+".join(Path(r.name).stem for r in runs)


def _config(cell: dict) -> str:
    return cell_label(cell)


def _within(cell: dict) -> bool:
    return bool(cell["tok_s_low_predicted"] <= cell["tok_s"] <= cell["tok_s_high_predicted"])


def headline(table: pd.DataFrame) -> pd.DataFrame:
    """Per group, profile size and interval kind (claiming its coverage: the model error was
    measured; or the spread only): the out-of-sample predictions of firm measurements, their
    median |error|, how many the interval covers and its median width, beside the same for
    the spread-only interval (the one before the model error was added) on the same cells."""
    firm = table[table["left out"].isna() & table["predicted"].notna()]
    out = []
    keys = ["group", "runs", "claimed"] if "runs" in firm else ["group", "claimed"]
    for key, part in firm.groupby(keys):
        group, size, claimed = key if len(key) == 3 else (key[0], 2, key[1])
        err = part["error_pct"].abs()
        n = len(part)
        out.append(
            {
                "group": group,
                "runs": int(size),
                "interval": "spread+model" if claimed else "spread only",
                "profiles": part["profile"].nunique(),
                "predictions": n,
                "median |err| %": float(err.median()),
                "max |err| %": float(err.max()),
                "inside": f"{int(part['inside'].sum())} of {n}",
                "within": int(part["within"].sum()),
                "median width %": float(part["width_pct"].median()),
                "spread-only inside": f"{int(part['spread_inside'].sum())} of {n}",
                "spread-only within": int(part["spread_within"].sum()),
                "spread-only width %": float(part["spread_width_pct"].median()),
            }
        )
    return pd.DataFrame(out)


def unpriced_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The predictions left out because the profile does not price them, with their error."""
    part = table[table["unpriced"].notna() & table["left out"].eq(table["unpriced"])]
    return part[["runs", "profile", "file", "measured", "predicted", "error_pct"]]


def gemma_halves(corpus: Path) -> dict:
    """The gemma phone run: a profile of its first half of tokens, its second half's tok/s
    predicted from the replay of its own trace."""
    run = profile_runs(_quiet(read_recorded_runs, [corpus / "route-trace" / "gemma.metrics"]))[0]
    rows = run.metrics.rows
    config = run_config(run)
    half = len(rows) // 2
    first = replace(run, metrics=replace(run.metrics, rows=rows.iloc[:half].reset_index(drop=True)))
    profile = _quiet(build_profile, [first])
    reads = cell_reads(
        run.route, replay.prepare_batches(run.route), "lru", config.cache_mb, config.prefetch
    )
    times = token_times(
        profile, reads, config.io_threads, compute_ms=profile.compute["token_ms"], overlap=True
    )
    predicted = 1000.0 * (len(rows) - half) / times["wall_ms"].iloc[half:].sum()
    measured = 1000.0 * (len(rows) - half) / rows["wall_ms"].iloc[half:].sum()
    return {"measured": measured, "predicted": predicted,
            "error_pct": 100 * (predicted / measured - 1)}  # fmt: skip


def native_tiny(corpus: Path) -> pd.DataFrame:
    """The native-tiny host runs: a profile of ``run`` and ``pf`` predicting the others from
    the ``pf`` routing (same prompt as ``ct``, ``ctl``; ``drop`` replayed with --drop 1.0
    through its own trace); what its intervals are made of in ``attrs["interval"]``."""
    tiny = corpus / "native-tiny"
    profile = _quiet(
        build_profile, profile_runs(_quiet(read_recorded_runs, [tiny / "run.csv", tiny / "pf.csv"]))
    )
    others = profile_runs(
        _quiet(read_recorded_runs, [tiny / n for n in ("ct.csv", "ctl.csv", "mmap.csv")])
    )
    pf = profile_runs(_quiet(read_recorded_runs, [tiny / "pf.csv"]))[0]
    parts = [_quiet(against_files, pf.route, profile, others)["cells"]]
    drop = profile_runs(_quiet(read_recorded_runs, [tiny / "drop.csv"]))[0]
    parts.append(_quiet(against_files, drop.route, profile, [drop], drop=1.0)["cells"])
    cells = pd.concat(parts, ignore_index=True)
    columns = ["cell", "tok_s", "tok_s_predicted", "tok_s_low_predicted",
               "tok_s_high_predicted", "tok_s_error_pct", "inside_interval", "mib_per_token",
               "mib_per_token_predicted", "comparable", "measurement"]  # fmt: skip
    out = cells[columns]
    out.attrs["interval"] = interval_kind(profile)[0]
    return out


TINY_SWEEP = ROOT / "bench-data" / "2026-11-29-tiny-cache-lanes"


def host_table(folder: Path = TINY_SWEEP, every: int = 7) -> pd.DataFrame:
    """The archived host sweep's files as loose files: a profile of every `every`-th pair of
    its configurations (all their repeats) predicting the other configurations' files from
    their own reads; one row per (profile, file)."""
    runs = profile_runs(_quiet(read_recorded_runs, [folder / "cells"]))
    by_config: dict[tuple, list[ProfileRun]] = {}
    for run in runs:
        config = run_config(run)
        by_config.setdefault((config.cache_mb, config.io_threads), []).append(run)
    configs = sorted(by_config)
    rows = []
    for a, b in list(itertools.combinations(configs, 2))[::every]:
        chosen = by_config[a] + by_config[b]
        profile = _quiet(build_profile, chosen)
        claimed = interval_kind(profile)[1]
        rest = [r for c in configs if c not in (a, b) for r in by_config[c]]
        cells = _quiet(against_files, None, profile, rest)["cells"]
        for cell in cells.to_dict("records"):
            row = _row("tiny-cache-lanes", 2, chosen, profile, claimed, cell)
            row["profile"] = f"{a[0]:g}M {a[1]}L + {b[0]:g}M {b[1]}L"
            rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- levers


def _lever_rows(lever: str, group: str, without, with_, profiles_of, predict_with) -> list:
    """Every profile of `profiles_of(without)` predicting the runs `with_` (a lever's runs):
    one row per (profile, run) with the error, the interval and whether the prediction was
    declared unpriced (or not predicted, and why)."""
    rows = []
    for label, chosen in profiles_of(without):
        try:
            profile = _quiet(build_profile, list(chosen))
        except BmoeError as exc:
            rows.append({"lever": lever, "group": group, "profile": label, "file": "-",
                         "predicted": None, "why": f"no profile: {exc}"})  # fmt: skip
            continue
        cells = predict_with(profile, with_)
        for cell in cells.to_dict("records"):
            predicted = cell["tok_s_predicted"]
            ok = predicted == predicted
            rows.append(
                {
                    "lever": lever,
                    "group": group,
                    "profile": label,
                    "file": cell["cell"],
                    "measured": cell["tok_s"],
                    "predicted": predicted if ok else None,
                    "error_pct": cell["tok_s_error_pct"] if ok else None,
                    "within": _within(cell) if ok else None,
                    "width_pct": cell["interval_width_pct"] if ok else None,
                    "unpriced": cell.get("unpriced_levers") if ok else None,
                    "firm": cell.get("measurement") is None,
                    "why": None if ok else (cell.get("comparable") or "not predicted"),
                }
            )
    return rows


def _profiles(max_runs: int = 2):
    def of(runs):
        for size in range(1, max_runs + 1):
            for chosen in itertools.combinations(runs, size):
                yield _names(chosen), chosen

    return of


def _against(trace=None, drop=None):
    def predict_with(profile, runs):
        return _quiet(against_files, trace, profile, runs, drop=drop)["cells"]

    return predict_with


def lever_table(corpus: Path, folder: Path = TINY_SWEEP) -> pd.DataFrame:
    """Leave one lever out: for every lever the corpus and the archived host sweep vary,
    profiles built only from runs without it predict the runs with it (the phone files from
    their own reads; native-tiny's drop from its own trace replayed with the drop)."""
    groups = phone_groups(corpus)
    v0 = [r for r in groups["v0 files (no preamble)"] if run_config(r).streaming]
    configs = {r.name: run_config(r) for r in v0}
    rows: list[dict] = []
    prefetch = [r for r in v0 if configs[r.name].prefetch > 0]
    rows += _lever_rows("prefetch", "phone v0", [r for r in v0 if r not in prefetch], prefetch,
                        _profiles(), _against())  # fmt: skip
    serial = [r for r in v0 if not configs[r.name].overlap]
    overlapped = [r for r in v0 if configs[r.name].overlap]
    rows += _lever_rows("overlap (serial -> --overlap)", "phone v0", serial, overlapped,
                        _profiles(), _against())  # fmt: skip
    rows += _lever_rows("overlap (--overlap -> serial)", "phone v0", overlapped, serial,
                        _profiles(), _against())  # fmt: skip
    largest = max(configs[r.name].cache_mb or 0 for r in v0)
    big = [r for r in v0 if (configs[r.name].cache_mb or 0) >= largest]
    rows += _lever_rows("cache_mb (larger than any run)", "phone v0",
                        [r for r in v0 if r not in big], big, _profiles(), _against())  # fmt: skip
    v1 = next(runs for key, runs in groups.items() if "(v1)" in key)
    rows += _lever_rows("dense_weights", "phone v1", v1[:1], v1[1:], _profiles(1), _against())
    tiny = corpus / "native-tiny"
    base = profile_runs(_quiet(read_recorded_runs, [tiny / "run.csv"]))
    drop = profile_runs(_quiet(read_recorded_runs, [tiny / "drop.csv"]))
    rows += _lever_rows("drop", "native-tiny", base, drop, _profiles(1),
                        _against(drop[0].route, drop=1.0))  # fmt: skip
    pf = profile_runs(_quiet(read_recorded_runs, [tiny / "pf.csv"]))
    rows += _lever_rows("prefetch", "native-tiny", base, pf, _profiles(1), _against(pf[0].route))
    rows += _host_lever_rows(folder)
    return pd.DataFrame(rows)


def _host_lever_rows(folder: Path) -> list:
    """The archived host sweep: profiles of the cells of one lane count (two budgets, all
    their repeats) predicting the other lane counts' cells; profiles of the two smallest
    budgets at one lane count predicting the larger budgets at that lane count."""
    runs = profile_runs(_quiet(read_recorded_runs, [folder / "cells"]))
    by_config: dict[tuple, list[ProfileRun]] = {}
    for run in runs:
        config = run_config(run)
        by_config.setdefault((config.cache_mb, config.io_threads), []).append(run)
    budgets = sorted({b for b, _ in by_config})
    lanes = sorted({n for _, n in by_config})
    rows = []

    def pair(configs_):
        label = " + ".join(f"{b:g}M {n}L" for b, n in configs_)
        return [(label, [r for c in configs_ for r in by_config[c]])]

    for n in lanes:
        chosen = [(budgets[1], n), (budgets[-2], n)]
        others = [r for (b, m), rs in by_config.items() if m != n and b in (budgets[1], budgets[-2])
                  for r in rs]  # fmt: skip
        rows += _lever_rows("io_threads", "host tiny", chosen, others, pair, _against())
        small = [(budgets[0], n), (budgets[1], n)]
        large = [r for (b, m), rs in by_config.items() if m == n and b >= budgets[-2] for r in rs]
        rows += _lever_rows("cache_mb (larger than any run)", "host tiny", small, large, pair,
                            _against())  # fmt: skip
    return rows


def lever_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per lever: how many runs were predicted, their median |error|, the share within the
    interval's bounds and its median width, how many were declared unpriced, how many were
    refused (and why), and the spread of the unpriced predictions' errors (log scale: what
    :mod:`bmoe.analyze.device.levers` records)."""
    out = []
    for (lever, group), part in table.groupby(["lever", "group"], sort=False):
        done = part[part["predicted"].notna()]
        unpriced = done[done["unpriced"].notna()]
        logs = np.log1p(unpriced["error_pct"].astype(float) / 100.0)
        refused = part[part["predicted"].isna()]
        out.append(
            {
                "lever": lever,
                "group": group,
                "predictions": len(done),
                "median |err| %": float(done["error_pct"].abs().median()) if len(done) else None,
                "within": f"{int(done['within'].sum())} of {len(done)}",
                "median width %": float(done["width_pct"].median()) if len(done) else None,
                "declared unpriced": f"{len(unpriced)} of {len(done)}",
                "unpriced rms log %": 100 * float(np.sqrt(np.mean(logs**2))) if len(logs) else None,
                "refused": len(refused),
                "why refused": "; ".join(sorted({str(w)[:60] for w in refused["why"]})) or None,
            }
        )
    return pd.DataFrame(out)


def _coverage_headline(table: pd.DataFrame, levers: pd.DataFrame, host: pd.DataFrame) -> None:
    """Over every out-of-sample prediction, priced or not: the share within the 80 %
    interval's bounds and the coverages it is consistent with; the headline's priced
    predictions apart, and that none of them is unpriced."""
    phone = table[table["predicted"].notna() & ~table["left out"].fillna("").str.contains(
        "in sample")]  # fmt: skip
    phone_all = pd.concat(
        [phone[["within", "error_pct", "unpriced"]],
         levers.loc[levers["predicted"].notna() & levers["firm"], ["within", "error_pct",
                                                                   "unpriced"]]],
        ignore_index=True,
    )  # fmt: skip
    for label, part in (("phone corpus and native-tiny, every prediction", phone_all),
                        ("host sweep, every prediction", host[host["predicted"].notna()]),
                        ("host sweep leave-one-lever-out", levers[levers["predicted"].notna()
                         & levers["group"].eq("host tiny")])):  # fmt: skip
        check = coverage_check(int(part["within"].astype(bool).sum()), len(part), 0.8)
        print(f"{label}: {check['verdict']}")
    firm = table[table["left out"].isna() & table["predicted"].notna()]
    counted_unpriced = int(firm["unpriced"].notna().sum())
    print(f"headline predictions declared unpriced: {counted_unpriced} (must be 0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--csv", type=Path, default=None, help="write the full table here")
    args = parser.parse_args()
    corpus = corpus_dir(args.corpus)
    if not (corpus / "metrics").is_dir():
        raise SystemExit(f"no corpus at {corpus} (set --corpus or BMOE_CORPUS)")
    for group, runs in phone_groups(corpus).items():
        print(f"{group}:")
        for run in runs:
            config = run_config(run)
            demand = demand_mib(run)
            print(
                f"  {Path(run.name).stem:26s} v{run.metrics.version} "
                f"{config.cache_mb or 0:7.1f} MiB {config.io_threads}L "
                f"prefetch={config.prefetch} overlap={int(config.overlap)} "
                f"tokens={len(run.metrics.rows)} "
                f"demand={'-' if demand is None else f'{demand:.0f}'} MiB/token "
                f"streaming={config.streaming}"
            )
    table = phone_table(corpus)
    if args.csv:
        table.to_csv(args.csv, index=False)
    show = table[["runs", "profile", "file", "config", "measured", "predicted", "low", "high",
                  "error_pct", "inside", "left out"]]  # fmt: skip
    with pd.option_context("display.width", 220, "display.max_columns", 20,
                           "display.max_colwidth", 40, "display.max_rows", 500):  # fmt: skip
        print(show.round(2).to_string(index=False))
        print()
        print(headline(table).round(1).to_string(index=False))
        unpriced = unpriced_cells(table)
        if len(unpriced):
            print("\nleft out as unpriced (serial files from overlap-only profiles):")
            print(unpriced.round(2).to_string(index=False))
    g = gemma_halves(corpus)
    print(
        f"\ngemma phone run, first half profiling the second: measured {g['measured']:.3f} "
        f"tok/s, predicted {g['predicted']:.3f} ({g['error_pct']:+.1f} %)"
    )
    tiny = native_tiny(corpus)
    print(f"\nnative-tiny (profile of run + pf; intervals: {tiny.attrs['interval']}):")
    with pd.option_context("display.width", 240, "display.max_colwidth", 40):
        print(tiny.round(3).to_string(index=False))
    host = host_table()
    print(f"\nhost sweep {TINY_SWEEP.name}: profiles of two configurations (3 repeats each)")
    with pd.option_context("display.width", 220, "display.max_columns", 20):
        print(headline(host).round(1).to_string(index=False))
    levers = lever_table(corpus)
    print("\nleave one lever out: profiles of runs without the lever predicting the runs with it")
    with pd.option_context("display.width", 250, "display.max_columns", 20,
                           "display.max_colwidth", 60):  # fmt: skip
        print(lever_summary(levers).round(1).to_string(index=False))
    if args.csv:
        levers.to_csv(args.csv.with_suffix(".levers.csv"), index=False)
    _coverage_headline(table, levers, host)
    firm = table[table["left out"].isna() & table["predicted"].notna()]
    two = firm[firm["runs"] == 2]["error_pct"].abs()
    print(
        f"\nheadline: profiles of at most two phone runs, {len(firm)} out-of-sample "
        f"predictions of firm measurements: median |tok/s error| "
        f"{firm['error_pct'].abs().median():.1f} % (two-run profiles: {two.median():.1f} % over "
        f"{len(two)}); target <= 15 %"
    )


if __name__ == "__main__":
    main()
