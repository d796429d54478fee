"""Levers a profile's runs varied that its terms do not model as a mechanism: the prefetch
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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bmoe.analyze.profile.evidence import Evidence
from bmoe.analyze.profile.runs import ProfileRun, RunConfig
from bmoe.cache import DEFAULT_POLICY

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


__all__ = ["TERM_LEVERS", "baselines", "lever_term", "lever_value", "split_runs"]
