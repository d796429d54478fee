"""Compiled replay kernels: every policy's batch semantics as loops over flat arrays, and the
registry that finds a policy's kernels by its name.

The live cache (:class:`bmoe.cache.ExpertCache`, one ``stage`` per layer load) is the
definition of the batch semantics; the kernels replay batches under the same semantics at
compiled speed (tested equal batch for batch, ``tests/cache/test_equivalence.py``). They
release the GIL, so budgets and policies can run in threads, and are compiled once and
cached on disk by numba.

A policy family is one module here, named as the module of its live class in
:mod:`bmoe.cache.policies` (``policies/s3fifo.py`` -> ``kernels/s3fifo.py``), holding its
state (a ``NamedTuple``), its state factory, its continue step, its whole-trace call and
``SPECS``: a :class:`~bmoe.cache.kernels.base.KernelSpec` per policy naming its live class.
So registering the live class in :data:`bmoe.cache.POLICIES` registers its kernels too;
:func:`kernel_spec` imports the module on first use. The shared structures (linked lists,
heaps) are in :mod:`~bmoe.cache.kernels.shared`, trace preparation in
:mod:`~bmoe.cache.kernels.batches`, stack distances in :mod:`~bmoe.cache.kernels.distances`.
``docs/adding-a-policy.md`` has the steps.
"""

from __future__ import annotations

import importlib

from bmoe.cache.kernels.base import (
    Budgets,
    Chunk,
    KernelSpec,
    Replay,
    ReplayBudgets,
    Setup,
    counter_bits,
    widened,
)
from bmoe.cache.kernels.memory import release_heap
from bmoe.cache.kernels.randomized import draw, mt_state
from bmoe.cache.policies import POLICIES
from bmoe.errors import BmoeError

__all__ = [
    "Budgets",
    "Chunk",
    "KernelSpec",
    "Replay",
    "ReplayBudgets",
    "Setup",
    "counter_bits",
    "draw",
    "kernel_spec",
    "kernel_specs",
    "mt_state",
    "release_heap",
    "widened",
]


def kernel_spec(policy: str) -> KernelSpec:
    """The kernels of `policy` (a name of :data:`~bmoe.cache.POLICIES`), from the module
    named as its live class's."""
    live = POLICIES.get(policy)
    if live is None:
        raise BmoeError(f"unknown cache policy {policy!r} (choose from {', '.join(POLICIES)})")
    family = live.__module__.rsplit(".", 1)[-1]
    try:
        module = importlib.import_module(f"{__name__}.{family}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{family}":
            raise
        raise BmoeError(f"policy {policy!r} has no replay kernel") from None
    for spec in getattr(module, "SPECS", ()):
        if spec.live is live:
            return spec
    raise BmoeError(f"policy {policy!r} has no replay kernel")


def kernel_specs() -> dict[str, KernelSpec]:
    """Every policy's kernels, by name (the order of :data:`~bmoe.cache.POLICIES`)."""
    return {name: kernel_spec(name) for name in POLICIES}
