"""How long a planned sweep's runs will take, from a profile."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bmoe.analyze.predict.cells import grid_defaults, predict
from bmoe.analyze.predict.grid import GRID_AXES
from bmoe.analyze.predict.lanes import batch_flash_ms, stall_per_miss
from bmoe.cache import DEFAULT_POLICY
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace


def sweep_duration(
    trace: RouteTrace | None,
    profile: DeviceProfile,
    runs: pd.DataFrame,
    *,
    policy: str = DEFAULT_POLICY,
) -> pd.DataFrame:
    """Predicted duration of each planned run (columns cache_mb, io_threads, prefetch,
    n_predict): model load + prefill + n_predict tokens at the predicted rate. Without a
    trace every routed expert is priced as a miss (an upper bound, ``bound=True``)."""
    frame = runs.copy()
    defaults = grid_defaults(profile)
    for axis, default in defaults.items():
        values = frame[axis] if axis in frame else pd.Series(default, index=frame.index)
        frame[axis] = pd.to_numeric(values, errors="coerce").fillna(default)
    for axis in ("io_threads", "prefetch", "overlap"):
        frame[axis] = frame[axis].astype(int)
    if "n_predict" not in frame:
        frame["n_predict"] = 128
    cells = frame[list(GRID_AXES)].drop_duplicates(ignore_index=True)
    if trace is not None:
        columns = [*GRID_AXES, "tok_s", "tok_s_low", "tok_s_high"]
        rates = predict(trace, profile, cells, policy=policy)[columns]
        bound = False
    else:
        rates = cells.assign(tok_s=[_all_miss_rate(profile, int(n)) for n in cells["io_threads"]])
        bound = True
    frame = frame.merge(rates, on=list(GRID_AXES), how="left")
    fixed = float(profile.prefill.get("load_s", 0.0)) + float(profile.prefill.get("prefill_s", 0.0))
    frame["predicted_s"] = fixed + pd.to_numeric(frame["n_predict"]) / frame["tok_s"]
    frame["bound"] = bound
    return frame


def _all_miss_rate(profile: DeviceProfile, lanes: int) -> float:
    """tok/s when every routed expert of every MoE layer is read (no cache, no prefetch)."""
    k = int(profile.model.get("n_expert_used") or 1)
    layers = sorted(profile.expert_bytes())
    slices = int(profile.model["slices_per_expert"])
    req = float(np.median(list(profile.expert_bytes().values()))) / slices
    if profile.mode == "overlap":
        per = stall_per_miss(profile, lanes)
        flash = float(profile.overlap.get("stall_ms", 0.0)) + len(layers) * k * per
    else:
        flash = float(
            batch_flash_ms(profile.flash, np.full(len(layers), k * slices), req, lanes).sum()
        )
    mgmt = profile.mgmt["token_ms"] + profile.mgmt["per_admit_ms"] * k * len(layers)
    return 1000.0 / (profile.compute["token_ms"] + flash + mgmt)


__all__ = ["sweep_duration"]
