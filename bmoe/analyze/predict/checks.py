"""Refusals before a prediction: a profile of another model or top-k, an unsettled profile
under ``--strict``."""

from __future__ import annotations

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


__all__ = ["check_model", "check_settled"]
