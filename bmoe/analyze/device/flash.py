"""The profile's flash table, measured from the runs: request latency by lane count.

The profile's flash table: request latency by lane count, from io traces where the runs
have them, else from the serial runs' ``io_ms`` against their reads, else from the lanes'
busy time of ``--overlap`` runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from bmoe.analyze.device.evidence import Evidence, Tokens
from bmoe.analyze.device.fits import fit_line, fit_two, provenance, term_spread, volume_groups
from bmoe.analyze.device.lanes import (
    BATCH_SOURCE,
    OVERLAP_SOURCE,
    batch_flash_ms,
    request_latency_ms,
)
from bmoe.analyze.device.runs import ProfileRun, RunConfig
from bmoe.analyze.device.timing import excess_at, flash_factor
from bmoe.errors import BmoeError
from bmoe.formats.op_traces import IoTrace
from bmoe.units import MIB

_EMPTY = ["lanes", "req_bytes", "latency_ms"]


#: The columns of an io trace that say which read batch (one layer's misses of one step) a
#: request belongs to.
BATCH_KEYS = ["turn", "phase", "step", "layer"]


def _batches(rows: pd.DataFrame, lanes: int) -> pd.DataFrame:
    """Per read batch of an io trace whose requests say when they started (``start_ns``):
    its requests over `lanes` (its waves, a part-filled one counted by its part) and its
    duration (first start to last end, ms)."""
    keys = [k for k in BATCH_KEYS if k in rows]
    end = rows["start_ns"].to_numpy(np.float64) + rows["latency_ns"].to_numpy(np.float64)
    frame = rows[keys].assign(start=rows["start_ns"].to_numpy(np.float64), end=end)
    per = frame.groupby(keys, observed=True).agg(
        n=("start", "size"), start=("start", "min"), end=("end", "max")
    )
    return pd.DataFrame(
        {
            "waves": per["n"].to_numpy() / max(lanes, 1),
            "ms": (per["end"] - per["start"]).to_numpy() / 1e6,
        }
    )


def wave_latency(rows: pd.DataFrame, lanes: int) -> float | None:
    """The time one wave of requests (one on each lane) adds to a read batch, fitted over the
    batches of one run, ``duration = fixed + wave x requests / lanes`` (None where the trace
    does not say when requests started, or every batch was one size). A request's median
    latency is less than what a wave adds where the lanes start their requests one after
    another and the device shares its bandwidth among them (4 lanes on the laptop: 0.34 ms a
    request, 0.39 a wave); the difference, priced per batch at the profile's read volume, is
    carried to every other volume in proportion to the batches instead of the waves. Per
    request, not per whole wave: at 4 lanes a batch's duration follows its requests (R^2
    0.87-0.94 on generated models against 0.64-0.89 for whole waves), so whole waves priced
    a profile's small batches (1.5 waves' requests in 2 waves) dearer than the larger
    batches of a smaller cache, whose flash wait came out 15-35 % short."""
    if "start_ns" not in rows:
        return None
    rows = rows[rows["phase"] != 0] if "phase" in rows else rows  # decode: what is predicted
    if len(rows) < 8:
        return None
    batches = _batches(rows, lanes)
    if batches["waves"].nunique() < 2:
        return None
    _fixed, wave = fit_line(batches["waves"].to_numpy(), batches["ms"].to_numpy())
    return wave if wave > 0 else None


def flash_row(
    lanes: int,
    req_bytes: float,
    latency_ms: float,
    samples_ms: np.ndarray,
    reads: int,
    *,
    batch_overhead_ms: float = 0.0,
    scale: float = 1.0,
    source: str | None = None,
) -> dict:
    """One row of the flash table (:data:`bmoe.formats.profile.FLASH_COLUMNS`), however it was
    measured (runs or a probe): a request's `latency_ms` with `lanes` lanes busy (requests of
    `req_bytes`, a median where sizes mix), the 10th and 90th percentile of the per-request
    `samples_ms` (times `scale`, which puts them on the latency's scale where the latency is
    fitted rather than their median), the throughput that latency gives and the reads it
    rests on; `source` (a text column) says how it was measured."""
    row: dict[str, float | str | None] = {
        "lanes": int(lanes),
        "req_bytes": int(req_bytes),
        "latency_ms": latency_ms,
        "latency_ms_p10": float(np.quantile(samples_ms, 0.1)) * scale,
        "latency_ms_p90": float(np.quantile(samples_ms, 0.9)) * scale,
        "batch_overhead_ms": batch_overhead_ms,
        "mib_s": lanes * req_bytes / MIB / (latency_ms / 1e3) if latency_ms > 0 else None,
        "reads": int(reads),
    }
    if source is not None:
        row["source"] = source
    return row


def flash_table(io_traces: Iterable[tuple[IoTrace, int]]) -> pd.DataFrame:
    """Request latency by (lanes, request size) from io traces (each with the lane count it
    ran with): what a wave of requests adds to a batch where the traces say when requests
    started (:func:`wave_latency`), else the median request's; 10th and 90th percentile
    (ms, on the same scale), throughput at that many lanes, reads. Demand reads only
    (speculative ones queue behind them)."""
    parts: list[pd.DataFrame] = []
    waves: dict[tuple[int, int], list[float]] = {}
    for trace, lanes in io_traces:
        rows = trace.rows
        if not len(rows):
            continue
        rows = rows[rows["spec"] == 0] if "spec" in rows else rows
        # fitted over whole batches, as a ratio to what the sizes' median requests take on
        # average: a batch that mixes request sizes (a fused gate_up beside a down
        # projection) lasts all of them, and one size's requests alone span the others' too
        wave = wave_latency(rows, lanes)
        by_size = rows.groupby("req_bytes")["latency_ns"].agg(["median", "size"])
        typical = float((by_size["median"] * by_size["size"]).sum() / by_size["size"].sum())
        if wave is not None and typical > 0:
            for size in by_size.index:
                waves.setdefault((lanes, int(size)), []).append(wave / (typical / 1e6))
        parts.append(
            pd.DataFrame(
                {
                    "lanes": lanes,
                    "req_bytes": rows["req_bytes"].to_numpy(np.int64),
                    "read_bytes": rows["read_bytes"].to_numpy(np.int64),
                    "latency_ms": rows["latency_ns"].to_numpy(np.float64) / 1e6,
                }
            )
        )
    if not parts:
        return pd.DataFrame(columns=_EMPTY)
    reads = pd.concat(parts, ignore_index=True)
    grouped = reads.groupby(["lanes", "req_bytes"])
    table = grouped["latency_ms"].agg(
        latency_ms="median",
        latency_ms_p10=lambda s: s.quantile(0.1),
        latency_ms_p90=lambda s: s.quantile(0.9),
        reads="size",
    )
    for key, ratios in waves.items():
        if key in table.index:  # the percentiles scaled with it
            scale = float(np.median(ratios))
            for column in ("latency_ms", "latency_ms_p10", "latency_ms_p90"):
                table.loc[key, column] = float(table.loc[key, column]) * scale
    moved = grouped["read_bytes"].median()
    table["mib_s"] = (
        table.index.get_level_values("lanes") * moved / MIB / (table["latency_ms"] / 1e3)
    )
    out = table.reset_index()
    keys = zip(out["lanes"], out["req_bytes"], strict=True)
    fitted = [(int(n), int(size)) in waves for n, size in keys]
    out["source"] = np.where(fitted, BATCH_SOURCE, "io trace")
    return out


def waves(batches: np.ndarray, slices: int, lanes: int) -> np.ndarray:
    """Per token, the read waves of its batches at `lanes` lanes."""
    return np.ceil(batches * slices / max(lanes, 1)).sum(axis=1)


def _batch_overhead(table, runs, tokens, lanes, slices, req) -> float:
    """Per read batch, the flash wait the metrics recorded beyond the requests' latency."""
    if not runs:
        return 0.0
    flash = table.assign(batch_overhead_ms=0.0)[table["lanes"] == lanes]
    spent = predicted = batches = 0.0
    for run in runs:
        t = tokens[run.name]
        io = t.values("io_ms")
        if not np.isfinite(io).any():
            continue
        requests = t.batches * slices
        reading = requests > 0
        keep = np.isfinite(io)
        spent += float(io[keep].sum())
        per = batch_flash_ms(flash, requests[keep].ravel(), req, lanes)
        predicted += float(per.sum())
        batches += float(reading[keep].sum())
    return max(0.0, (spent - predicted) / batches) if batches else 0.0


