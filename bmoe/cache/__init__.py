"""The byte-budgeted expert cache and its eviction policies.

One implementation, driven live by the engine (one ``stage`` per layer load) and offline by
replay (``bmoe.analyze.replay``), so a replayed LRU row is the engine's own accounting.
"""

from bmoe.cache.expert_cache import (
    EXPERT_BITS,
    ExpertCache,
    StageResult,
    cache_key,
    key_expert,
    key_layer,
)
from bmoe.cache.policies import NEVER, POLICIES, REFERENCE_POLICIES

__all__ = [
    "EXPERT_BITS",
    "NEVER",
    "POLICIES",
    "REFERENCE_POLICIES",
    "ExpertCache",
    "StageResult",
    "cache_key",
    "key_expert",
    "key_layer",
]
