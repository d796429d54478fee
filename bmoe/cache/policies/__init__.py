"""Eviction policies of the expert cache, by name."""

from __future__ import annotations

from bmoe.cache.policies.base import NEVER, Policy
from bmoe.cache.policies.lru import LRU

POLICIES: dict[str, type[Policy]] = {
    "lru": LRU,
}

__all__ = ["NEVER", "POLICIES", "Policy"]
