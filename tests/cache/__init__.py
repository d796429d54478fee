"""Tests of ``bmoe.cache``."""
