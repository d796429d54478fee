"""Tests of ``bmoe.analyze``."""
