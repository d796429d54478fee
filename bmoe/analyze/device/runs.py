"""A recorded run as the profile sees it, its configuration, whether a profile can price it.

A recorded run as the profile sees it, and the configuration it measured.

What a file does not say about its configuration is inferred (from its summary, its
end-of-run lines, its rows) or taken as the engine's default, and the run's
:class:`RunConfig` says which and how in ``assumed``.

Whether a recorded run is one a profile can price: streaming, the same top-k, the same
model, the same dense weights.

Runs as the profile sees them, from what was read of their files.

Reading a run's files (its metrics, the traces, ``record.json``, end-of-run lines and pressure
sidecar beside it) is the formats layer's (:func:`bmoe.formats.runfiles.read_recorded_runs`);
this module turns each run read into one :class:`ProfileRun`, reading nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from bmoe.cache import DEFAULT_POLICY, policy_name
from bmoe.formats.metrics import MetricsRun
from bmoe.formats.op_traces import ComputeTrace, IoTrace
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace

if TYPE_CHECKING:
    from bmoe.formats.runfiles import RecordedRun


#: The native engine's defaults for what a file without a preamble does not say.
DEFAULT_LANES = 4
DEFAULT_THREADS = 4


def number(value: Any) -> float | None:
    """`value` as a finite float, else None."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


@dataclass
class ProfileRun:
    """One recorded run: its metrics and whichever traces and records were written with it."""

    metrics: MetricsRun
    route: RouteTrace | None = None
    io: IoTrace | None = None
    compute: ComputeTrace | None = None
    record: dict[str, Any] | None = None  # the sweep's record.json of the run
    log: dict[str, Any] = field(default_factory=dict)  # end-of-run figures (.log / .out)
    pressure: dict[str, Any] = field(default_factory=dict)  # the .metrics sidecar
    streaming_line: dict[str, Any] = field(default_factory=dict)  # "expert streaming ON" keys

    @property
    def name(self) -> str:
        return self.metrics.path or "run"

    @property
    def compute_traced(self) -> bool:
        params = self.metrics.params
        return self.compute is not None or bool(params.get("compute_trace_layers"))

    @property
    def traced(self) -> bool:
        """Instrumented: a trace was recorded with it, or its preamble says it was probed."""
        params = self.metrics.params
        probed = any(bool(params.get(k)) for k in ("predict_log", "prefetch_sync"))
        recorded = self.record is not None and any(
            bool((self.record.get("params") or {}).get(k))
            for k in ("route_trace", "io_trace", "compute_trace", "compute_trace_layers")
        )
        return (
            self.compute_traced
            or self.route is not None
            or self.io is not None
            or probed
            or recorded
        )

    @property
    def lanes(self) -> int:
        return run_config(self).io_threads

    @property
    def overlap(self) -> bool:
        return run_config(self).overlap

    def figure(self, key: str) -> Any:
        """A summary figure: the trailer's, else the end-of-run line's, else None."""
        value = self.metrics.summary.get(key)
        return self.log.get(key) if value is None else value


@dataclass
class RunConfig:
    """The configuration a run used, from its preamble; what a file does not say is inferred
    (from its summary, its end-of-run lines, its rows) or the engine's default, and
    ``assumed`` says which and how."""

    cache_mb: float | None
    io_threads: int
    prefetch: int
    overlap: bool
    policy: str
    threads: int
    n_expert_used: int | None
    drop: float | None
    streaming: bool
    assumed: dict[str, str] = field(default_factory=dict)

    def axes(self) -> dict[str, Any]:
        return {
            "cache_mb": self.cache_mb,
            "io_threads": self.io_threads,
            "prefetch": self.prefetch,
            "overlap": int(self.overlap),
            "policy": self.policy,
        }


def _cache_mb(run: ProfileRun, assumed: dict[str, str]) -> float | None:
    rows = run.metrics.rows
    cache = number(run.metrics.params.get("cache_mb"))
    if cache is not None:
        return cache
    for source, value in (
        ("the rows' cache_budget_mib", rows["cache_budget_mib"].median()
         if "cache_budget_mib" in rows and len(rows) else None),
        ("the summary's cache_budget_MiB", run.figure("cache_budget_MiB")),
        ("the log's expert streaming line", run.streaming_line.get("cache")),
        ("the resident cache (cache_resident_MiB)", run.figure("cache_resident_MiB")),
    ):  # fmt: skip
        cache = number(value)
        if cache is not None:
            assumed["cache_mb"] = f"from {source}"
            return cache
    return None


def _lanes(run: ProfileRun, assumed: dict[str, str]) -> int:
    io_meta = run.io.meta if run.io is not None else {}
    lanes = number(run.metrics.params.get("io_threads")) or number(io_meta.get("io_threads"))
    if not lanes:
        lanes = number(run.streaming_line.get("io_threads"))
        if lanes:
            assumed["io_threads"] = "from the log's expert streaming line"
        else:
            lanes = DEFAULT_LANES
            assumed["io_threads"] = f"not recorded: the engine's default {DEFAULT_LANES}"
    return int(lanes)


def _prefetch(run: ProfileRun, assumed: dict[str, str]) -> int:
    params = run.metrics.params
    if "prefetch" in params:
        return int(number(params.get("prefetch")) or 0)
    spec = number(run.figure("spec_read_MiB")) or 0.0
    if spec > 0:
        assumed["prefetch"] = (
            f"on ({spec:.1f} MiB speculative in its summary); its depth is not recorded"
        )
    return 1 if spec > 0 else 0