def _metrics_row(runs, tokens, lanes: int, slices: int, req: float) -> dict | None:
    """One lane count's row from the serial runs' ``io_ms`` (see :func:`flash_from_metrics`)."""
    io, batches, wave, ratios = [], [], [], []
    for run in runs:
        t = tokens[run.name]
        w = waves(t.batches, slices, lanes)
        b = (t.batches > 0).sum(axis=1).astype(float)
        y = t.values("io_ms")
        keep = np.isfinite(y) & (w > 0)
        io.append(y[keep])
        batches.append(b[keep])
        wave.append(w[keep])
        ratios.append(y[keep] / w[keep])
    if not io or not sum(len(x) for x in io):
        return None
    y, b, w = np.concatenate(io), np.concatenate(batches), np.concatenate(wave)
    overhead, latency = fit_two(b, w, y)
    per_wave = np.concatenate(ratios)
    median = float(np.median(per_wave))
    scale = latency / median if median > 0 else 1.0
    return flash_row(
        lanes, req, latency, per_wave, int(np.sum(w) * lanes),
        batch_overhead_ms=overhead, scale=scale, source="io_ms",
    )  # fmt: skip


def flash_from_metrics(runs, tokens, configs, slices, req) -> pd.DataFrame:
    """Without io traces, from serial runs: per lane count, ``io_ms`` per token fitted as
    ``batch_overhead x batches + latency x waves`` (a wave: one request on each busy lane)."""
    out = []
    for lanes in sorted({configs[r.name].io_threads for r in runs}):
        chosen = [r for r in runs if configs[r.name].io_threads == lanes]
        row = _metrics_row(chosen, tokens, lanes, slices, req)
        if row is not None:
            out.append(row)
    return pd.DataFrame(out) if out else pd.DataFrame(columns=_EMPTY)


