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
from bmoe.cache.policies.fifo import FIFO
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
        LibCacheSimLFUDA, LibCacheSimS3FIFO, Sieve, Clock, FIFO,
    )
}  # fmt: skip

#: the policies of the reference curve, in its column order
REFERENCE_POLICIES = ("belady", "lru", "lfu", "random", "layer", "layerlfu")
#: the engine's policy: what a run's residency column records, so what validation replays
DEFAULT_POLICY = LRU.name


def _spelling(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


#: every spelling (a policy's name, its own engine names, each without hyphens) -> its name
_SPELLINGS = {
    spelling: cls.name
    for cls in POLICIES.values()
    for known in (cls.name, *vars(cls).get("engine_names", ()))  # not a base class's
    for spelling in (_spelling(known), _spelling(known).replace("-", ""))
}


def policy_name(name: str) -> str:
    """The replay's name for a cache policy as a run names it (``layer-lfu`` -> ``layerlfu``,
    ``S3-FIFO`` -> ``s3fifo``); a name no policy answers to is returned as given, for the
    caller's own "unknown policy" error."""
    key = _spelling(name)
    return _SPELLINGS.get(key, _SPELLINGS.get(key.replace("-", ""), str(name)))


__all__ = [
    "DEFAULT_POLICY",
    "NEVER",
    "POLICIES",
    "REFERENCE_POLICIES",
    "Policy",
    "policy_name",
]
