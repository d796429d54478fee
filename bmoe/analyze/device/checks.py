"""What a profile cannot be trusted for: another model, unsettled terms, implausible fits.

Refusals before a prediction: a profile of another model or top-k, an unsettled profile
under ``--strict``.

Fits a reader should not trust: figures a profile computed that no device delivers.

A fit follows its runs, and a few runs can mislead it: reads served from memory (the page
cache of a file that fits in RAM) look like flash tens of gigabytes a second fast, and a lane
count measured by few reads can come out many times faster than more lanes on the same
device. The profile keeps such a figure (it is what the runs measured); these checks name it,
so that ``bmoe profile`` and ``bmoe predict`` can flag it beside the answer.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from bmoe.errors import BmoeError
from bmoe.formats.profile import DeviceProfile
from bmoe.formats.route import RouteTrace
from bmoe.units import MIB


def check_model(trace: RouteTrace, profile: DeviceProfile) -> None:
    """Refuse a profile measured on another model (its latencies price other expert sizes),
    at another top-k (``--n-expert-used`` changes the routing), or one that does not know its
    model's expert sizes."""
    mine = {layer: size for layer, size in trace.expert_bytes().items() if size > 0}  # MoE layers
    theirs = profile.expert_bytes()
    where = trace.path or "the trace"
    if not mine:
        raise BmoeError(f"{trace.path or 'trace'}: no expert_bytes in the preamble")
    if not theirs:
        raise BmoeError(
            f"{profile.path or 'the profile'} does not know its model's expert sizes (built "
            "from metrics without a route trace, model file or preamble that says them): it "
            f"cannot price {where}'s reads; rebuild it with bmoe profile RUNS --trace "
            f"{where}, or predict the measured files themselves (--against FILES without a "
            "trace)"
        )
    approximate = "preamble" in str(profile.model.get("sizes_from") or "")
    if approximate:  # the preamble says a token's routed bytes, not how the layers split them
        ours, given = sum(theirs.values()), sum(mine.values())
        k = float(trace.meta.get("n_expert_used") or 1)
        slack = 0.02 * given + 0.05 * MIB / k  # the summaries' rounding of k x the sum
        if abs(ours - given) > slack:
            name = profile.model.get("name") or "another model"
            raise BmoeError(
                f"{profile.path or 'profile'} was measured on {name}, whose preamble implies "
                f"{ours / MIB:.3f} MiB of experts a token routes one each of, but {where}'s "
                f"MoE layers have {given / MIB:.3f}: a profile prices its own model's expert "
                "reads only"
            )
        differ: list[int] = []
    else:
        differ = sorted(
            layer for layer in set(mine) | set(theirs) if mine.get(layer) != theirs.get(layer)
        )
    if differ:
        layer = differ[0]
        name = profile.model.get("name") or "another model"
        raise BmoeError(
            f"{profile.path or 'profile'} was measured on {name} (layer {layer}: "
            f"{theirs.get(layer, 'no')} expert bytes) but {where} has "
            f"{mine.get(layer, 'no')} at layer {layer}: a profile prices its own model's "
            "expert reads only"
        )
    k_trace = trace.meta.get("n_expert_used")
    k_profile = profile.model.get("n_expert_used")
    if k_trace and k_profile and int(k_trace) != int(k_profile):
        raise BmoeError(
            f"{where} was recorded at top-{int(k_trace)} but {profile.path or 'the profile'}'s "
            f"runs ran top-{int(k_profile)} (--n-expert-used changes the routing): record a "
            "trace at the top-k you predict"
        )


def check_settled(profile: DeviceProfile, strict: bool) -> list[str]:
    """The profile's unsettled terms (a sentence each); with `strict`, a :class:`BmoeError`
    when there are any."""
    if strict and profile.unsettled:
        raise BmoeError(
            f"{profile.path or 'the profile'} is not settled (--strict): "
            + "; ".join(profile.unsettled)
        )
    return list(profile.unsettled)


#: Flash faster than this (MiB/s) is not flash: 16 GiB/s is beyond the storage of any phone
#: or laptop (PCIe 5 NVMe reads about 14 GB/s); such reads came from memory.
FLASH_CEILING_MIB_S = 16384.0
#: More lanes read in parallel on the same device: a lane count this many times faster than
#: a larger one says the fit of one of them is wrong, not the device.
LANE_DROP = 2.0


def _lanes_text(lanes: int) -> str:
    return f"{lanes} lane{'s' if lanes != 1 else ''}"


def implausible_flash(flash: pd.DataFrame) -> list[str]:
    """One sentence per implausible figure of a flash table (``lanes``, ``mib_s``,
    ``latency_ms``, optionally ``source``): a latency of zero or less, a throughput above
    :data:`FLASH_CEILING_MIB_S`, or a lane count more than :data:`LANE_DROP` times faster
    than a larger lane count."""
    if flash is None or flash.empty or "lanes" not in flash or "mib_s" not in flash:
        return []
    rows = flash.sort_values("lanes").to_dict("records")
    out = []
    for row in rows:
        lanes, rate = int(row["lanes"]), float(row["mib_s"])
        source = f" (from {row['source']})" if isinstance(row.get("source"), str) else ""
        latency = float(row.get("latency_ms", math.nan))
        if math.isfinite(latency) and latency <= 0:
            out.append(
                f"flash at {_lanes_text(lanes)}{source}: a latency of {latency:.3g} ms a "
                "request wave: the fit found no wait to price"
            )
            continue
        if math.isfinite(rate) and rate > FLASH_CEILING_MIB_S:
            out.append(
                f"flash at {_lanes_text(lanes)}{source}: {rate:,.0f} MiB/s is faster than "
                f"flash storage reads ({FLASH_CEILING_MIB_S:,.0f} MiB/s and more): the reads "
                "were served from memory (the page cache), or too few to time"
            )
        slower = [
            r for r in rows if int(r["lanes"]) > lanes and 0 < float(r["mib_s"]) * LANE_DROP < rate
        ]
        if slower and math.isfinite(rate):
            other = slower[0]
            out.append(
                f"flash at {_lanes_text(lanes)}{source}: {rate:,.0f} MiB/s beside "
                f"{float(other['mib_s']):,.0f} MiB/s at {_lanes_text(int(other['lanes']))} "
                f"({rate / float(other['mib_s']):.0f}x): more lanes are never that much "
                "slower on one device; one of the two fits is wrong (few reads, or reads "
                "from memory)"
            )
    return out


def implausible_fits(profile: Any) -> list[str]:
    """Every implausible figure of a device profile (:func:`implausible_flash` of its flash
    table so far)."""
    flash = getattr(profile, "flash", None)
    return implausible_flash(flash) if isinstance(flash, pd.DataFrame) else []


__all__ = [
    "FLASH_CEILING_MIB_S",
    "LANE_DROP",
    "check_model",
    "check_settled",
    "implausible_fits",
    "implausible_flash",
]
