"""Every lever a prediction changes relative to its profile's runs, priced from evidence or
declared unpriced.

A lever is priced when the profile measured it: its runs used that value (the prefetch
depth, the policy, dropping, the overlap mode, the compute threads; the profile's term for
a value other than its baseline, :mod:`bmoe.analyze.profile.levers`), the flash table holds
or brackets the lane count, the cache budget lies within the runs' budgets or below them
(the bytes it reads are the replay's, exact, and its distance from the measured reads widens
its interval; above them, what a larger cache does to memory and compute is not measured),
and it asks no more memory than a profile run did, or no more than a quarter more of what
the largest of them left available, or memory its runs bracket. Otherwise the lever is
unpriced: named in the prediction's row, its interval widened by the spread of what that
lever has been seen to do (:mod:`bmoe.analyze.predict.effects`), and the prediction kept out
of any headline that claims a coverage. Top-k and the dense weights' placement are refused
before (:mod:`bmoe.analyze.predict.checks`, ``not_comparable``): nothing prices them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bmoe.analyze.predict.effects import effect_of
from bmoe.analyze.predict.lanes import unpriced
from bmoe.cache import DEFAULT_POLICY, policy_name
from bmoe.formats.profile import DeviceProfile

#: A budget within this factor of the runs' budgets counts as measured (as a read volume
#: does: :data:`bmoe.analyze.profile.fits.SAME_VOLUME`).
BUDGET_SLACK = 1.25
#: A configuration asking for more memory than the largest profile run by more than this
#: share of what that run left available is priced as though memory were not short, and
#: may not be: unpriced.
MEMORY_HEADROOM_SHARE = 0.25


@dataclass
class LeverCheck:
    """What a configuration's levers do to its prediction: ``factor`` on its decode time
    (the profile's lever terms), how well that is known (``factor_sd``), the levers it
    changes without evidence (``unpriced``: lever -> why) and the spread their recorded
    effects add (``effect_sd``), and notes that price nothing (``notes``)."""

    factor: float = 1.0
    factor_sd: float = 0.0
    unpriced: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def effect_sd(self) -> float:
        return math.sqrt(sum(effect_of(lever).sd_rel ** 2 for lever in self.unpriced))

    def reason(self) -> str | None:
        """The unpriced levers in one sentence (None when every lever is priced)."""
        if not self.unpriced:
            return None
        parts = [f"{why} (+-{effect_of(k).effect_pct:.0f} % seen)" for k, why in
                 self.unpriced.items()]  # fmt: skip
        return "; ".join(parts)


def _values(profile: DeviceProfile, key: str) -> list[Any]:
    return [r.get(key) for r in profile.runs if r.get(key) is not None]


def _numbers(profile: DeviceProfile, key: str) -> list[float]:
    out = []
    for value in _values(profile, key):
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out.append(number)
    return out


def _terms(profile: DeviceProfile) -> dict[tuple[str, str], dict[str, Any]]:
    return {(str(t["lever"]), str(t["value"])): t for t in profile.levers.get("terms") or []}


def _measured_values(profile: DeviceProfile, lever: str, key: str) -> set[str]:
    """The values of a term lever the profile prices: its baseline's and its terms'; an older
    profile (no levers section): every value its runs used."""
    base = (profile.levers.get("baseline") or {}).get(lever)
    if base is None:
        return {_norm(lever, v) for v in _values(profile, key)}
    return {str(base)} | {v for (name, v) in _terms(profile) if name == lever}


def _norm(lever: str, value: Any) -> str:
    if lever == "prefetch":
        return str(int(float(value or 0)))
    if lever == "policy":
        return policy_name(str(value)) if value else DEFAULT_POLICY
    if lever == "drop":
        return f"{float(value or 0.0):g}"
    return str(value)


def _term_lever(check: LeverCheck, profile: DeviceProfile, lever: str, value: Any, what: str):
    key = {"drop": "drop", "prefetch": "prefetch", "policy": "policy"}[lever]
    mine = _norm(lever, value)
    base = (profile.levers.get("baseline") or {}).get(lever)
    term = _terms(profile).get((lever, mine))
    if term is not None and mine != base:
        check.factor *= float(term["factor"])
        check.factor_sd = math.hypot(check.factor_sd, float(term["sd_rel"]))
        return
    measured = _measured_values(profile, lever, key)
    if measured and mine not in measured:
        check.unpriced[lever] = (
            f"{what} {mine}: the profile's runs priced {', '.join(sorted(measured))} only"
        )


def _lanes(check: LeverCheck, profile: DeviceProfile, lanes: int) -> None:
    measured = sorted({int(x) for x in profile.flash["lanes"]}) if len(profile.flash) else []
    if measured and not measured[0] <= lanes <= measured[-1]:
        check.unpriced["io_threads"] = (
            f"{lanes} read lanes: the flash table measured "
            f"{', '.join(map(str, measured))} (scaled per lane beyond them)"
        )


def _budget(check: LeverCheck, profile: DeviceProfile, cache_mb: float) -> None:
    budgets = _numbers(profile, "cache_mb")
    if not budgets or not math.isfinite(cache_mb):
        return
    low, high = min(budgets), max(budgets)
    if cache_mb > high * BUDGET_SLACK:  # a smaller one reads more: the replay's, priced
        check.unpriced["cache_mb"] = (
            f"a {cache_mb:g} MiB cache, beyond the profile's runs ({low:g}-{high:g} MiB): its "
            "reads are the replay's, its memory and compute at that size unmeasured"
        )


def _memory(check: LeverCheck, profile: DeviceProfile, cache_mb: float) -> None:
    """Memory asked beyond every profile run: a note, or unpriced when it takes more than
    :data:`MEMORY_HEADROOM_SHARE` of what the largest run left available."""
    runs = [r for r in profile.runs if r.get("asked_mib") is not None]
    if not runs or not math.isfinite(cache_mb):
        return
    largest = max(runs, key=lambda r: float(r["asked_mib"]))
    other = float(np.median([float(r["asked_mib"]) - float(r.get("cache_mb") or 0.0)
                             for r in runs]))  # fmt: skip
    asked = cache_mb + max(other, 0.0)
    top = float(largest["asked_mib"])
    if asked <= top * 1.01:
        _bracketed(check, runs, asked)
        return
    left = largest.get("left_min_mib")
    if left is None and largest.get("available_mib") is not None:
        left = float(largest["available_mib"]) - top
    more = asked - top
    if left is None:
        check.notes.append(
            f"asks {asked:.0f} MiB, more than any profile run ({top:.0f} MiB); the runs do "
            "not record what memory they left: pressure not judged"
        )
        return
    left = float(left)
    seen = _pressed(largest)
    text = (
        f"asks {asked:.0f} MiB of memory, {more:.0f} more than any profile run (the largest "
        f"left {left:.0f} MiB available{'; ' + seen if seen else ''})"
    )
    if more > MEMORY_HEADROOM_SHARE * left or seen:
        check.unpriced["memory"] = text + ": memory pressure it may meet is unmeasured"
    else:
        check.notes.append(text + ": far from the device's limit, not priced as pressure")


def _pressed(run: Mapping[str, Any]) -> str:
    """What a run shows of memory pressure (empty: nothing): swap, major faults."""
    signs = []
    if (run.get("swap_mib") or 0) > 0:
        signs.append(f"swap {float(run['swap_mib']):.0f} MiB")
    if (run.get("majflt_per_token") or 0) >= 1:
        signs.append(f"{float(run['majflt_per_token']):.0f} major faults a token")
    return ", ".join(signs)


def _bracketed(check: LeverCheck, runs: list[dict[str, Any]], asked: float) -> None:
    """A note where the memory a configuration asks lies between a run that showed no
    pressure and one that did: the slowdown is priced between them (their compute is
    interpolated by read volume, their major faults by the memory asked)."""
    below = [r for r in runs if float(r["asked_mib"]) <= asked and not _pressed(r)]
    above = [r for r in runs if float(r["asked_mib"]) >= asked and _pressed(r)]
    if below and above:
        low = max(below, key=lambda r: float(r["asked_mib"]))
        high = min(above, key=lambda r: float(r["asked_mib"]))
        check.notes.append(
            f"asks {asked:.0f} MiB of memory, between a profile run without pressure "
            f"({float(low['asked_mib']):.0f} MiB) and one under it ({float(high['asked_mib']):.0f}"
            f" MiB: {_pressed(high)}): the slowdown priced between the two"
        )


def check_levers(
    profile: DeviceProfile,
    *,
    cache_mb: float | None,
    lanes: int,
    overlap: bool,
    levers: Mapping[str, Any] | None = None,
) -> LeverCheck:
    """Which levers of a configuration (its `cache_mb`, `lanes`, `overlap` and the others
    in `levers`: ``prefetch``, ``policy``, ``drop``, ``threads``; absent ones are taken as
    the profile's baseline) the profile prices, and what its terms for them do (see the
    module docstring)."""
    check = LeverCheck()
    levers = levers or {}
    for lever, what in (("prefetch", "prefetch depth"), ("policy", "cache policy"),
                        ("drop", "dropping at")):  # fmt: skip
        if levers.get(lever) is not None:
            _term_lever(check, profile, lever, levers[lever], what)
    serial_from_overlap = unpriced(profile, bool(overlap))
    if serial_from_overlap is not None:
        check.unpriced["overlap"] = serial_from_overlap
    threads = levers.get("threads")
    measured_threads = {int(t) for t in _numbers(profile, "threads")}
    if threads is not None and measured_threads and int(threads) not in measured_threads:
        check.unpriced["threads"] = (
            f"{int(threads)} compute threads: the profile's runs used "
            f"{', '.join(map(str, sorted(measured_threads)))}"
        )
    _lanes(check, profile, int(lanes))
    if cache_mb is not None:
        _budget(check, profile, float(cache_mb))
        _memory(check, profile, float(cache_mb))
    return check


__all__ = ["BUDGET_SLACK", "MEMORY_HEADROOM_SHARE", "LeverCheck", "check_levers"]
