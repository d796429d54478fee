"""The few libc memory calls the engine needs (mmap, munmap, madvise, mincore), via ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
from typing import Any, cast

import numpy as np

PAGE = mmap.PAGESIZE
MADV_DONTNEED = 4
MADV_WILLNEED = 3
MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20  # a transparent huge page (x86-64, arm64 with 4 KiB pages)
_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return lib


def align_down(x: int, a: int = PAGE) -> int:
    return x - (x % a)


def align_up(x: int, a: int = PAGE) -> int:
    return -(-x // a) * a


def reserve(nbytes: int, huge: bool = False) -> int:
    """An anonymous private read-write mapping of `nbytes` (no pages committed yet).

    With `huge`, the mapping starts on a huge-page boundary and asks for transparent huge
    pages (``MADV_HUGEPAGE``; ignored where the kernel has them off): a page then costs 2 MiB
    of memory at its first touch, and the matmuls over it miss the TLB far less often."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    span = nbytes + HUGE_PAGE if huge else nbytes
    addr = _libc().mmap(None, span, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {nbytes} bytes failed: {os.strerror(err)}")
    if not huge:
        return int(addr)
    start = align_up(int(addr), HUGE_PAGE)  # trim the mapping to [start, start + nbytes)
    if start > addr:
        unmap(int(addr), start - int(addr))
    if addr + span > start + nbytes:
        unmap(start + nbytes, int(addr) + span - start - nbytes)
    _libc().madvise(start, nbytes, MADV_HUGEPAGE)
    return start


def unmap(addr: int, nbytes: int) -> None:
    _libc().munmap(addr, nbytes)


def release(addr: int, nbytes: int) -> int:
    """Return the whole pages inside [addr, addr + nbytes) to the OS; the bytes released."""
    start, end = align_up(addr), align_down(addr + nbytes)
    if end <= start:
        return 0
    if _libc().madvise(start, end - start, MADV_DONTNEED) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise(MADV_DONTNEED) failed: {os.strerror(err)}")
    return end - start


def will_need(addr: int, nbytes: int) -> None:
    start, end = align_down(addr), align_up(addr + nbytes)
    _libc().madvise(start, end - start, MADV_WILLNEED)


def touch(addr: int, nbytes: int) -> None:
    """Read one byte of every page of the range (faults it in)."""
    raw = (ctypes.c_char * nbytes).from_address(addr)
    int(np.frombuffer(cast(Any, raw), dtype=np.uint8)[::PAGE].sum())


def resident_pages(addr: int, nbytes: int) -> tuple[int, int]:
    """(resident, total) pages of the range, by mincore."""
    start, end = align_down(addr), align_up(addr + nbytes)
    n = (end - start) // PAGE
    if n <= 0:
        return 0, 0
    vec = (ctypes.c_ubyte * n)()
    if _libc().mincore(start, end - start, vec) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mincore failed: {os.strerror(err)}")
    return int(np.count_nonzero(np.frombuffer(cast(Any, vec), dtype=np.uint8) & 1)), n
