"""One runner per sweep: an exclusive advisory lock held for the life of a run.

The lock is ``fcntl.flock`` on a small file in the folder every runner of the sweep looks
at: ``.lock`` in the sweep folder, and ``.<name>.lock`` in the configuration's output folder
(one runner per configuration and output, whatever ``$TMPDIR`` each runner has). The file
records who holds it (pid, host, start time, command) so that a refusal can name the other
process, and a heartbeat the holder refreshes every :data:`HEARTBEAT_S` seconds. The kernel
releases a flock when its holder dies, so a lock left by a killed sweep is taken over; the
recorded pid and host say when that happened.

The sweep folder's lock also keeps its record in ``.state/runner.json``, which outlives a
deleted ``.lock``: a runner whose record there is alive (its pid on this host, started when
recorded; on another host, a heartbeat younger than :data:`STALE_S`) is never taken over,
even when its lock file is gone. Where the filesystem has no flock (some network
filesystems), the recorded holder decides the same way.

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
import time
from pathlib import Path
from typing import Any

from bmoe.errors import BmoeError
from bmoe.formats.archive import STATE

LOCK_FILE = ".lock"
#: The sweep folder's second record of its runner (kept when ``.lock`` is deleted).
WITNESS_FILE = Path(STATE) / "runner.json"
#: Seconds between the holder's heartbeats, and the age past which a holder on another host
#: whose heartbeat stopped counts as gone.
HEARTBEAT_S = 10.0
STALE_S = 60.0

_held: dict[str, tuple[int, int, Any]] = {}  # resolved path -> (fd, depth, heartbeat)
_held_lock = threading.RLock()  # re-entered when a removed lock file is opened anew


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


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, from /proc; None where unknown):
    with the pid, it tells a live holder from a later process given the same pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the recorded holder may still run: on this host, its pid exists (and started
    when recorded); on another host, its heartbeat is younger than :data:`STALE_S` (a record
    without one: assume it runs)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if holder.get("host") != socket.gethostname():
        beat = holder.get("heartbeat")
        if isinstance(beat, int | float) and not isinstance(beat, bool):
            return time.time() - beat < STALE_S
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except (OverflowError, OSError):
        return False
    started = holder.get("pid_start")
    return not isinstance(started, int) or _start_ticks(pid) in (None, started)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            holder = json.loads(fh.read(1 << 16).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (not removed or replaced)."""
    try:
        here, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def _mine(holder: dict[str, Any]) -> bool:
    return holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()


class SweepLock:
    """The exclusive lock of `path` (use as a context manager, or acquire / release).

    `what` names the locked thing in the refusal ("sweep folder X", "sweep 'name'").
    `witness`, when given, is a second record of the holder that outlives the lock file.
    After :meth:`acquire`, :attr:`stale` is the record of an earlier holder that was gone.
    """

    def __init__(self, path: Path, what: str, witness: Path | None = None, remove: bool = False):
        self.path = Path(path)
        self.what = what
        self.witness = witness
        self.remove = remove  # the lock file goes with its release (none left behind)
        self.stale: dict[str, Any] | None = None
        self._key: str | None = None

    def _busy(self, holder: dict[str, Any], hint: str = "") -> SweepBusy:
        return SweepBusy(
            f"{self.what} is in use by {_holder_text(holder)}; wait for it to end or stop it" + hint
        )

    def acquire(self) -> SweepLock:
        import fcntl

        key = str(self.path.resolve())
        with _held_lock:
            if key in _held:
                held = _held[key]
                _held[key] = (held[0], held[1] + 1, *held[2:])
                self._key = key
                return self
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                problem = exc.strerror or exc
                raise BmoeError(f"{self.path}: cannot create the lock file: {problem}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if self.remove and not _names(self.path, fd):
                    # its holder removed it as we opened it: take the file there now instead
                    os.close(fd)
                    return self.acquire()
                earlier = _read_holder(fd)
                self.stale = earlier or None
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise self._busy(holder) from None
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise BmoeError(f"{self.path}: cannot lock: {exc.strerror}") from None
                holder = _read_holder(fd)  # no flock here: the record decides
                if holder and not _mine(holder) and _alive(holder):
                    os.close(fd)
                    raise self._busy(holder, f" (if it is gone, remove {self.path})") from None
                self.stale = holder or None
            if self.witness is not None:  # the record that outlives a deleted lock file
                holder = _read_json(self.witness)
                if holder and not _mine(holder) and _alive(holder):
                    os.close(fd)
                    raise self._busy(holder, f" (its record: {self.witness})") from None
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": dt.datetime.now(dt.UTC).astimezone().isoformat(timespec="seconds"),
                "command": _command_line(),
                "pid_start": _start_ticks(os.getpid()),
            }
            beat = _Heartbeat(fd, record, self.witness)
            beat.beat()
            beat.start()
            _held[key] = (fd, 1, beat)
            self._key = key
        return self

    def release(self) -> None:
        if self._key is None:
            return
        with _held_lock:
            fd, depth, beat = _held[self._key]
            if depth > 1:
                _held[self._key] = (fd, depth - 1, beat)
            else:
                del _held[self._key]
                beat.stop()
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)  # nobody holds it: no record to mislead
                    if self.remove and _names(self.path, fd):
                        self.path.unlink()  # still locked: a newcomer waits on a new file
                os.close(fd)  # closing releases the flock
        self._key = None

    def __enter__(self) -> SweepLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Heartbeat:
    """The holder's record, rewritten every :data:`HEARTBEAT_S` seconds with the time (in the
    lock file and the witness) until :meth:`stop`, which removes the witness."""

    def __init__(self, fd: int, record: dict[str, Any], witness: Path | None):
        self.fd = fd
        self.record = record
        self.witness = witness
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bmoe-lock-heartbeat", daemon=True)

    def beat(self) -> None:
        self.record["heartbeat"] = round(time.time(), 3)
        line = (json.dumps(self.record) + "\n").encode("utf-8")
        with contextlib.suppress(OSError):  # a full disk: the flock still holds
            os.pwrite(self.fd, line, 0)
            os.ftruncate(self.fd, len(line))
        if self.witness is not None:
            tmp = self.witness.with_name(f"{self.witness.name}.tmp-{os.getpid()}")
            try:
                self.witness.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(line)
                os.replace(tmp, self.witness)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.beat()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.witness is not None and _mine(_read_json(self.witness)):
            with contextlib.suppress(OSError):
                self.witness.unlink()


def folder_lock(root: Path) -> SweepLock:
    """The lock of one sweep folder (``<folder>/.lock``, witnessed by
    ``<folder>/.state/runner.json``)."""
    return SweepLock(Path(root) / LOCK_FILE, f"sweep folder {root}", Path(root) / WITNESS_FILE)


def name_lock(output: Path, name: str) -> SweepLock:
    """The lock of a sweep by name under an output folder: two runs of one configuration at
    once would measure each other. Kept in the output folder (``.<name>.lock``, created with
    it), where every runner of that configuration looks, while it is held: the folder holds
    sweep folders only once the runner is done."""
    folder = Path(output).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BmoeError(f"{folder}: cannot create the output folder: {exc.strerror}") from None
    return SweepLock(folder / f".{name}.lock", f"sweep {name!r} under {output}", remove=True)
