"""Predict a run's speed for configurations that were never run.

The recorded routing goes through each configuration's cache with the existing replay
(:mod:`bmoe.analyze.replay`), which says exactly which experts each decode step misses, so
MiB/token and hit % are replay figures, not estimates. A :class:`~bmoe.formats.profile.
DeviceProfile` then turns those misses into time, token by token:

* flash wait: for every layer that misses ``m`` experts of ``s`` slices each, the lanes read
  ``m * s`` requests: ``batch_overhead + latency(request size, lanes) * ceil(m * s / lanes)``
  (serial engines; without the ceiling where an io trace's batches showed each request
  adding its share: :data:`~bmoe.analyze.predict.lanes.BATCH_SOURCE`), plus the wait a
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

The interval (:mod:`bmoe.analyze.predict.interval`) adds in quadrature the terms' spread (how
much a run's mean of each term moves) and the model's own error (the profile's runs held out
one configuration at a time and predicted from the others), at the profile's stated coverage;
without a measured model error it is the spread's alone and says so.

Two rates are given. ``tok_s`` is the whole decode's (tokens over decode time, what a sweep
measures); ``steady_tok_s`` applies the run analysis's steady-state rule
(:func:`bmoe.analyze.metrics.steady_state`) to the predicted per-token series: warm-up ends
where the predicted flash MiB per token settles within 1.25x its second-half median, and a
decode shorter than 32 tokens has no steady state (NaN).

The modules, from the bottom up: ``grid`` (the axes and ``--grid``), ``lanes`` (flash time
from the flash table), ``reads`` (the replay of one configuration), ``interval`` (how wide
an interval is), ``timing`` (time per token), ``checks`` (refusals), ``cells``
(:func:`predict`), ``compare`` (measured next to predicted) and ``sweeps`` (a planned
sweep's duration).
"""

from __future__ import annotations

from bmoe.analyze.predict.cells import PREDICT_COLUMNS, measured_reads, predict
from bmoe.analyze.predict.checks import check_model, check_settled
from bmoe.analyze.predict.compare import (
    IN_SAMPLE,
    LEVER_TEXTS,
    PREDICTED_FIGURES,
    WIDEST_INTERVAL_PCT,
    against,
    compare_cells,
    in_sample_cells,
    interval_kind,
    measured_cells,
)
from bmoe.analyze.predict.grid import GRID_AXES, grid_cells, parse_grid
from bmoe.analyze.predict.interval import (
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
from bmoe.analyze.predict.lanes import (
    BATCH_SOURCE,
    OVERLAP_SOURCE,
    batch_flash_ms,
    per_lane_ms,
    request_latency_ms,
    stall_per_miss,
    unpriced,
)
from bmoe.analyze.predict.levers import LeverCheck, check_levers
from bmoe.analyze.predict.reads import CellReads, cell_reads
from bmoe.analyze.predict.sweeps import sweep_duration
from bmoe.analyze.predict.timing import (
    excess_at,
    flash_factor,
    memory_faults,
    predict_cell,
    token_times,
)

__all__ = [
    "BATCH_SOURCE",
    "COVERAGE_ALPHA",
    "GRID_AXES",
    "IN_SAMPLE",
    "LEVER_TEXTS",
    "OVERLAP_SOURCE",
    "PREDICTED_FIGURES",
    "PREDICT_COLUMNS",
    "WIDEST_INTERVAL_PCT",
    "CellReads",
    "LeverCheck",
    "ModelError",
    "against",
    "batch_flash_ms",
    "binomial_p",
    "cell_reads",
    "check_levers",
    "check_model",
    "check_settled",
    "compare_cells",
    "coverage_check",
    "excess_at",
    "flash_factor",
    "grid_cells",
    "half_width",
    "in_sample_cells",
    "interval_kind",
    "interval_z",
    "measured_cells",
    "measured_reads",
    "memory_faults",
    "model_error",
    "parse_grid",
    "per_lane_ms",
    "predict",
    "predict_cell",
    "read_distance",
    "read_range",
    "request_latency_ms",
    "stall_per_miss",
    "sweep_duration",
    "t_quantile",
    "token_times",
    "unpriced",
]
