"""The one replay driver: every cell of a replay (a policy at a budget) fed the same chunks of
batches, and their figures tallied.

A whole trace is one chunk (:func:`bmoe.analyze.replay.replay_curve`,
:func:`~bmoe.analyze.replay.simulate`); a trace read block by block is a chunk per block
(:func:`bmoe.analyze.replay_stream.stream_replay`). Each cell's cache is a
:class:`bmoe.cache.kernels.Replay` carried from chunk to chunk. Cells whose policy reads the
future run when their chunks come with next uses; otherwise they are handed to a
:class:`Deferred` store (the stream's spill to disk) and run once it has them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from bmoe.cache import POLICIES
from bmoe.units import MIB

if TYPE_CHECKING:
    import pandas as pd

    from bmoe.cache.kernels import Chunk

CURVE_COLUMNS = ("budget_mib", "policy", "hit_pct_cum", "hit_pct_decode", "read_mib")

#: a cell of a replay: (budget in MiB as given, policy name)
Cell = tuple[float, str]


class Deferred(Protocol):
    """Where the chunks of the policies that read the future wait until every next use is
    known: :meth:`add` each chunk as it comes, then :meth:`chunks` gives them back in order
    with their next uses."""

    def add(self, chunk: Chunk) -> None: ...

    def chunks(self, n_keys: int) -> Iterator[Chunk]: ...


class Tally:
    """Per cell, the hits, decode hits and hit bytes added up chunk by chunk, and the
    lookups, decode lookups and bytes they are shares of."""

    def __init__(self, n_cells: int) -> None:
        self.hits = np.zeros(n_cells, dtype=np.int64)
        self.decode_hits = np.zeros(n_cells, dtype=np.int64)
        self.hit_bytes = np.zeros(n_cells, dtype=np.int64)
        self.lookups = self.decode_lookups = self.bytes = 0

    def count(self, chunk: Chunk) -> None:
        """A chunk's lookups."""
        n_lookups = np.diff(chunk.bounds)
        self.lookups += int(n_lookups.sum())
        self.decode_lookups += int(n_lookups[chunk.decode].sum())
        self.bytes += int((n_lookups * chunk.size).sum())

    def add(self, i: int, hits: np.ndarray, chunk: Chunk) -> None:
        """Cell `i`'s hits per batch of `chunk`."""
        self.hits[i] += int(hits.sum())
        self.decode_hits[i] += int(hits[chunk.decode].sum())
        self.hit_bytes[i] += int((hits * chunk.size).sum())

    def figures(self, i: int) -> dict[str, float]:
        """Cell `i`'s cumulative and decode-only hit % and MiB read."""
        n, n_dec = self.lookups, self.decode_lookups
        return {
            "hit_pct_cum": 100.0 * int(self.hits[i]) / n if n else float("nan"),
            "hit_pct_decode": 100.0 * int(self.decode_hits[i]) / n_dec if n_dec else float("nan"),
            "read_mib": (self.bytes - int(self.hit_bytes[i])) / MIB,
        }

    def curve(self, cells: Sequence[Cell]) -> pd.DataFrame:
        """The curve rows of `cells` (the first cells of the tally)."""
        return as_frame(self.curve_columns(cells))

    def curve_columns(self, cells: Sequence[Cell]) -> dict[str, list]:
        """:meth:`curve` as columns (name -> values), without pandas."""
        columns: dict[str, list] = {name: [] for name in CURVE_COLUMNS}
        for i, (budget, policy) in enumerate(cells):
            columns["budget_mib"].append(budget)
            columns["policy"].append(policy)
            for name, value in self.figures(i).items():
                columns[name].append(value)
        return columns


