"""Tests of ``bmoe.engine``."""
