"""The C heap's free memory given back to the system after replays in worker threads."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (looked up among the
    symbols the process has loaded: ``ctypes.util.find_library`` would start ``ldconfig``)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_heap() -> None:
    """Give the C heap's free memory back to the system. The kernels allocate their state
    and results with malloc; run from worker threads, glibc keeps what they freed in one
    arena per thread, which on a 10 M-row curve holds ~100 MiB nobody uses."""
    trim = malloc_trim()
    if trim is not None:
        trim(0)
