"""The catalogue of views: every view a command shows, by its slug and its title.

A view is one table or group of figures an analysis hands to the renderers. Its **slug**
(``ranking``, ``steps``) is the key of ``-f json`` and the ``# view=`` of ``-f csv``: stable,
so scripts can rely on it, and never reworded. Its **title** (``cells ranked by
{outcome}``) is what terminal tables, markdown and the HTML report show: prose, free to
change, with ``{placeholders}`` filled from the analysis's parameters. A view shown in the
HTML report names its report **section** (the heading it sits under; the page lays sections
out in the order the group lists them).

Analyses key their results by slug; renderers ask :func:`titles` (or :meth:`Group.title`)
what to show. Nothing else holds a view's name. ``docs/adding-a-view.md`` says how to add one.
No imports beyond the standard library: ``bmoe info`` reads titles without pandas.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class View:
    """One view: its stable `slug`, its `title` (a :meth:`str.format` template over the
    analysis's parameters) and the report `section` it sits in (None: not in the report)."""

    slug: str
    title: str
    section: str | None = None

    def titled(self, **params: object) -> str:
        """The title with the analysis's parameters filled in."""
        return self.title.format(**params)


@dataclass(frozen=True)
class Group:
    """The views of one analysis (a command or a report page), in the order they are shown."""

    name: str
    views: tuple[View, ...]

    def __post_init__(self) -> None:
        slugs = [v.slug for v in self.views]
        if len(set(slugs)) != len(slugs):
            raise ValueError(f"views of {self.name}: a slug listed twice")

    def __getitem__(self, slug: str) -> View:
        for view in self.views:
            if view.slug == slug:
                return view
        raise KeyError(f"{self.name} has no view {slug!r}")

    def __contains__(self, slug: object) -> bool:
        return any(v.slug == slug for v in self.views)

    def __iter__(self) -> Iterator[View]:
        return iter(self.views)

    @property
    def slugs(self) -> tuple[str, ...]:
        return tuple(v.slug for v in self.views)

    def title(self, slug: str, **params: object) -> str:
        """The title of `slug`, filled with `params`."""
        return self[slug].titled(**params)

    def titles(self, **params: object) -> dict[str, str]:
        """slug -> title for every view of the group, filled with `params` (a title whose
        placeholder is not among them keeps its slug)."""
        out = {}
        for view in self.views:
            try:
                out[view.slug] = view.titled(**params)
            except KeyError:
                out[view.slug] = view.slug
        return out

    def sections(self) -> dict[str, list[View]]:
        """Report section -> its views, both in the group's order."""
        out: dict[str, list[View]] = {}
        for view in self.views:
            if view.section is not None:
                out.setdefault(view.section, []).append(view)
        return out


def _group(name: str, *views: tuple[str, ...]) -> Group:
    return Group(name, tuple(View(*v) for v in views))


# ----------------------------------------------------------------------------- files

INFO = _group(
    "info",
    ("file", "file"),
    ("parameters", "parameters"),
    ("summary", "summary"),
    ("events", "events"),
    ("session", "session"),
    ("generations", "generations"),
    ("errors", "errors"),
    ("end_of_run", "end of run"),
    ("pressure", "pressure"),
    ("state", "state"),
    ("warnings", "warnings"),
)

# ----------------------------------------------------------------------------- runs

METRICS = _group(
    "metrics",
    ("runs", "runs"),
    ("throughput", "throughput"),
    ("pressure", "pressure"),
    ("cache", "cache"),
    ("speculation", "speculation"),
)

STALL = _group(
    "stall",
    ("run", "run"),
    ("attribution", "attribution"),
    ("tokens", "tokens"),
)

COMPARE = _group(
    "compare",
    ("comparison", "{a} (A) vs {b} (B)"),
    ("method", "{a} (A) vs {b} (B): method"),
    ("concerns", "{a} (A) vs {b} (B): concerns"),
)

CONTAMINATION = _group(
    "contamination",
    ("cells", "cells"),
    ("flags", "flags"),
    ("not_checked", "not checked"),
)

# ----------------------------------------------------------------------------- traces

ROUTE = _group(
    "route",
    ("sanity", "sanity"),
    ("hot", "hot experts per layer (coverage = share of the layer's activations)"),
    ("reuse", "reuse distance per (layer, expert), in steps of the layer's sequence"),
    ("overlap", "routing overlap with earlier steps (mean % of the top-k shared)"),
    ("workset", "cumulative distinct experts (working-set growth)"),
    ("cache", "cache outcome per layer (% of routings)"),
    ("prefetch_slots", "prefetch hits by router slot"),
    ("entropy", "routing entropy (bits) and top-1 weight share per layer"),
    ("bytes", "expert bytes read"),
    ("matrix", "step x layer matrix"),
)

REPLAY = _group(
    "replay",
    ("shape", "shape"),
    ("validation", "validation"),
    ("curve", "curve"),
    ("mrc_budgets", "exact LRU (stack distances) at the chosen budgets"),
    ("mrc", "mrc"),
    ("prefetch", "previous-token prefetch, depth {depth}"),
)

DROP = _group(
    "drop",
    ("decode", "decode"),
    ("decode_threshold", "decode_threshold"),
    ("decode_static_k", "decode_static_k"),
    ("decode_survivors", "decode_survivors"),
    ("prefill", "prefill"),
    ("prefill_threshold", "prefill_threshold"),
    ("prefill_static_k", "prefill_static_k"),
    ("prefill_survivors", "prefill_survivors"),
)

COMPUTE = _group(
    "compute",
    ("summary", "summary"),
    ("segments", "segments"),
    ("by_op", "by_op"),
    ("faults", "faults"),
    ("by_layer", "by_layer"),
    ("by_class", "by_class"),
    ("class_by_layer", "class_by_layer"),
    ("per_token_summary", "per_token_summary"),
    ("per_token", "per_token"),
)

IO = _group(
    "io",
    ("summary", "summary"),
    ("latency_us", "latency_us"),
    ("sizes", "sizes"),
    ("lanes", "lanes"),
    ("speculative", "speculative"),
    ("adjacency", "adjacency"),
    ("adjacency_by_layer", "adjacency_by_layer"),
    ("per_token_summary", "per_token_summary"),
    ("per_token", "per_token"),
)

# ----------------------------------------------------------------------------- sweeps

SWEEP = _group(
    "sweep",
    ("verdict", "verdict", "Verdict"),
    ("ranking", "cells ranked by {outcome}", "Ranking"),
    ("neighbours", "neighbours in the ranking", "Ranking"),
    ("stability", "stability per cell", "Ranking"),
    ("axis_table", "outcomes by axis value (means)", "Ranking"),
    ("axis_influence", "how far each axis moves {outcome} (its best and worst value)",
     "Ranking"),
    ("stall_by_cell", "stall attribution per cell", "Stall attribution per cell"),
    ("predicted", "predicted against measured", "Predicted against measured"),
    ("fidelity", "each cell's mean and its worst fidelity", "Speed against fidelity"),
    ("order_effect", "repeats against execution order", "Order and contamination"),
    ("reversed_rounds", "forward vs reversed rounds", "Order and contamination"),
    ("contamination", "contamination tells", "Order and contamination"),
    ("recorded_vs_replay", "recorded hit rate against the replay",
     "Recorded hit rate against the replay"),
    ("attempts", "attempts by target and status", "What ran"),
)  # fmt: skip

HISTORY = _group(
    "history",
    ("sweeps", "sweeps", "Sweeps"),
    ("differences", "differences between sweeps", "Sweeps"),
    ("trend", "{outcome} per cell and sweep", "Trends"),
    ("steps", "steps between sweeps", "Trends"),
    ("regressions", "regressions beyond {threshold_pct:g} % into the newest sweep"),
)

# ----------------------------------------------------------------------------- the device model

PROFILE = _group(
    "profile",
    ("profile", "profile"),
    ("terms", "terms (each a mean per token)"),
    ("flash", "flash (a request wave's latency by read lanes)"),
    ("flash_by_read", "flash latency by MiB read a token"),
    ("absent", "terms not measured"),
    ("runs", "runs"),
    ("runs_by_config", "runs (per configuration)"),
    ("held_out", "held out (each run predicted from the others)"),
    ("held_out_by_config", "held out (each configuration predicted from the others)"),
)

PREDICT = _group(
    "predict",
    ("predicted", "predicted"),
    ("speed", "speed (tok/s with its {interval}; a token's ms by part)"),
    ("cache", "cache (replayed)"),
    ("cells", "cells"),
    ("compared", "measured vs predicted tok/s"),
    ("left_out", "left out of the headline"),
    ("summary", "summary"),
)

# ----------------------------------------------------------------------------- report pages

#: A run's page: its own views beside the metrics (``summary``) and stall views it shows.
RUN = _group(
    "run",
    ("parameters", "parameters"),
    ("end_of_run", "end-of-run lines"),
)

#: A route trace's page: its own views beside the route and replay views it shows.
ROUTE_TRACE = _group(
    "route_trace",
    ("shape", "route trace"),
    ("matrix", "routing matrix ({phase} steps)"),
)

#: Every group, by name.
GROUPS: Mapping[str, Group] = {
    g.name: g
    for g in (INFO, METRICS, STALL, COMPARE, CONTAMINATION, ROUTE, REPLAY, DROP, COMPUTE, IO,
              SWEEP, HISTORY, PROFILE, PREDICT, RUN, ROUTE_TRACE)
}  # fmt: skip


def titles(group: str, **params: object) -> dict[str, str]:
    """slug -> title for the views of `group` (see :meth:`Group.titles`)."""
    return GROUPS[group].titles(**params)


__all__ = ["GROUPS", "Group", "View", "titles"]
