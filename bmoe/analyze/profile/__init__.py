"""Build a device profile from runs already recorded.

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

The modules, from the bottom up: ``runs`` (a run and the configuration it measured),
``reading`` (runs from what was read of their files), ``tokens`` (per-token times and
reads), ``model`` (expert sizes), ``state`` (the system state of each run), ``fits`` and
``spread`` (the fits and how settled a term is), ``evidence`` (what the sections share),
``flash``, ``compute`` and ``terms`` (the sections), ``build`` (:func:`build_profile`) and
``against`` (loose files next to their predictions).
"""

from __future__ import annotations

from bmoe.analyze.profile.against import against_files, measured_files
from bmoe.analyze.profile.build import build_profile, with_probe
from bmoe.analyze.profile.flash import flash_table
from bmoe.analyze.profile.reading import profile_run, profile_runs
from bmoe.analyze.profile.runs import (
    DEFAULT_LANES,
    DEFAULT_THREADS,
    ProfileRun,
    RunConfig,
    run_config,
)
from bmoe.analyze.profile.spread import BLOCK_TOKENS, RUNS_DISAGREE_PCT, TERM_SE_PCT, term_spread
from bmoe.analyze.profile.state import run_state
from bmoe.analyze.profile.tokens import decode_misses, token_reads

__all__ = [
    "BLOCK_TOKENS",
    "DEFAULT_LANES",
    "DEFAULT_THREADS",
    "RUNS_DISAGREE_PCT",
    "TERM_SE_PCT",
    "ProfileRun",
    "RunConfig",
    "against_files",
    "build_profile",
    "decode_misses",
    "flash_table",
    "measured_files",
    "profile_run",
    "profile_runs",
    "run_config",
    "run_state",
    "term_spread",
    "token_reads",
    "with_probe",
]