def _overlap(run: ProfileRun, assumed: dict[str, str]) -> bool:
    params, rows = run.metrics.params, run.metrics.rows
    if "overlap" in params:
        return bool(params["overlap"])
    stalled = "stall_ms" in rows and bool((rows["stall_ms"] > 0).any())
    assumed["overlap"] = "from stall_ms (non-zero under --overlap only)"
    return stalled or bool(number(run.figure("stall_s/tok")))


def _threads(run: ProfileRun, assumed: dict[str, str]) -> int:
    params = run.metrics.params
    threads = number(params.get("threads")) or number(run.figure("threads"))
    if not threads:
        threads = DEFAULT_THREADS
        assumed["threads"] = f"not recorded: the engine's default {DEFAULT_THREADS}"
    if "threads" not in params and "threads" in run.log:
        assumed["threads"] = "from the end-of-run compute line"
    return int(threads)


def _streaming(run: ProfileRun) -> bool:
    params, rows = run.metrics.params, run.metrics.rows
    streaming = bool(params.get("moe_stream", 1))
    if "moe_stream" not in params and "read_bytes" in rows and len(rows):
        hit = rows["cache_hit_pct"] if "cache_hit_pct" in rows else pd.Series([0.0])
        streaming = bool((rows["read_bytes"] > 0).any()) or bool((hit >= 0).any())
    return streaming


def run_config(run: ProfileRun) -> RunConfig:
    """What configuration `run` measured (see :class:`RunConfig`)."""
    params = run.metrics.params
    assumed: dict[str, str] = {}
    cache = _cache_mb(run, assumed)
    lanes = _lanes(run, assumed)
    prefetch = _prefetch(run, assumed)
    overlap = _overlap(run, assumed)
    named = params.get("cache_policy")
    policy = policy_name(named) if named else DEFAULT_POLICY
    threads = _threads(run, assumed)
    k = number(params.get("n_expert_used"))
    if k is None and run.route is not None:
        k = number(run.route.meta.get("n_expert_used"))
    drop = number(params.get("drop_cold_frac"))
    return RunConfig(
        cache_mb=cache,
        io_threads=lanes,
        prefetch=prefetch,
        overlap=overlap,
        policy=policy,
        threads=threads,
        n_expert_used=int(k) if k else None,
        drop=drop if drop else None,
        streaming=_streaming(run),
        assumed=assumed,
    )


def _same_model(params: dict, profile: DeviceProfile) -> str | None:
    """Why a file is not of the profile's model (None: it is, as far as both say)."""
    for key in ("n_layer", "n_expert"):
        mine = number(params.get(key))
        theirs = number(profile.model.get(key))
        if mine is not None and theirs is not None and mine != theirs:
            return f"another model ({key} {int(mine)}, the profile's {int(theirs)})"
    file_knows = number(params.get("n_layer")) is not None
    profile_knows = number(profile.model.get("n_layer")) is not None
    if file_knows == profile_knows:
        return None
    if file_knows:
        return (
            f"a run of {params.get('model') or 'a named model'}; the profile's runs do not "
            "record their model: cannot tell it is the same"
        )
    return (
        "its file does not record its model (v0): cannot tell it is the profile's "
        f"({profile.model.get('name') or 'named'})"
    )


def not_comparable(
    run: ProfileRun, config: RunConfig, profile: DeviceProfile, k_trace: float | None
) -> str | None:
    """Why no prediction of `run` can be compared with it (None: it can): no expert
    streaming, another top-k than the trace's or the profile's, another model, other dense
    weights than the profile's runs."""
    params = run.metrics.params
    k_profile = number(profile.model.get("n_expert_used"))
    k = config.n_expert_used
    if not config.streaming:
        return "no expert streaming (plain mmap): nothing the profile prices"
    if k and k_trace and k != k_trace:
        return f"top-{k}, the trace top-{int(k_trace)} (--n-expert-used changes the routing)"
    if k and k_profile and k != k_profile:
        return f"top-{k}, the profile's runs top-{int(k_profile)}"
    why = _same_model(params, profile)
    if why is not None:
        return why
    dense = params.get("dense_weights")
    profile_dense = {
        str(r["dense_weights"]) for r in profile.runs if r.get("dense_weights") is not None
    }
    if dense is not None and profile_dense and dense not in profile_dense:
        return (
            f"dense weights {dense}, the profile's runs {', '.join(sorted(profile_dense))}: "
            "not a configuration the profile prices"
        )
    return None


def profile_run(recorded: RecordedRun) -> ProfileRun:
    """One run read (its metrics, traces by kind, record, end-of-run figures, pressure and
    streaming line) as a :class:`ProfileRun`."""
    traces = recorded.traces
    return ProfileRun(
        recorded.metrics,
        route=traces.get("route"),
        io=traces.get("io"),
        compute=traces.get("compute"),
        record=recorded.record,
        log=dict(recorded.figures),
        pressure=dict(recorded.pressure),
        streaming_line=dict(recorded.streaming_line),
    )


def profile_runs(recorded: Iterable[RecordedRun]) -> list[ProfileRun]:
    """:func:`profile_run` of each run read, in order."""
    return [profile_run(r) for r in recorded]


__all__ = [
    "DEFAULT_LANES",
    "DEFAULT_THREADS",
    "ProfileRun",
    "RunConfig",
    "not_comparable",
    "number",
    "profile_run",
    "profile_runs",
    "run_config",
]
