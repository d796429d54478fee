"""The device model: profiles from recorded runs, predictions, and a tune's decisions.

Build a device profile from runs already recorded.

Each run contributes what it has. Its metrics CSV (any version: v0 without a preamble, v1, v2)
gives the per-token times: flash wait (``io_ms``; under ``--overlap`` the lanes' busy time and
the ``stall_ms`` compute lost to reads), the ``compute_ms`` residual and the CPU time
(``cpu_ms``), cache management (``mgmt_ms``), major faults and the memory picture. Beside it, a
route trace gives the expert sizes and exactly which experts each decode step missed, an io
trace the latency of every flash request, a compute trace the split of compute into dense and
expert work, and a sweep's ``record.json`` the system state the run was measured in.

Every term records which runs and columns it came from and how settled it is (the spread of
its per-run means and of its means over blocks of tokens); a term no run measured is absent and
named, never a silent zero. Expert sizes come, in order, from a route trace (given, or beside
a run), from sizes the caller read from the model file, or from the preamble (v2's
``cache_cycle_mb``, v1's ``token_demand_MiB`` / ``layer_demand_MiB``); without any, the profile
prices MiB read instead of reads and says so.

A compute-traced run is instrumented: its compute time is refused unless asked, and then the
profile carries the caveat. Route- and io-traced runs are slower than untraced ones too: where
the profile has untraced runs, compute, management and the overlap stall come from those, and
the traced runs give the routing and the flash latencies (the profile's ``tracing`` says which;
where a traced and an untraced run share a configuration, the overhead is measured).

Predict a run's speed for configurations that were never run.

The recorded routing goes through each configuration's cache with the existing replay
(:mod:`bmoe.analyze.replay`), which says exactly which experts each decode step misses, so
MiB/token and hit % are replay figures, not estimates. A :class:`~bmoe.formats.profile.
DeviceProfile` then turns those misses into time, token by token:

* flash wait: for every layer that misses ``m`` experts of ``s`` slices each, the lanes read
  ``m * s`` requests: ``batch_overhead + latency(request size, lanes) * ceil(m * s / lanes)``
  (serial engines; without the ceiling where an io trace's batches showed each request
  adding its share: :data:`~bmoe.analyze.device.lanes.BATCH_SOURCE`), plus the wait a
  token the profile's runs measured beyond that at the
  configuration's lanes and MiB read a token, where they read several volumes
  (``flash_by_read``, spread over the tokens in proportion to their wait); under
  ``--overlap`` the stall per missed expert;
* cache management: ``token_ms + per_admit_ms * (misses + prefetched experts)``;
* compute: the profile's time per token at the configuration's MiB read a token (its
  ``by_read`` points interpolated, the nearest held beyond them);
* prefetch (``--prefetch K``): the speculative reads' lane time beyond what compute hides.

Latency for a lane count the profile lacks is interpolated per lane (throughput saturates
past the largest measured count), and a batch's flash time is the best over any lane count up
to the asked one: more lanes never predict slower flash. A serial configuration predicted from
a profile whose flash rows all come from ``--overlap`` runs is marked ``unpriced``: the lanes'
busy time does not say how long a serial batch waits for its slowest lane.

The interval (:mod:`bmoe.analyze.device.interval`) adds in quadrature the terms' spread (how
much a run's mean of each term moves) and the model's own error (the profile's runs held out
one configuration at a time and predicted from the others), at the profile's stated coverage;
without a measured model error it is the spread's alone and says so.

Two rates are given. ``tok_s`` is the whole decode's (tokens over decode time, what a sweep
measures); ``steady_tok_s`` applies the run analysis's steady-state rule
(:func:`bmoe.analyze.metrics.steady_state`) to the predicted per-token series: warm-up ends
where the predicted flash MiB per token settles within 1.25x its second-half median, and a
decode shorter than 32 tokens has no steady state (NaN).

The modules, from the bottom up: ``runs`` (a run, its configuration, whether a profile can price
it), ``fits`` (the fits and how settled a term is), ``checks`` (what a profile cannot be trusted
for), ``lanes`` (flash time from the flash table), ``interval`` (how wide a prediction is),
``reads`` (the replay of one configuration), ``tune`` (a tune's decisions); ``evidence``
(per-token times and reads, what the sections share); ``state`` (memory pressure, contention,
tracing), ``levers`` (the levers' terms and pricing), ``terms`` (compute, management, memory,
stall, prefill); ``timing`` (time per token); ``flash`` (the flash table), ``cells``
(:func:`predict`, the grid, a sweep's duration); ``sections`` (the terms in order, the model
section), ``compare`` (measured next to predicted); ``build`` (:func:`build_profile`, the
held-out error). :func:`build_profile` reads down that chain: ``build``, ``sections``, ``terms``
and ``flash``, ``evidence`` and ``state``, ``runs``.
"""

