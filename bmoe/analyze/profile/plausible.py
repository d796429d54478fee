"""Fits a reader should not trust: figures a profile computed that no device delivers.

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


__all__ = ["FLASH_CEILING_MIB_S", "LANE_DROP", "implausible_fits", "implausible_flash"]
