"""Flash time read from a profile's flash table, per request and per read batch.

Flash time from a profile's flash table: a request's latency at a lane count (interpolated per
lane, throughput held past the largest measured count) and a read batch's wait (the best over
every lane count up to the asked one: more lanes never predict slower flash).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bmoe.formats.profile import DeviceProfile


def _numbers(frame: pd.DataFrame, column: str) -> np.ndarray:
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(np.float64)


#: The flash table's source of rows fitted over an io trace's read batches (one request
#: after another with the lanes sharing the device: a batch lasts ``batch_overhead +
#: latency * requests / lanes``, no whole waves; see :func:`batch_flash_ms`).
BATCH_SOURCE = "io trace batches"


def _lane_curve(
    flash: pd.DataFrame, req_bytes: float, column: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per measured lane count: the latency of a `req_bytes` request (the `column` latency,
    ``latency_ms`` where it has none), the median batch overhead and whether its batches are
    priced per request (every row of :data:`BATCH_SOURCE`, 1.0) or per whole wave (0.0)."""
    lanes = _numbers(flash, "lanes")
    sizes_all = _numbers(flash, "req_bytes")
    lat_all = _numbers(flash, column)
    lat_all = np.where(np.isnan(lat_all), _numbers(flash, "latency_ms"), lat_all)
    over_all = _numbers(flash, "batch_overhead_ms")
    if "source" in flash:
        linear_all = (flash["source"].astype(str) == BATCH_SOURCE).to_numpy()
    else:
        linear_all = np.zeros(len(flash), dtype=bool)
    per_lanes = []
    for n_lanes in np.unique(lanes):
        at = np.flatnonzero(lanes == n_lanes)
        at = at[np.argsort(sizes_all[at], kind="stable")]
        sizes, lat = sizes_all[at], lat_all[at]
        if req_bytes <= sizes[0]:
            value = lat[0]  # smaller requests: no cheaper than the smallest measured
        elif req_bytes > sizes[-1]:
            value = lat[-1] * req_bytes / sizes[-1]
        else:
            value = float(np.interp(req_bytes, sizes, lat))
        over = over_all[at][~np.isnan(over_all[at])]
        overhead = float(np.median(over)) if len(over) else float("nan")
        per_lanes.append((int(n_lanes), value, overhead, float(linear_all[at].all())))
    arrays = np.array(per_lanes, dtype=np.float64).T
    return arrays[0], arrays[1], arrays[2], arrays[3]


def _at_lanes(curve, lanes: int) -> tuple[float, float]:
    lanes_known, lat_known, over_known = curve[:3]
    per_lane = lat_known / lanes_known  # time per request when the lanes are kept busy
    if lanes <= lanes_known[0]:
        return float(lat_known[0]), float(over_known[0])
    if lanes >= lanes_known[-1]:
        return float(per_lane[-1] * lanes), float(over_known[-1])
    return (
        float(np.interp(lanes, lanes_known, per_lane) * lanes),
        float(np.interp(lanes, lanes_known, over_known)),
    )


def _per_request(curve, lanes: int) -> bool:
    """Whether batches at `lanes` lanes are priced per request: as the nearest measured lane
    count at or above it is (the largest one's beyond them)."""
    lanes_known, linear = curve[0], curve[3]
    at = min(int(np.searchsorted(lanes_known, lanes)), len(lanes_known) - 1)
    return bool(linear[at])


def request_latency_ms(
    flash: pd.DataFrame, req_bytes: float, lanes: int, column: str = "latency_ms"
) -> tuple[float, float]:
    """(latency of one request of `req_bytes` with `lanes` lanes busy, per-batch overhead)
    from a profile's flash table, interpolated as the module docstring says."""
    return _at_lanes(_lane_curve(flash, req_bytes, column), lanes)


def batch_flash_ms(
    flash: pd.DataFrame,
    requests: np.ndarray,
    req_bytes: float,
    lanes: int,
    column: str = "latency_ms",
) -> np.ndarray:
    """Flash wait of read batches of `requests` requests each with `lanes` lanes: the best
    of every lane count up to `lanes` (never slower with more lanes). A batch takes whole
    waves of requests, except at lane counts whose rows were fitted over an io trace's
    batches (:data:`BATCH_SOURCE`): there the trace showed a batch growing by each request,
    the lanes sharing the device, so a part-filled wave costs its part."""
    requests = np.asarray(requests, dtype=np.float64)
    curve = _lane_curve(flash, req_bytes, column)
    best = np.full(requests.shape, np.inf)
    for n in range(1, max(1, int(lanes)) + 1):
        lat, overhead = _at_lanes(curve, n)
        waves = requests / n if _per_request(curve, n) else np.ceil(requests / n)
        best = np.minimum(best, overhead + lat * waves)
    return np.where(requests > 0, best, 0.0)


def request_bytes(profile: DeviceProfile) -> float:
    """Bytes of one flash request: an expert slice, or the profile's read unit when unsized."""
    slices = int(profile.model["slices_per_expert"])
    sizes = profile.expert_bytes()
    if not sizes:
        return profile.read_unit_bytes
    return float(np.median(list(sizes.values()))) / slices


def per_lane_ms(profile: DeviceProfile, lanes: int, latency: str = "latency_ms") -> float:
    """Flash time per request when `lanes` lanes keep busy: the best over every lane count up
    to `lanes` of latency / lanes (never more with more lanes)."""
    curve = _lane_curve(profile.flash, request_bytes(profile), latency)
    return min(_at_lanes(curve, n)[0] / n for n in range(1, max(1, int(lanes)) + 1))


def stall_per_miss(profile: DeviceProfile, lanes: int) -> float:
    """The overlap's stall per missed read at `lanes` lanes: the measured one, scaled by how
    much faster (or slower) the flash table says a request is per lane at `lanes` than at the
    lanes the stall was measured with."""
    per = float(profile.overlap.get("stall_ms_per_miss", 0.0))
    measured: list[int] = list(profile.overlap.get("lanes") or [])
    if not measured or not per:
        return per
    at = int(np.median(measured))
    base = per_lane_ms(profile, at)
    return per * per_lane_ms(profile, lanes) / base if base > 0 else per


#: The flash table's source of rows measured from ``--overlap`` runs (the lanes' busy time).
OVERLAP_SOURCE = "io_ms under --overlap (lane busy time)"


def unpriced(profile: DeviceProfile, overlap: bool) -> str | None:
    """Why a configuration's flash wait is not priced by what the profile measured (None
    when it is): a serial configuration from a profile whose every flash row came from
    ``--overlap`` runs. Their lanes' busy time gives a request's service time, not how long
    a serial read batch waits for its slowest lane nor the batch's own overhead, so the
    prediction takes the lanes as never waiting for each other (tok/s too high)."""
    flash = profile.flash
    if overlap or "source" not in flash or not len(flash):
        return None
    if not (flash["source"].astype(str) == OVERLAP_SOURCE).all():
        return None
    return (
        "serial reads priced from --overlap runs only (lane busy time, not a serial "
        "batch's wait): too fast"
    )


__all__ = [
    "BATCH_SOURCE",
    "OVERLAP_SOURCE",
    "batch_flash_ms",
    "per_lane_ms",
    "request_bytes",
    "request_latency_ms",
    "stall_per_miss",
    "unpriced",
]