def as_frame(columns: dict[str, list]) -> pd.DataFrame:
    """Columns (name -> values) as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(columns)


class Replays:
    """The caches of `cells`, each a :class:`~bmoe.cache.kernels.Replay` of `n_keys` key ids
    in `n_parts` layer slices of at most `part_keys` ids (`n_layer` splits the per-layer
    policies' budgets), fed chunk by chunk; `jobs` run at once in threads (the kernels
    release the GIL). The cells of a policy that replays several budgets in one pass
    (``lru``) share one :class:`~bmoe.cache.kernels.ReplayBudgets`, with the same hits. With
    `deferred`, the cells whose policy reads the future wait for :meth:`finish`."""

    def __init__(
        self,
        cells: Sequence[Cell],
        n_keys: int,
        n_parts: int,
        n_layer: int | None,
        *,
        part_keys: int = 0,
        seed: int = 0,
        jobs: int = 1,
        deferred: Deferred | None = None,
    ) -> None:
        from bmoe.cache import kernels  # numba: imported when a replay is asked for

        self.kernels = kernels
        self.cells = list(cells)
        self.deferred = deferred
        self.setup = kernels.Setup(n_keys, n_parts, seed, part_keys)
        self.n_layer = n_layer
        waits = [deferred is not None and POLICIES[p].needs_future for _, p in self.cells]
        self.now = [i for i, w in enumerate(waits) if not w]
        self.later = [i for i, w in enumerate(waits) if w]
        by_policy: dict[str, list[int]] = {}
        for i in self.now:
            by_policy.setdefault(self.cells[i][1], []).append(i)
        #: (the cells, their caches): one task per cell, or per policy for one-pass budgets
        self.tasks: list[tuple[list[int], Any]] = []
        for policy, group in by_policy.items():
            spec = kernels.kernel_spec(policy)
            if spec.budgets is not None and not spec.live.per_layer and len(group) > 1:
                budgets = [round(self.cells[i][0] * MIB) for i in group]
                self.tasks.append((group, kernels.ReplayBudgets(spec, budgets, self.setup)))
            else:
                self.tasks += [([i], self._replay(i)) for i in group]
        self.tasks.sort(key=lambda task: task[0][0])
        self.jobs = max(1, min(jobs, len(self.tasks)))
        self.pool = ThreadPoolExecutor(max_workers=self.jobs) if self.jobs > 1 else None

    def _replay(self, i: int):
        budget_mib, policy = self.cells[i]
        spec = self.kernels.kernel_spec(policy)
        return self.kernels.Replay(spec, round(budget_mib * MIB), self.setup, self.n_layer)

    def grow(self, n_keys: int, part_keys: int) -> None:
        """Make room in every cache for key ids up to `n_keys`, `part_keys` in a slice."""
        self.setup = self.kernels.Setup(n_keys, self.setup.n_parts, self.setup.seed, part_keys)
        for _, caches in self.tasks:
            caches.grow(n_keys, part_keys)

    def feed(
        self,
        chunk: Chunk,
        tally: Tally | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[int, np.ndarray]:
        """Feed `chunk` to every cell that runs now; their hits per batch, by cell index,
        also added to `tally`. `progress(done, cells)` is called as each cell finishes."""
        if self.deferred is not None and self.later:
            self.deferred.add(chunk)

        def one(task: tuple[list[int], Any]) -> np.ndarray:
            hits = task[1].feed(chunk)
            if self.pool is not None:
                self.kernels.release_heap()  # each worker thread's heap would keep what it freed
            return hits

        tasks = self.tasks
        found = self.pool.map(one, tasks) if self.pool is not None else map(one, tasks)
        out = {}
        for (cells, _), hits in zip(tasks, found, strict=True):
            for row, i in enumerate(cells):
                out[i] = hits[row] if hits.ndim == 2 else hits
                if tally is not None:
                    tally.add(i, out[i], chunk)
                if progress is not None:
                    progress(len(out), len(self.cells))
        return {i: out[i] for i in self.now}

    def finish(self, tally: Tally) -> None:
        """Run the deferred cells over every chunk, now that their next uses are known."""
        if self.deferred is None or not self.later:
            return
        caches = {i: self._replay(i) for i in self.later}
        for chunk in self.deferred.chunks(self.setup.n_keys):
            for i, r in caches.items():
                tally.add(i, r.feed(chunk), chunk)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
