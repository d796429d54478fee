"""What a policy's kernel module declares (:class:`KernelSpec`) and the cache it drives over
chunks of batches (:class:`Replay`): the one replay loop, whether the batches come as one
chunk (a whole trace) or chunk after chunk (a stream).

A chunk's batches are flat arrays over dense key ids ``0..n_keys-1`` (see :class:`Chunk`);
every cache structure is an array indexed by key id, kept in the kernel's *state*: a
``NamedTuple`` of arrays the module declares, its fields read by name. The kernels update
the state in place, so batches given chunk by chunk replay as if given at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bmoe.cache.policies import Policy
from bmoe.errors import BmoeError

#: a kernel's state: a NamedTuple of numpy arrays (scalars kept in small arrays)
State = Any
#: an array argument of a kernel
Arr = np.ndarray


def counter_bits(n: int) -> int:
    """Bits that hold a counter up to `n` (the low field of a packed priority)."""
    return max(1, int(n).bit_length())


@dataclass(frozen=True)
class Chunk:
    """Consecutive batches of a replay as the kernels read them.

    Per batch: ``bounds`` (one more entry than batches: batch ``b``'s lookups are
    ``look[bounds[b]:bounds[b+1]]``, distinct key ids in first-seen order, and ``rec`` the
    same ids in last-touch order, read only where ``repeated[b]``), ``size`` (int64: the
    bytes of one expert of the batch's layer) and ``part`` (int64: the budget slice of the
    per-layer policies, the layer's index); ``decode`` (bool, what the tallies split by: the
    kernels do not read it). ``first`` numbers the chunk's first batch in the replay.
    Policies that read the future also need ``next_use`` (per lookup, the number of the
    next batch looking its key up, ``n_total`` when none), ``n_total`` and
    ``total_lookups`` (the replay's batches and lookups)."""

    bounds: np.ndarray
    look: np.ndarray
    rec: np.ndarray
    repeated: np.ndarray
    size: np.ndarray
    part: np.ndarray
    decode: np.ndarray
    first: int = 0
    next_use: np.ndarray | None = None
    n_total: int = 0
    total_lookups: int = 0

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @property
    def parts(self) -> int:
        """The number of budget slices the chunk's batches name (at least one)."""
        return int(self.part.max(initial=0)) + 1


@dataclass(frozen=True)
class Setup:
    """What a state factory reads: the key ids, the budget slices and the seed (of ``random``)."""

    n_keys: int
    n_parts: int  # budget slices: 1, or the layers for per-layer policies
    seed: int = 0
    part_keys: int = 0  # the most key ids one slice holds (0: all of them)

    def __post_init__(self) -> None:
        if not self.part_keys or self.n_parts == 1:
            object.__setattr__(self, "part_keys", self.n_keys)


@dataclass(frozen=True)
class KernelSpec:
    """One policy's kernels, as its module declares them.

    `live` is the live class (:mod:`bmoe.cache.policies`): its name, and its traits
    (``per_layer``: the budget is split into a slice per layer; ``needs_future``: each
    lookup's next use is read) come from there. `new` makes an empty state for a
    :class:`Setup`; `step` replays a chunk from a :class:`Replay`'s state (updated in place)
    and returns the hits per batch; `per_key` names the state's arrays with a slot per key
    id (widened when a stream meets new ids; linked-list node arrays keep their sentinel
    slots at the end); `grow`, when given, widens the state itself instead."""

    live: type[Policy]
    new: Callable[[Setup], State]
    step: Callable[[Replay, Chunk], np.ndarray]
    per_key: tuple[str, ...]
    grow: Callable[[State, Setup, int], State] | None = None
    budgets: Budgets | None = None  # several budgets of a global policy in one pass

    @property
    def name(self) -> str:
        return self.live.name


@dataclass(frozen=True)
class Budgets:
    """A policy's replay of several budgets in one pass, each budget's hits those of its own
    :class:`Replay`: `new` makes the state of a :class:`Setup`'s keys at a number of budgets,
    `step` replays a chunk from a :class:`ReplayBudgets` and returns the hits per budget
    (ascending) and batch, `per_key` names the state's arrays widened with the keys."""

    new: Callable[[Setup, int], State]
    step: Callable[[ReplayBudgets, Chunk], np.ndarray]
    per_key: tuple[str, ...]


def widened(state: State, fresh: State, per_key: tuple[str, ...], old: int) -> State:
    """`state` with its `per_key` arrays widened to those of `fresh` (the new ids empty),
    the other arrays kept. A linked list's node arrays hold a slot per key and then one per
    list (its sentinel, addressed from the end): those stay at the end."""
    out = {}
    for name in per_key:
        now, wide = getattr(state, name), getattr(fresh, name)
        wide[:old] = now[:old]
        extra = len(now) - old
        if extra:
            wide[-extra:] = now[old:]
        out[name] = wide
    return state._replace(**out)


#: The largest budget a kernel is given (bytes, 4 EiB): a budget beyond every expert of any
#: model replays as this one does, and its bytes stay an int64 (``cache_mb = 1e30`` in a
#: metrics preamble, or ``--budgets 1e30``, reached the compiled kernels as a Python int).
MAX_BUDGET = 1 << 62


@dataclass
class Replay:
    """One policy at one budget, its cache carried from chunk to chunk: :meth:`feed` gives
    the hits per batch of a chunk. The budget is split into `n_layer` equal slices for the
    per-layer policies."""

    spec: KernelSpec
    budget: int
    setup: Setup
    n_layer: int | None = None
    state: State = field(init=False)
    capacity: int = field(init=False)  # the bytes a batch's slice may hold

    def __post_init__(self) -> None:
        if self.budget < 0:
            raise BmoeError(f"cache budget must be >= 0 bytes, not {self.budget}")
        self.budget = min(int(self.budget), MAX_BUDGET)
        self.capacity = self.budget
        if self.per_layer:
            if not self.n_layer or self.n_layer < 1:
                raise BmoeError(f"policy {self.name!r} needs the model's layer count (n_layer)")
            self.capacity = self.budget // self.n_layer
        else:
            self.setup = Setup(self.setup.n_keys, 1, self.setup.seed)
        self.state = self.spec.new(self.setup)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def per_layer(self) -> bool:
        return self.spec.live.per_layer

    @property
    def needs_future(self) -> bool:
        return self.spec.live.needs_future

    def parts_of(self, chunk: Chunk) -> np.ndarray:
        """Per batch, the slice it stages into: its layer's, or 0 for the global policies."""
        return chunk.part if self.per_layer else np.zeros(len(chunk), dtype=np.int64)

    def grow(self, n_keys: int, part_keys: int = 0) -> None:
        """Make room for key ids up to `n_keys`, `part_keys` in one slice (the cache
        unchanged)."""
        old = self.setup.n_keys
        self.setup = Setup(n_keys, self.setup.n_parts, self.setup.seed, part_keys)
        if self.spec.grow is not None:
            self.state = self.spec.grow(self.state, self.setup, old)
        else:
            self.state = widened(self.state, self.spec.new(self.setup), self.spec.per_key, old)

    def feed(self, chunk: Chunk) -> np.ndarray:
        """Hits per batch of `chunk`, the cache left as after it."""
        if not len(chunk):
            return np.zeros(0, dtype=np.int64)
        return self.spec.step(self, chunk)

    def packing(self, held_keys: int, top: int, chunk: Chunk) -> int:
        """The shift that packs a heap priority (at most `top` before this chunk) above a
        touch stamp: the bits of the keys held and the chunk's lookups."""
        shift = counter_bits(held_keys + len(chunk.look))
        if 2 * shift > 62 or top + len(chunk.look) >= 1 << (62 - shift):
            raise self.overflow(chunk)
        return shift

    def overflow(self, chunk: Chunk) -> BmoeError:
        """The error of a replay whose priorities no longer fit."""
        return BmoeError(
            f"{self.name}'s priorities outgrow 64 bits on {len(chunk.look):,} lookups; "
            "replay fewer rows"
        )


@dataclass
class ReplayBudgets:
    """One global policy at several budgets in one pass (its spec's :attr:`KernelSpec.budgets`),
    the caches carried from chunk to chunk: :meth:`feed` gives the hits per budget (in the
    order given) and batch."""

    spec: KernelSpec
    budgets: list[int]
    setup: Setup
    state: State = field(init=False)
    capacities: np.ndarray = field(init=False)  # the distinct budgets, ascending
    rows: np.ndarray = field(init=False)  # per budget given, its row of the hits

    def __post_init__(self) -> None:
        if self.spec.budgets is None or self.spec.live.per_layer:
            raise BmoeError(f"policy {self.spec.name!r} has no replay of several budgets")
        if any(b < 0 for b in self.budgets):
            raise BmoeError(f"cache budget must be >= 0 bytes, not {min(self.budgets)}")
        self.setup = Setup(self.setup.n_keys, 1, self.setup.seed)
        self.budgets = [min(int(b), MAX_BUDGET) for b in self.budgets]
        self.capacities, self.rows = np.unique(np.asarray(self.budgets, dtype=np.int64),
                                               return_inverse=True)  # fmt: skip
        self.state = self.spec.budgets.new(self.setup, len(self.capacities))

    def grow(self, n_keys: int, part_keys: int = 0) -> None:
        """Make room for key ids up to `n_keys` (the caches unchanged)."""
        assert self.spec.budgets is not None
        old = self.setup.n_keys
        self.setup = Setup(n_keys, 1, self.setup.seed)
        fresh = self.spec.budgets.new(self.setup, len(self.capacities))
        self.state = widened(self.state, fresh, self.spec.budgets.per_key, old)

    def feed(self, chunk: Chunk) -> np.ndarray:
        """Hits per budget (as given) and batch of `chunk`, the caches left as after it."""
        if not len(chunk):
            return np.zeros((len(self.budgets), 0), dtype=np.int64)
        assert self.spec.budgets is not None
        return self.spec.budgets.step(self, chunk)[self.rows]
