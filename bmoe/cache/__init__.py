"""The byte-budgeted expert cache and its eviction policies.

``ExpertCache`` is driven live by the engine (one ``stage`` per layer load) and defines the
batch semantics; offline replay (``bmoe.analyze.replay``) runs them as compiled kernels
(:mod:`bmoe.cache.kernels`, imported on demand: it loads
numba) that are tested equal to staging batch by
batch, so a replayed LRU row is the engine's own accounting.
"""

from bmoe.cache.expert_cache import (
    EXPERT_BITS,
    ExpertCache,
    StageResult,
    cache_key,
    key_expert,
    key_layer,
)
from bmoe.cache.policies import (
    DEFAULT_POLICY,
    NEVER,
    POLICIES,
    REFERENCE_POLICIES,
    policy_name,
)

__all__ = [
    "DEFAULT_POLICY",
    "EXPERT_BITS",
    "NEVER",
    "POLICIES",
    "REFERENCE_POLICIES",
    "ExpertCache",
    "StageResult",
    "cache_key",
    "key_expert",
    "key_layer",
    "policy_name",
]
