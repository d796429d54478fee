"""Each planned run's predicted speed from the sweep's ``[sweep] profile``: the dry run's
duration and the ``predictions.csv`` kept beside the outcomes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from bmoe.sweep.config import SweepConfig
from bmoe.sweep.plan import Plan


def sweep_predictions(config: SweepConfig, plan: Plan) -> pd.DataFrame | None:
    """Each planned run's predicted tok/s and duration from the sweep's ``[sweep] profile``
    (None when it names none); the routing replayed is the profile's own route trace, else
    every routed expert is priced as a miss (an upper bound)."""
    if not config.settings.profile:
        return None
    from bmoe.analyze.device import sweep_duration
    from bmoe.formats.profile import read_profile
    from bmoe.formats.route import read_route_trace

    path = Path(config.settings.base_dir) / config.settings.profile
    profile = read_profile(path)
    trace = None
    source = profile.model.get("route_trace")
    if source and Path(source).is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = read_route_trace(source)
    if trace is None and not profile.sized:
        warnings.warn(
            f"{path}: the profile does not know its model's expert sizes and has no route "
            "trace beside it: no predicted duration",
            stacklevel=2,
        )
        return None
    runs = pd.DataFrame(
        [
            {
                "run": run.id,
                "cell": run.cell.id,
                **{
                    k: run.cell.params.get(k)
                    for k in ("cache_mb", "io_threads", "prefetch", "overlap")
                },
                "n_predict": run.cell.params.get("n_predict", 128),
            }
            for run in plan.runs
        ]
    )
    return sweep_duration(trace, profile, runs)
