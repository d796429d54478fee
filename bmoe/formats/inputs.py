"""The checks before any input file is opened: it must be a regular file, and what reading
it whole takes must fit in what the process may still take.

Opening a FIFO blocks until someone writes to it, and a device such as ``/dev/zero`` never
ends; both are refused up front with a ``file: problem`` error instead of hanging. A file (or
a few MB of Parquet declaring millions of rows) that needs more memory than is left is
refused before it is read, naming both sizes, instead of failing half-way at many GB.
"""

from __future__ import annotations

import os
import stat

from bmoe.formats.errors import FormatError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def regular_file(path: str | os.PathLike) -> str:
    """`path` as a string when it names a regular file (symlinks followed); else FormatError
    naming what it is."""
    name = os.fspath(path)
    name = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
    try:
        mode = os.stat(name).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise FormatError(name, None, "no such file") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise FormatError(name, None, f"cannot read: {reason}") from None
    if stat.S_ISDIR(mode):
        raise FormatError(name, None, "is a directory, not a file")
    if not stat.S_ISREG(mode):
        what = next((label for test, label in _KINDS if test(mode)), "not a regular file")
        raise FormatError(name, None, f"is {what}, not a regular file")
    return name


def is_regular_file(path: str | os.PathLike) -> bool:
    try:
        regular_file(path)
    except (FormatError, TypeError):
        return False
    return True


def _size(limit: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"


def read_limited(path: str | os.PathLike, limit: int, what: str = "") -> bytes:
    """The bytes of the regular file at `path` (:func:`regular_file`), at most `limit` of
    them: a larger file is a FormatError (`what` says what such a file should be), found
    without reading more than `limit` + 1 bytes (a sparse or growing file included)."""
    name = regular_file(path)
    try:
        with open(name, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise FormatError(name, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise FormatError(name, None, f"larger than {_size(limit)}" + (f"; {what}" if what else ""))
    return data


def readable_bytes() -> int | None:
    """The bytes a read may still take in this process: the smaller of the machine's
    MemAvailable and what the address-space limit (``ulimit -v``) leaves; None where
    neither is known (not Linux)."""
    import resource

    limits = []
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    limits.append(int(line.split()[1]) << 10)
                    break
    except (OSError, ValueError, IndexError):
        pass
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/status", "rb") as fh:
                used = next(int(ln.split()[1]) << 10 for ln in fh if ln.startswith(b"VmSize:"))
            limits.append(max(0, soft - used))
        except (OSError, ValueError, IndexError, StopIteration):
            pass
    return min(limits) if limits else None


def check_room(path: str | None, needed: int, what: str) -> None:
    """FormatError when reading `what` of `path` (`needed` bytes in memory) would take more
    than :func:`readable_bytes` leaves."""
    room = readable_bytes()
    if room is not None and needed > room:
        raise FormatError(
            path,
            None,
            f"{what}: about {_gib(needed)} in memory, more than this process may still take "
            f"({_gib(room)})",
        )


def _gib(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} bytes"
