"""One runner per sweep folder: an exclusive advisory lock held for the life of a run.

The lock is ``fcntl.flock`` on a small file (``.lock`` in the sweep folder, or one per sweep
name and output folder in the temporary folder); the file records who holds it (pid, host,
start time, command) so that a refusal can name the other process. The kernel releases a
flock when its holder dies, so a lock left by a killed sweep is simply taken over; the
recorded pid and host say when that happened. Where the filesystem has no flock (some
network filesystems), the recorded pid and host decide: a live process on this host, or any
process on another host, holds the folder.

Taking a lock this process already holds is a no-op (the CLI takes it before it writes the
folder, :func:`bmoe.sweep.runner.run_sweep` again for callers of the library).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError

LOCK_FILE = ".lock"

_held: dict[str, tuple[int, int]] = {}  # resolved path -> (fd, depth)
_held_lock = threading.Lock()


class SweepBusy(BmoeError):
    """The sweep folder (or the sweep) is being run by another process."""


def _holder_text(holder: dict[str, Any]) -> str:
    parts = [f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"]
    if holder.get("started"):
        parts.append(f"since {holder['started']}")
    if holder.get("command"):
        parts.append(f"({holder['command']})")
    return " ".join(parts)


def _command_line() -> str:
    """This process's command line, program by its base name, cut to a readable length."""
    if not sys.argv:
        return ""
    program = os.path.basename(sys.argv[0])
    if program == "__main__.py":  # python -m bmoe
        program = os.path.basename(os.path.dirname(sys.argv[0])) or program
    argv = [program, *sys.argv[1:]]
    return " ".join(argv)[:300]


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 1 << 16)
        holder = json.loads(raw.decode("utf-8", "replace")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the recorded holder may still run (on another host: assume it does)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SweepLock:
    """The exclusive lock of `path` (use as a context manager, or acquire / release).

    `what` names the locked thing in the refusal ("sweep folder X", "sweep 'name'").
    After :meth:`acquire`, :attr:`stale` is the record of an earlier holder that was gone.
    """

    def __init__(self, path: Path, what: str):
        self.path = Path(path)
        self.what = what
        self.stale: dict[str, Any] | None = None
        self._key: str | None = None

    def acquire(self) -> SweepLock:
        import fcntl

        key = str(self.path.resolve())
        with _held_lock:
            if key in _held:
                fd, depth = _held[key]
                _held[key] = (fd, depth + 1)
                self._key = key
                return self
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                problem = exc.strerror or exc
                raise BmoeError(f"{self.path}: cannot create the lock file: {problem}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                earlier = _read_holder(fd)
                self.stale = earlier or None
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise SweepBusy(
                    f"{self.what} is in use by {_holder_text(holder)}; wait for it to end "
                    "or stop it"
                ) from None
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise BmoeError(f"{self.path}: cannot lock: {exc.strerror}") from None
                holder = _read_holder(fd)  # no flock here: the record decides
                if holder and holder.get("pid") != os.getpid() and _alive(holder):
                    os.close(fd)
                    raise SweepBusy(
                        f"{self.what} is in use by {_holder_text(holder)}; wait for it to end "
                        f"or stop it (if it is gone, remove {self.path})"
                    ) from None
                self.stale = holder or None
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="seconds"),
                "command": _command_line(),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
            _held[key] = (fd, 1)
            self._key = key
        return self

    def release(self) -> None:
        if self._key is None:
            return
        with _held_lock:
            fd, depth = _held[self._key]
            if depth > 1:
                _held[self._key] = (fd, depth - 1)
            else:
                del _held[self._key]
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)  # nobody holds it: no record to mislead
                os.close(fd)  # closing releases the flock
        self._key = None

    def __enter__(self) -> SweepLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def folder_lock(root: Path) -> SweepLock:
    """The lock of one sweep folder (``<folder>/.lock``)."""
    return SweepLock(Path(root) / LOCK_FILE, f"sweep folder {root}")


def name_lock(output: Path, name: str) -> SweepLock:
    """The lock of a sweep by name under an output folder on this host: two runs of one
    configuration at once would measure each other. Kept in the temporary folder (the
    output folder holds sweep folders only), keyed by the output's resolved path."""
    import hashlib
    import tempfile

    where = str(Path(output).expanduser().resolve())
    folder = Path(tempfile.gettempdir()) / f"bmoe-sweep-locks-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    key = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return SweepLock(folder / f"{name}-{key}.lock", f"sweep {name!r} under {output}")
