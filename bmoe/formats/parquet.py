"""Parquet round trip (placeholder until the converter lands)."""

from __future__ import annotations


def is_parquet(source) -> bool:
    if isinstance(source, bytes | bytearray):
        return bytes(source[:4]) == b"PAR1"
    try:
        with open(source, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError:
        return False