from __future__ import annotations

from bmoe.analyze.device.build import build_profile, with_probe
from bmoe.analyze.device.cells import (
    GRID_AXES,
    PREDICT_COLUMNS,
    grid_cells,
    measured_reads,
    parse_grid,
    predict,
    sweep_duration,
)
from bmoe.analyze.device.checks import check_model, check_settled
from bmoe.analyze.device.compare import (
    IN_SAMPLE,
    LEVER_TEXTS,
    PREDICTED_FIGURES,
    WIDEST_INTERVAL_PCT,
    against,
    against_files,
    compare_cells,
    in_sample_cells,
    interval_kind,
    measured_cells,
    measured_files,
)
from bmoe.analyze.device.evidence import decode_misses, token_reads
from bmoe.analyze.device.fits import BLOCK_TOKENS, RUNS_DISAGREE_PCT, TERM_SE_PCT, term_spread
from bmoe.analyze.device.flash import flash_table
from bmoe.analyze.device.interval import (
    COVERAGE_ALPHA,
    ModelError,
    binomial_p,
    coverage_check,
    half_width,
    interval_z,
    model_error,
    read_distance,
    read_range,
    t_quantile,
)
from bmoe.analyze.device.lanes import (
    BATCH_SOURCE,
    OVERLAP_SOURCE,
    batch_flash_ms,
    per_lane_ms,
    request_latency_ms,
    stall_per_miss,
    unpriced,
)
from bmoe.analyze.device.levers import LeverCheck, check_levers
from bmoe.analyze.device.reads import CellReads, cell_reads
from bmoe.analyze.device.runs import (
    DEFAULT_LANES,
    DEFAULT_THREADS,
    ProfileRun,
    RunConfig,
    profile_run,
    profile_runs,
    run_config,
)
from bmoe.analyze.device.state import run_state
from bmoe.analyze.device.timing import (
    excess_at,
    flash_factor,
    memory_faults,
    predict_cell,
    token_times,
)

__all__ = [
    "BATCH_SOURCE",
    "BLOCK_TOKENS",
    "COVERAGE_ALPHA",
    "DEFAULT_LANES",
    "DEFAULT_THREADS",
    "GRID_AXES",
    "IN_SAMPLE",
    "LEVER_TEXTS",
    "OVERLAP_SOURCE",
    "PREDICTED_FIGURES",
    "PREDICT_COLUMNS",
    "RUNS_DISAGREE_PCT",
    "TERM_SE_PCT",
    "WIDEST_INTERVAL_PCT",
    "CellReads",
    "LeverCheck",
    "ModelError",
    "ProfileRun",
    "RunConfig",
    "against",
    "against_files",
    "batch_flash_ms",
    "binomial_p",
    "build_profile",
    "cell_reads",
    "check_levers",
    "check_model",
    "check_settled",
    "compare_cells",
    "coverage_check",
    "decode_misses",
    "excess_at",
    "flash_factor",
    "flash_table",
    "grid_cells",
    "half_width",
    "in_sample_cells",
    "interval_kind",
    "interval_z",
    "measured_cells",
    "measured_files",
    "measured_reads",
    "memory_faults",
    "model_error",
    "parse_grid",
    "per_lane_ms",
    "predict",
    "predict_cell",
    "profile_run",
    "profile_runs",
    "read_distance",
    "read_range",
    "request_latency_ms",
    "run_config",
    "run_state",
    "stall_per_miss",
    "sweep_duration",
    "t_quantile",
    "term_spread",
    "token_reads",
    "token_times",
    "unpriced",
    "with_probe",
]
