"""Byte units, defined once; a module of its own that imports nothing, so any layer can use it."""

KIB = 1 << 10
MIB = 1 << 20
