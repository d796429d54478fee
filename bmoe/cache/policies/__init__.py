"""Eviction policies of the expert cache, by name.

The reference's six (:data:`REFERENCE_POLICIES`: their replay figures are the established
ones) come first; the others are further policies with the same byte budget and batch
semantics. A class listed in :data:`POLICIES` is registered for the live cache and, through
its kernel module of the same name, for replay (``docs/adding-a-policy.md``).
"""

from __future__ import annotations

from bmoe.cache.policies.arc import ARC
from bmoe.cache.policies.base import NEVER, Policy
from bmoe.cache.policies.belady import Belady
from bmoe.cache.policies.clock import Clock
from bmoe.cache.policies.layered import LayerLFU, LayerLRU
from bmoe.cache.policies.lfu import LFU, InCacheLFU
from bmoe.cache.policies.lfuda import LFUDA, LibCacheSimLFUDA
from bmoe.cache.policies.lru import LRU
from bmoe.cache.policies.randomized import Random
from bmoe.cache.policies.s3fifo import S3FIFO, LibCacheSimS3FIFO
from bmoe.cache.policies.sieve import Sieve

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        Belady, LRU, LFU, Random, LayerLRU, LayerLFU, ARC, S3FIFO, LFUDA, InCacheLFU,
        LibCacheSimLFUDA, LibCacheSimS3FIFO, Sieve, Clock,
    )
}  # fmt: skip

#: the policies of the reference curve, in its column order
REFERENCE_POLICIES = ("belady", "lru", "lfu", "random", "layer", "layerlfu")
#: the engine's policy: what a run's residency column records, so what validation replays
DEFAULT_POLICY = LRU.name

__all__ = ["DEFAULT_POLICY", "NEVER", "POLICIES", "REFERENCE_POLICIES", "Policy"]
