"""Tests of ``bmoe.sweep``."""
