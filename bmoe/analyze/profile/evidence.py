"""What the profile's sections are built from, and what they report while they are built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bmoe.analyze.profile.runs import ProfileRun, RunConfig
from bmoe.analyze.profile.tokens import Tokens


@dataclass
class Evidence:
    """The runs, per run its configuration and tokens, and the runs' system states; the model's read
    geometry (``slices`` per expert, ``req`` bytes per flash request); which runs the timing
    terms come from (``timing``); and what the sections found on the way (``caveats``,
    ``unsettled``, ``absent`` and the ``terms`` records, in the order they were found)."""

    runs: list[ProfileRun]
    configs: dict[str, RunConfig]
    tokens: dict[str, Tokens]
    states: list[dict[str, Any]]
    slices: int
    req: float
    timing: list[ProfileRun] = field(default_factory=list)
    untraced: list[ProfileRun] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)
    absent: dict[str, str] = field(default_factory=dict)
    terms: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Figures of one run that do not depend on which runs are beside it, made once and
    #: shared with every subset (see :meth:`subset`).
    per_run: dict[tuple[str, str], Any] = field(default_factory=dict)

    def subset(self, runs: list[ProfileRun]) -> Evidence:
        """The evidence of `runs` alone (what the sections found so far left behind)."""
        names = {r.name for r in runs}
        return Evidence(
            runs=list(runs),
            configs={n: c for n, c in self.configs.items() if n in names},
            tokens={n: t for n, t in self.tokens.items() if n in names},
            states=[s for s in self.states if s["name"] in names],
            slices=self.slices,
            req=self.req,
            per_run=self.per_run,
        )

    @property
    def state(self) -> dict[str, dict[str, Any]]:
        """Each run's system state by name."""
        return {s["name"]: s for s in self.states}

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        return {name: t.frame for name, t in self.tokens.items()}

    def frame(self, run: ProfileRun) -> pd.DataFrame:
        return self.tokens[run.name].frame

    def values(self, run: ProfileRun, column: str) -> np.ndarray:
        """A column of the run's tokens (read-only)."""
        return self.tokens[run.name].values(column)

    def admits(self, run: ProfileRun) -> np.ndarray:
        """Per token, the experts the run admitted (demand misses and prefetched)."""
        return self.values(run, "misses") + self.values(run, "prefetched")

    def measured(self, run: ProfileRun, column: str) -> bool:
        """Whether the run recorded `column` for any token."""
        return bool((~np.isnan(self.values(run, column))).any())

    def starved(self, run: ProfileRun) -> bool:
        return bool(self.state[run.name]["starved"])

    def config_key(self, run: ProfileRun) -> tuple:
        """What makes two runs repeats of one configuration: the grid axes, top-k and the
        dense weights' placement."""
        config = self.configs[run.name]
        return (
            tuple(config.axes().items()),
            config.n_expert_used,
            run.metrics.params.get("dense_weights"),
        )

    def config_keys(self, runs: list[ProfileRun]) -> dict[str, tuple]:
        """Each run's configuration key by name (see :meth:`config_key`)."""
        return {r.name: self.config_key(r) for r in runs}

    def contended(self, run: ProfileRun) -> bool:
        """Starved, or its compute waited for a core (see ``run_state``)."""
        state = self.state[run.name]
        return bool(state.get("contended", state["starved"]))


__all__ = ["Evidence"]
