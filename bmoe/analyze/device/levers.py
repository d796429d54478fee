"""The levers: their measured terms, their seen effects when unpriced, their pricing.

Levers a profile's runs varied that its terms do not model as a mechanism: the prefetch
depth, the cache policy and dropping. Each value other than the baseline (the value most of
the runs used) gets its own term, measured on the runs that used it, and those runs are kept
out of the other terms.

What the replay measures exactly (which experts a policy, a prefetch depth or dropping
reads) is priced by the replay. What it does not see is what the lever costs beyond its
reads: on a phone's flash the speculative reads of ``--prefetch`` evidently compete with the
demand reads (a run with prefetch was 58 % slower than its reads priced by a profile without
one), and another policy's bookkeeping, or a hotter phone on another day, shows as compute
(``layer-lfu`` 0.19 s a token against LRU's 0.10). A profile whose terms were fitted on a mix
of values would spread one value's cost over the others; so the terms (compute, flash,
management, the model error) come from the baseline runs, and each other value's term is
the ratio of its runs' measured decode time to what the baseline profile predicts for them
from their own reads (``factor``, > 1 slower), with how well that ratio is known
(``sd_rel``: the baseline profile's model error and the runs' spread, over the square root of
their number). A run that differs from the baseline in two levers is used by neither term.

What each lever has been seen to do to a prediction that did not price it: the data an
unpriced lever's interval is widened by.

Each record is the spread (relative sd of the decode time, log scale: the root mean square
of ``ln(predicted / measured tok/s)``) of predictions that changed that lever from what
their profile's runs measured and priced it as if it were free, over the runs named in
``seen``; ``where`` says where those runs are and how the figure was made. A lever that no
run of the corpus or the archives varied takes the largest spread any lever was seen to
have (never zero: nothing measured it). The figures are re-measured by the
leave-one-lever-out check of ``benchmarks/bench_predict_corpus.py`` and
``benchmarks/bench_predict.py`` (see ``benchmarks/README.md``).

Every lever a prediction changes relative to its profile's runs, priced from evidence or
declared unpriced.

A lever is priced when the profile measured it: its runs used that value (the prefetch
depth, the policy, dropping, the overlap mode, the compute threads; the profile's term for
a value other than its baseline, above), the flash table holds
or brackets the lane count, the cache budget lies within the runs' budgets or below them
(the bytes it reads are the replay's, exact, and its distance from the measured reads widens
its interval; above them, what a larger cache does to memory and compute is not measured),
and it asks no more memory than a profile run did, or no more than a quarter more of what
the largest of them left available, or memory its runs bracket. Otherwise the lever is
unpriced: named in the prediction's row, its interval widened by the spread of what that
lever has been seen to do (below), and the prediction kept out
of any headline that claims a coverage. Top-k and the dense weights' placement are refused
before (:func:`bmoe.analyze.device.runs.not_comparable`): nothing prices them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bmoe.analyze.device.evidence import Evidence
from bmoe.analyze.device.lanes import unpriced
from bmoe.analyze.device.runs import ProfileRun, RunConfig
from bmoe.cache import DEFAULT_POLICY, policy_name
from bmoe.formats.profile import DeviceProfile

#: The levers priced by a term per value, and the value a lever takes when runs tie.
TERM_LEVERS = {"prefetch": "0", "policy": DEFAULT_POLICY, "drop": "0"}


def lever_value(config: RunConfig, lever: str) -> str:
    """A run's value of `lever` as the profile names it (prefetch depth, policy, drop
    fraction)."""
    if lever == "prefetch":
        return str(int(config.prefetch))
    if lever == "policy":
        return str(config.policy)
    if lever == "drop":
        return f"{float(config.drop or 0.0):g}"
    raise KeyError(lever)


def baselines(configs: Mapping[str, RunConfig]) -> dict[str, str]:
    """Per lever of :data:`TERM_LEVERS`, the value most runs used (ties: the default)."""
    out = {}
    for lever, default in TERM_LEVERS.items():
        counts: dict[str, int] = {}
        for config in configs.values():
            value = lever_value(config, lever)
            counts[value] = counts.get(value, 0) + 1
        top = max(counts.values())
        tied = sorted(v for v, n in counts.items() if n == top)
        out[lever] = default if default in tied else tied[0]
    return out


def split_runs(
    ev: Evidence,
) -> tuple[dict[str, str], list[ProfileRun], dict[tuple[str, str], list[ProfileRun]], list[str]]:
    """The baseline values, the baseline runs (every lever at its baseline), the runs of each
    other (lever, value) that differ in that lever alone, and the runs that differ in two or
    more (used by no term)."""
    base = baselines(ev.configs)
    at_base: list[ProfileRun] = []
    variants: dict[tuple[str, str], list[ProfileRun]] = {}
    mixed: list[str] = []
    for run in ev.runs:
        differ = [
            (lever, lever_value(ev.configs[run.name], lever))
            for lever in TERM_LEVERS
            if lever_value(ev.configs[run.name], lever) != base[lever]
        ]
        if not differ:
            at_base.append(run)
        elif len(differ) == 1:
            variants.setdefault(differ[0], []).append(run)
        else:
            mixed.append(run.name)
    return base, at_base, variants, mixed


def lever_term(records: list[dict[str, Any]], lever: str, value: str) -> dict[str, Any] | None:
    """One (lever, value) term from its runs predicted by the baseline profile (the held-out
    records: measured and predicted tok/s, the prediction's spread and the baseline model's
    error at the run's reads, ``model_sd``); None when none of them could be predicted."""
    scored = [r for r in records if "error_pct" in r]
    if not scored:
        return None
    ratios = np.array([r["predicted_tok_s"] / r["measured_tok_s"] for r in scored])  # time
    logs = np.log(ratios)
    known = np.array(
        [(r["spread_pct"] / 100.0) ** 2 + (r.get("model_sd") or 0.0) ** 2 for r in scored]
    )
    scatter = float(np.var(logs, ddof=1)) if len(logs) > 1 else 0.0
    sd = float(np.sqrt((float(np.mean(known)) + scatter) / len(logs)))
    return {
        "lever": lever,
        "value": value,
        "factor": float(np.exp(np.mean(logs))),
        "sd_rel": sd,
        "runs": [r["run"] for r in scored],
        "error_pct": [float(r["error_pct"]) for r in scored],
    }


@dataclass(frozen=True)
class LeverEffect:
    """The spread of a lever's effect on predictions that did not price it."""

    lever: str
    sd_rel: float  # of the decode time, log scale
    seen: tuple[float, ...]  # the errors it was measured from, % of tok/s
    where: str

    @property
    def effect_pct(self) -> float:
        return 100.0 * self.sd_rel


def _rms_log(errors_pct: tuple[float, ...]) -> float:
    """The root mean square of ln(1 + error) over errors in % of tok/s."""
    return math.sqrt(sum(math.log1p(e / 100.0) ** 2 for e in errors_pct) / len(errors_pct))


def _effect(lever: str, seen: tuple[float, ...], where: str) -> LeverEffect:
    return LeverEffect(lever, _rms_log(seen), seen, where)


#: Leave one lever out on the corpus and the archives (``benchmarks/bench_predict_corpus.py``,
#: recorded 2026-12-03), and phone runs of other days held out from the corpus.
_PHONE_HELD_OUT = (
    "phone runs of a 48-layer Q4_K_M model recorded on other days, predicted from two-run "
    "profiles of that model"
)
# fmt: off
_RECORDED = (
    _effect(
        "prefetch",
        (58.0, -21.5, -4.4, -11.0, -12.9, -8.1, -11.0, -5.8, -12.3, -7.8, -4.3),
        f"{_PHONE_HELD_OUT}: a prefetch-1 run (8 lanes, overlap) from a profile of two "
        "prefetch-0 runs (+58 %); the corpus's qwen_pf2 from profiles of one and two prefetch-0 "
        "files (-22 to -4 %); native-tiny's pf run from its run without prefetch (-4 %)",
    ),
    _effect(
        "cache_mb",
        (43.0, 27.1, 18.3, 13.5, 23.4, 13.6, 54.6, 74.0, 100.2, 149.6, 132.2, 186.8, -28.2,
         -15.4, -29.0, -31.9, -10.3, -31.1, -23.2, -43.3, -28.6, -59.3, -38.9, -55.8),
        f"{_PHONE_HELD_OUT}: a 4,000 MiB run from a profile whose largest run cached 3,000 "
        "MiB (+43 %); the corpus's qwen_auto_ov (4,675 MiB) from profiles of the 4,000 MiB "
        "files (+14 to +27 %); the archived tiny-cache-lanes sweep, its 4 and 8 MiB cells "
        "from profiles of its 0 and 1 MiB cells at each lane count (-59 to +187 %)",
    ),
    _effect(
        "policy",
        (52.0,),
        f"{_PHONE_HELD_OUT}: a cache_policy=layer-lfu run from an LRU-only profile (+52 %, "
        "compute 0.19 s a token against 0.10)",
    ),
    _effect(
        "io_threads",
        (-27.2, -36.2, -37.8, -30.1, -24.9, -36.2, -52.3, -43.9, -52.9, -42.0, -57.2, -46.1,
         -4.1, 2.5, -7.0, 14.9, 23.4, 4.8, 55.4, 74.8, 101.1, -4.1, -29.3, -10.8, -6.3, 0.1,
         -9.2, 13.4, -0.6, -3.1, 52.3, 71.4, 97.2, -22.8, -9.0, -23.6),
        "the archived tiny-cache-lanes sweep: each lane count's cells predicted from a "
        "profile of another lane count's (-57 to +101 %)",
    ),
    _effect(
        "overlap",
        (36.8, 8.9, 30.6, 22.0, 8.9, 30.6, 22.0, 29.0, 20.4, 26.2),
        "the corpus's serial qwen_c4000_l4 from profiles of --overlap files only (lane busy "
        "time taken for a serial batch's wait: +9 to +37 %)",
    ),
    _effect(
        "drop",
        (-9.6,),
        "native-tiny's drop run (--drop-cold-experts 1.0) from its run without dropping, "
        "replayed with the drop (-10 %)",
    ),
    _effect(
        "flash_volume",
        (20.8, 12.0, 24.9, 27.8, 34.3, 20.9, 11.6, 12.3, -0.3, -6.4, -2.3, 16.1, 24.7, -2.3,
         21.8, 19.0, 32.4, 26.7, 33.6, 49.2, 67.9),
        "generated models on the laptop (bench_predict_models.py, deepseek2, gemma4 and a "
        "qwen3moe with a type per layer, recorded on a quiet machine): the flash wait a token "
        "(measured over priced, not tok/s) of cells reading another volume than the one "
        "profile configuration at their lane count, priced as if a request took what it took "
        "there (-6 to +68 %: the wait per MiB grows as the reads fall, by a cause its runs do "
        "not show)",
    ),
    _effect(
        "memory",
        (43.0, 27.1, 18.3, 13.5, 23.4, 13.6),
        f"{_PHONE_HELD_OUT}: the 4,000 MiB run above, which asked for more memory than any "
        "profile run and ran with MemAvailable near 1.5 GB against 2.7 (+43 %); the corpus's "
        "qwen_auto_ov, which asked 680 MiB more than any 4,000 MiB run (+14 to +27 %)",
    ),
)
# fmt: on

#: The recorded effects by lever.
EFFECTS: dict[str, LeverEffect] = {e.lever: e for e in _RECORDED}
#: A lever no run varied: the largest spread any lever was seen to have.
UNSEEN = max(_RECORDED, key=lambda e: e.sd_rel)


def effect_of(lever: str) -> LeverEffect:
    """The recorded effect of `lever`; for a lever never varied, the largest one recorded
    (under the lever's own name, saying so)."""
    if lever in EFFECTS:
        return EFFECTS[lever]
    return LeverEffect(
        lever,
        UNSEEN.sd_rel,
        UNSEEN.seen,
        f"no run of the corpus or the archives varied {lever}: the largest effect recorded "
        f"for any lever ({UNSEEN.lever})",
    )


#: A budget within this factor of the runs' budgets counts as measured (as a read volume
#: does: :data:`bmoe.analyze.device.fits.SAME_VOLUME`).
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


__all__ = [
    "BUDGET_SLACK",
    "EFFECTS",
    "MEMORY_HEADROOM_SHARE",
    "TERM_LEVERS",
    "UNSEEN",
    "LeverCheck",
    "LeverEffect",
    "baselines",
    "check_levers",
    "effect_of",
    "lever_term",
    "lever_value",
    "split_runs",
]
