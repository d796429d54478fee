"""Whether a recorded run is one a profile can price: streaming, the same top-k, the same
model, the same dense weights."""

from __future__ import annotations

from bmoe.analyze.profile.runs import ProfileRun, RunConfig, number
from bmoe.formats.profile import DeviceProfile


def _same_model(params: dict, profile: DeviceProfile) -> str | None:
    """Why a file is not of the profile's model (None: it is, as far as both say)."""
    for key in ("n_layer", "n_expert"):
        mine = number(params.get(key))
        theirs = number(profile.model.get(key))
        if mine is not None and theirs is not None and mine != theirs:
            return f"another model ({key} {int(mine)}, the profile's {int(theirs)})"
    file_knows = number(params.get("n_layer")) is not None
    profile_knows = number(profile.model.get("n_layer")) is not None
    if file_knows == profile_knows:
        return None
    if file_knows:
        return (
            f"a run of {params.get('model') or 'a named model'}; the profile's runs do not "
            "record their model: cannot tell it is the same"
        )
    return (
        "its file does not record its model (v0): cannot tell it is the profile's "
        f"({profile.model.get('name') or 'named'})"
    )


def not_comparable(
    run: ProfileRun, config: RunConfig, profile: DeviceProfile, k_trace: float | None
) -> str | None:
    """Why no prediction of `run` can be compared with it (None: it can): no expert
    streaming, another top-k than the trace's or the profile's, another model, other dense
    weights than the profile's runs."""
    params = run.metrics.params
    k_profile = number(profile.model.get("n_expert_used"))
    k = config.n_expert_used
    if not config.streaming:
        return "no expert streaming (plain mmap): nothing the profile prices"
    if k and k_trace and k != k_trace:
        return f"top-{k}, the trace top-{int(k_trace)} (--n-expert-used changes the routing)"
    if k and k_profile and k != k_profile:
        return f"top-{k}, the profile's runs top-{int(k_profile)}"
    why = _same_model(params, profile)
    if why is not None:
        return why
    dense = params.get("dense_weights")
    profile_dense = {
        str(r["dense_weights"]) for r in profile.runs if r.get("dense_weights") is not None
    }
    if dense is not None and profile_dense and dense not in profile_dense:
        return (
            f"dense weights {dense}, the profile's runs {', '.join(sorted(profile_dense))}: "
            "not a configuration the profile prices"
        )
    return None


__all__ = ["not_comparable"]
