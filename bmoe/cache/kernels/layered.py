"""``layer`` and ``layerlfu``: the LRU and LFU kernels with a budget slice per layer (the
live classes :class:`~bmoe.cache.policies.layered.LayerLRU` and
:class:`~bmoe.cache.policies.layered.LayerLFU` are per-layer: :class:`~.base.Replay` splits
the budget and passes each batch's layer as its slice)."""

from __future__ import annotations

from bmoe.cache.kernels import lfu, lru
from bmoe.cache.kernels.base import KernelSpec
from bmoe.cache.policies.layered import LayerLFU, LayerLRU

SPECS = (
    KernelSpec(LayerLRU, lru.new, lru.step, lru.PER_KEY),
    KernelSpec(LayerLFU, lfu.new, lfu.stepper(True), (), lfu.grow),
)