def flash_from_overlap(runs, tokens, configs, slices, req) -> pd.DataFrame:
    """From ``--overlap`` runs (``io_ms`` is the lanes' busy time there): per lane count, the
    busy time per request, a request's latency while the lanes read side by side."""
    out = []
    for lanes in sorted({configs[r.name].io_threads for r in runs}):
        busy, requests = [], []
        for run in (r for r in runs if configs[r.name].io_threads == lanes):
            t = tokens[run.name]
            y = t.values("io_ms")
            n = (t.values("misses") + t.values("prefetched")) * slices
            keep = np.isfinite(y) & (n > 0)
            busy.append(y[keep])
            requests.append(n[keep])
        if not busy or not sum(len(x) for x in busy):
            continue
        y, n = np.concatenate(busy), np.concatenate(requests)
        latency = float(y.sum() / n.sum())
        per = y / n
        out.append(flash_row(lanes, req, latency, per, int(n.sum()), source=OVERLAP_SOURCE))
    return pd.DataFrame(out) if out else pd.DataFrame(columns=_EMPTY)


def flash_fitted(table, tokens: Tokens, config: RunConfig, slices: int, req: float):
    """Per token, the ``io_ms`` the flash table says: the batches' wait in serial, the lanes'
    busy time (latency per request) under overlap."""
    lanes = config.io_threads
    if config.overlap:
        latency, _ = request_latency_ms(table, req, lanes)
        return latency * ((tokens.values("misses") + tokens.values("prefetched")) * slices)
    requests = tokens.batches * slices
    per = batch_flash_ms(table, requests.ravel(), req, lanes).reshape(requests.shape)
    return per.sum(axis=1)


def _fitted(ev: Evidence, table: pd.DataFrame, runs: Sequence[ProfileRun]) -> dict[str, np.ndarray]:
    """:func:`flash_fitted` of every run, the serial runs of one lane count priced in one
    call (the same figures, the lane curve interpolated once)."""
    out: dict[str, np.ndarray] = {}
    serial: dict[int, list[ProfileRun]] = {}
    for run in runs:
        config = ev.configs[run.name]
        if config.overlap:
            out[run.name] = flash_fitted(table, ev.tokens[run.name], config, ev.slices, ev.req)
        else:
            serial.setdefault(config.io_threads, []).append(run)
    for lanes, group in serial.items():
        requests = [ev.tokens[r.name].batches * ev.slices for r in group]
        flat = np.concatenate([r.ravel() for r in requests])
        per = batch_flash_ms(table, flat, ev.req, lanes)
        parts = np.split(per, np.cumsum([r.size for r in requests])[:-1])
        for run, shape, part in zip(group, requests, parts, strict=True):
            out[run.name] = part.reshape(shape.shape).sum(axis=1)
    return {r.name: out[r.name] for r in runs}


