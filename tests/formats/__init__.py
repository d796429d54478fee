"""Tests of ``bmoe.formats``."""
