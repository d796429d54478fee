"""Tests of ``bmoe.cli``."""