def _mean_io(ev: Evidence, runs: Sequence[ProfileRun]) -> float:
    """The runs' mean ``io_ms`` a token, each run weighed alike (NaN without any)."""
    means = [float(np.nanmean(ev.values(r, "io_ms"))) for r in runs if ev.measured(r, "io_ms")]
    return float(np.mean(means)) if means else float("nan")


def trace_levels(ev: Evidence, serial: Sequence[ProfileRun]) -> dict[int, dict[str, float]]:
    """Per lane count, how the io-traced runs' flash wait compares with the untraced runs of
    the same configurations: ``factor`` (their mean ``io_ms`` a token over the traced runs'),
    ``traced_ms`` and ``untraced_ms``; lane counts without such a pair are left out. An io
    trace gives the latency of each request of one run; how long the reads take in the
    configurations a profile predicts is what the untraced runs measured, every one of them
    (a single traced run, the first of a session or slowed by writing its trace, set the
    level of every prediction at its lanes)."""
    out: dict[int, dict[str, float]] = {}
    traced = [r for r in serial if r.io is not None]
    for lanes in sorted({ev.configs[r.name].io_threads for r in traced}):
        at = [r for r in traced if ev.configs[r.name].io_threads == lanes]
        keys = {ev.config_key(r) for r in at}
        twins = [r for r in serial if r.io is None and not r.traced and ev.config_key(r) in keys]
        twin_keys = {ev.config_key(t) for t in twins}
        paired = [r for r in at if ev.config_key(r) in twin_keys]
        traced_ms, untraced_ms = _mean_io(ev, paired), _mean_io(ev, twins)
        if traced_ms > 0 and untraced_ms > 0:
            out[int(lanes)] = {
                "factor": untraced_ms / traced_ms,
                "traced_ms": traced_ms,
                "untraced_ms": untraced_ms,
            }
    return out


def _uncontended(ev: Evidence, run: ProfileRun) -> IoTrace:
    """A run's io trace on the scale of its tokens: a contended run's token times are divided
    by its slowdown (:mod:`bmoe.analyze.device.state`), and so are its requests'
    latencies and start times, else the table and the level it is brought to
    (:func:`trace_levels`, which compares scaled flash waits) would price one run's wait at
    two scales."""
    assert run.io is not None
    factor = next((s.get("slowdown") for s in ev.states if s["name"] == run.name), None)
    if not factor or factor == 1.0:
        return run.io
    rows = run.io.rows.copy()
    for column in ("latency_ns", "start_ns"):
        if column in rows:
            rows[column] = rows[column].to_numpy(np.float64) / float(factor)
    return replace(run.io, rows=rows)


def _from_io_traces(
    ev: Evidence, serial: Sequence[ProfileRun], levels: dict[int, dict[str, float]]
):
    """The table of the serial runs' io traces (per-batch overhead from their ``io_ms``),
    each lane count's latencies brought to the level of the untraced runs of the traced
    runs' configurations (`levels`, :func:`trace_levels`), completed by lane counts only untraced
    serial runs measured; its runs and columns."""
    configs = ev.configs
    table = flash_table(
        (_uncontended(ev, r), configs[r.name].io_threads) for r in serial if r.io is not None
    )
    if not len(table):
        return table, [], []
    for lanes, level in levels.items():
        rows = table["lanes"] == lanes
        for column in ("latency_ms", "latency_ms_p10", "latency_ms_p90"):
            table.loc[rows, column] = table.loc[rows, column] * level["factor"]
        table.loc[rows, "mib_s"] = table.loc[rows, "mib_s"] / level["factor"]
    table["batch_overhead_ms"] = 0.0
    for lanes in sorted(table["lanes"].unique()):
        at = [r for r in serial if configs[r.name].io_threads == lanes]
        if int(lanes) in levels:  # the traced runs' io_ms is the level the untraced replaced
            at = [r for r in at if r.io is None]
        table.loc[table["lanes"] == lanes, "batch_overhead_ms"] = _batch_overhead(
            table, at, ev.tokens, int(lanes), ev.slices, ev.req
        )
    runs = [r for r in serial if r.io is not None]
    columns = ["io trace latency_ns", "io_ms"]
    traced_lanes = set(table["lanes"])
    rest = [r for r in serial if configs[r.name].io_threads not in traced_lanes]
    more = flash_from_metrics(rest, ev.tokens, configs, ev.slices, ev.req)
    if len(more):  # lane counts only untraced runs measured: from their io_ms
        table = pd.concat([table, more], ignore_index=True)
        runs += [r for r in rest if ev.measured(r, "io_ms")]
        columns.append("read_bytes")
    return table, runs, columns


