"""Tests of ``bmoe.render``."""