def flash_by_read(ev: Evidence, priced: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
    """Per lane count, how much longer the serial runs' measured ``io_ms`` is than what the
    flash table prices for their reads (`priced`: per run, as :func:`flash_fitted` prices
    it; the runs it names are the candidates), one point per read volume (``excess_ms``: ms a
    token, the runs of one volume pooled; negative where the table prices too much),
    ascending; a lane count only where its runs read two volumes at least
    :data:`~bmoe.analyze.device.fits.SAME_VOLUME` apart. Runs without any trace are used
    where a lane count has them (a traced run's flash is slowed by its trace). The table is
    one curve over all the configurations of a lane count; a configuration that reads
    another volume waits more or less than it says (the page cache keeps more of a small
    working set; a token's fixed costs weigh more where it reads little), so a
    configuration is priced from the runs nearest its volume
    (:func:`bmoe.analyze.device.timing.excess_at`). In ms, not as a ratio: where a run
    reads little, a fixed cost a token is a large ratio that, carried to a volume six
    times larger, priced its flash 1.5 times too high."""
    configs = ev.configs
    serial = [r for r in ev.runs if r.name in priced and not configs[r.name].overlap]
    out: list[dict[str, float]] = []
    for lanes in sorted({configs[r.name].io_threads for r in serial}):
        at = [r for r in serial if configs[r.name].io_threads == lanes]
        at = [r for r in at if not r.traced] or at
        points = []
        for run in at:
            spent, model = ev.values(run, "io_ms"), priced[run.name]
            keep = np.isfinite(spent) & np.isfinite(model)
            if keep.any():
                sums = (float(spent[keep].sum() - model[keep].sum()), int(keep.sum()))
                points.append((float(np.nanmean(ev.values(run, "read_mib"))), sums))
        groups = volume_groups(points)
        if len(groups) >= 2:
            out += [
                {
                    "lanes": int(lanes),
                    "read_mib": float(np.mean([m for m, _s in g])),
                    "excess_ms": sum(s[0] for _m, s in g) / sum(s[1] for _m, s in g),
                }
                for g in groups
            ]
    return out


def _with_excess(
    ev: Evidence, fitted: dict[str, np.ndarray], by_read: list[dict[str, float]]
) -> dict[str, np.ndarray]:
    """`fitted` (each run's priced ``io_ms``) with the per-volume excess at the run's lanes
    and volume added as a prediction adds it (runs that differ because they read different
    volumes do not disagree)."""
    out = dict(fitted)
    for name, values in fitted.items():
        config = ev.configs[name]
        mib = ev.tokens[name].values("read_mib")
        if config.overlap or not np.isfinite(mib).any():
            continue
        excess = excess_at(by_read, float(np.nanmean(mib)), config.io_threads)
        priced = float(np.nanmean(values)) if np.isfinite(values).any() else 0.0
        out[name] = values * flash_factor(excess, priced)
    return out


def _lane_note(table: pd.DataFrame) -> str:
    lanes_seen = sorted(int(x) for x in table["lanes"].unique())
    if len(lanes_seen) == 1:
        return (
            f"measured at {lanes_seen[0]} lanes only (one point of the lane curve: other lane "
            "counts are scaled per lane, throughput held past it)"
        )
    return f"lane curve from {', '.join(map(str, lanes_seen))} lanes"


def flash_section(ev: Evidence) -> tuple[pd.DataFrame, list[dict[str, float]]]:
    """The flash table (io traces, else the serial runs' io_ms, else the overlap runs' lane
    time), its per-volume excess (:func:`flash_by_read`) and its term record in
    ``ev.terms``; refused when no run measured flash."""
    configs = ev.configs
    serial = [r for r in ev.runs if not configs[r.name].overlap]
    overlapped = [r for r in ev.runs if configs[r.name].overlap]
    levels = trace_levels(ev, serial)
    table, flash_runs, flash_cols = _from_io_traces(ev, serial, levels)
    if not len(table):
        table = flash_from_metrics(serial, ev.tokens, configs, ev.slices, ev.req)
        flash_runs = [r for r in serial if ev.measured(r, "io_ms")]
        flash_cols = ["io_ms", "read_bytes"]
    lane_counts = set(table["lanes"]) if len(table) else set()
    others = [r for r in overlapped if configs[r.name].io_threads not in lane_counts]
    extra = flash_from_overlap(others, ev.tokens, configs, ev.slices, ev.req)
    if len(extra):
        table = pd.concat([table, extra], ignore_index=True) if len(table) else extra
        flash_runs += others
        flash_cols.append("io_ms (lane busy time under --overlap)")
    if not len(table):
        raise BmoeError(
            "no flash measurement among the runs: no io trace and no token that read experts "
            "with an io_ms column"
        )
    local = [
        r for r in serial if ev.measured(r, "io_ms") and np.isfinite(ev.values(r, "read_mib")).any()
    ]
    priced = _fitted(ev, table, list({id(r): r for r in [*flash_runs, *local]}.values()))
    by_read = flash_by_read(ev, {r.name: priced[r.name] for r in local})
    if "io trace latency_ns" not in flash_cols:
        levels = {}
    scaled = [
        f"io trace latencies at {lanes} lane{'s' if lanes != 1 else ''} scaled "
        f"x{level['factor']:.3g} to the untraced runs of its configurations (io_ms "
        f"{level['untraced_ms']:.3g} against {level['traced_ms']:.3g} ms a token)"
        for lanes, level in levels.items()
    ]
    spread_runs = _spread_runs(ev, flash_runs, local)
    fitted = _with_excess(ev, {r.name: priced[r.name] for r in spread_runs}, by_read)
    spread_measured = {r.name: ev.values(r, "io_ms") for r in spread_runs}
    ev.terms["flash"] = provenance(
        [r.name for r in flash_runs],
        flash_cols,
        term_spread(spread_measured, fitted, ev.config_keys(spread_runs)),
        note="; ".join([_lane_note(table), *scaled, *_by_read_notes(by_read)]),
    )
    return table, by_read


def _spread_runs(
    ev: Evidence, flash_runs: Sequence[ProfileRun], local: Sequence[ProfileRun]
) -> list[ProfileRun]:
    """The runs whose flash wait says how much a repeat moves it: at a lane count where runs
    without any trace measured it, those (the traced runs are brought to their level, and
    two of them of one configuration are what a repeat is; a traced run's own wait is slowed
    by its trace), else the runs the table came from."""
    untraced = [r for r in local if r.io is None and not r.traced]
    lanes = {ev.configs[r.name].io_threads for r in untraced}
    rest = [r for r in flash_runs if ev.configs[r.name].io_threads not in lanes]
    return list({r.name: r for r in [*untraced, *rest]}.values())


def _by_read_notes(by_read: list[dict[str, float]]) -> list[str]:
    """One note per lane count with a per-volume excess."""
    notes = []
    for lanes in sorted({int(p["lanes"]) for p in by_read}):
        points = ", ".join(
            f"{p['excess_ms']:+.3g} ms at {p['read_mib']:.3g} MiB"
            for p in by_read
            if int(p["lanes"]) == lanes
        )
        notes.append(
            f"measured flash wait a token beyond the table's at {lanes} "
            f"lane{'s' if lanes != 1 else ''} "
            f"by MiB read a token: {points} (interpolated; beyond them, the nearest one's a MiB)"
        )
    return notes


__all__ = [
    "flash_by_read",
    "flash_fitted",
    "flash_from_metrics",
    "flash_from_overlap",
    "flash_row",
    "flash_section",
    "flash_table",
    "trace_levels",
    "wave_latency",
    "waves",
]
