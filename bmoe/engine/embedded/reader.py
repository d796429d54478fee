"""Read lanes: ``pread`` of expert slices from the GGUF into the arena, O_DIRECT when possible.

``--io-threads`` lanes pull read jobs from one priority queue, demand reads (the experts the
current layer needs) ahead of speculative ones (``--prefetch``), so prefetch only uses lanes
demand leaves idle. Under O_DIRECT the file offset, length and buffer must be aligned, so a
slice is read as the aligned window around it (``read_bytes`` >= ``req_bytes``); the arena keeps
file offsets and addresses congruent so that window lands in place. When the file system
refuses O_DIRECT the reader falls back to buffered reads of the exact slice, and says so
(:attr:`ExpertReader.o_direct`). A split model is one reader over all its shards: each job names
the shard its slice lives in.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bmoe.engine.embedded import libc

ALIGN = 4096


@dataclass(frozen=True)
class SliceTable:
    """Where one projection tensor of a layer reads from and to: expert 0's slice (expert
    ``e`` adds ``e * slice_bytes`` to the file offset and to the arena address)."""

    layer: int
    proj: int
    shard: int
    offset: int
    slice_bytes: int
    data: int


@dataclass(frozen=True, slots=True)
class ReadJob:
    """One projection slice of one expert."""

    layer: int
    expert: int
    proj: int
    offset: int  # file offset of the slice
    req_bytes: int
    dst: int  # arena address of the slice
    spec: bool
    shard: int = 0  # which of the reader's files holds the slice


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """What one read did (an io-trace row without the turn/phase/step stamp)."""

    layer: int
    expert: int
    proj: int
    lane: int
    spec: bool
    offset: int
    req_bytes: int
    read_bytes: int
    latency_ns: int
    start_ns: int


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """What the lanes did since the last drain: the bytes read (all of them, and of which
    speculative) and the per-read records (every read; only when tracing in C)."""

    records: list[ReadRecord]
    read_bytes: int
    spec_bytes: int


class Ticket:
    """Completion of a group of reads."""

    __slots__ = ("_event", "_left", "_lock", "error")

    def __init__(self, n: int):
        self._left = n
        self._lock = threading.Lock()
        self._event = threading.Event()
        self.error: BaseException | None = None
        if n == 0:
            self._event.set()

    def done(self, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            self._left -= 1
            if self._left == 0:
                self._event.set()

    @property
    def finished(self) -> bool:
        return self._event.is_set()

    def wait(self) -> None:
        self._event.wait()
        if self.error is not None:
            raise self.error


class Completion(Protocol):
    """A submission's reads: done or not, and a wait that raises a failed read's error."""

    @property
    def finished(self) -> bool: ...

    def wait(self) -> None: ...


class Reader(Protocol):
    """What the streamer needs of read lanes (the Python ones here, or the C ones)."""

    trace: bool

    @property
    def o_direct(self) -> bool: ...

    def set_slices(self, tables: Sequence[SliceTable]) -> None: ...

    def submit_experts(
        self, layer: int, experts: list[int], *, spec: bool = False
    ) -> Completion: ...

    def drain(self) -> ReadBatch: ...

    def close(self) -> None: ...


class ExpertReader:
    """``lanes`` reader threads over one model's files; jobs in, :class:`ReadRecord` out."""

    def __init__(
        self,
        paths: str | list[str],
        lanes: int,
        *,
        o_direct: bool = True,
        clock_origin_ns: int | None = None,
        after_read: Callable[[ReadJob], None] | None = None,
    ):
        self.paths = [paths] if isinstance(paths, str) else list(paths)
        self.lanes = max(1, int(lanes))
        self.fds = [os.open(path, os.O_RDONLY) for path in self.paths]
        self.file_sizes = [os.fstat(fd).st_size for fd in self.fds]
        self.direct_fds: list[int] | None = None
        if o_direct:
            direct = [open_direct(path) for path in self.paths]
            if all(fd is not None for fd in direct):
                self.direct_fds = [fd for fd in direct if fd is not None]
            else:  # one file refusing O_DIRECT makes every read buffered, as the flag says
                for fd in direct:
                    if fd is not None:
                        os.close(fd)
        self.origin_ns = time.monotonic_ns() if clock_origin_ns is None else clock_origin_ns
        self.trace = True  # every read is recorded (the records cost little here)
        self._tables: dict[int, list[SliceTable]] = {}
        self.after_read = after_read
        self._records: deque[ReadRecord] = deque()
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads = [
            threading.Thread(target=self._lane, args=(i,), name=f"bmoe-io-{i}", daemon=True)
            for i in range(self.lanes)
        ]
        for t in self._threads:
            t.start()

    @property
    def o_direct(self) -> bool:
        """Reads bypass the page cache (what was achieved, not what was asked)."""
        return self.direct_fds is not None

    def submit(self, jobs: list[ReadJob], *, spec: bool = False) -> Ticket:
        """Queue `jobs`; demand jobs go ahead of speculative ones."""
        ticket = Ticket(len(jobs))
        prio = 1 if spec else 0
        put = self._queue.put
        seq = self._seq
        for job in jobs:
            put((prio, next(seq), job, ticket))
        return ticket

    def set_slices(self, tables: Sequence[SliceTable]) -> None:
        """Register every projection tensor, for :meth:`submit_experts`."""
        by_layer: dict[int, list[SliceTable]] = {}
        for t in sorted(tables, key=lambda t: (t.layer, t.proj)):
            by_layer.setdefault(t.layer, []).append(t)
        self._tables = by_layer

    def submit_experts(self, layer: int, experts: list[int], *, spec: bool = False) -> Ticket:
        """Queue every projection of `experts` of `layer`; demand ahead of speculative."""
        jobs = [
            ReadJob(
                layer,
                e,
                t.proj,
                t.offset + e * t.slice_bytes,
                t.slice_bytes,
                t.data + e * t.slice_bytes,
                spec,
                t.shard,
            )
            for e in experts
            for t in self._tables.get(layer, ())
        ]
        return self.submit(jobs, spec=spec)

    def drain(self) -> ReadBatch:
        """The reads finished since the last drain."""
        records = self._records
        done = [records.popleft() for _ in range(len(records))]
        read = sum(r.read_bytes for r in done)
        spec = sum(r.read_bytes for r in done if r.spec)
        return ReadBatch(done, read, spec)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put((2, next(self._seq), None, None))
        for t in self._threads:
            t.join(timeout=5)
        for fd in self.fds + (self.direct_fds or []):
            os.close(fd)

    # -- lanes --------------------------------------------------------------------------
    def _lane(self, lane: int) -> None:
        get = self._queue.get
        records = self._records
        while True:
            _prio, _seq, job, ticket = get()
            if job is None:
                return
            try:
                start = time.monotonic_ns()
                read = self._read(job)
                end = time.monotonic_ns()
                if self.after_read is not None:
                    self.after_read(job)
                records.append(
                    ReadRecord(
                        job.layer,
                        job.expert,
                        job.proj,
                        lane,
                        job.spec,
                        job.offset,
                        job.req_bytes,
                        read,
                        end - start,
                        start - self.origin_ns,
                    )
                )
                ticket.done()
            except BaseException as exc:  # handed to whoever waits on the ticket
                ticket.done(exc)

    def _read(self, job: ReadJob) -> int:
        path = self.paths[job.shard]
        if self.direct_fds is not None:
            start = libc.align_down(job.offset, ALIGN)
            end = min(
                libc.align_up(job.offset + job.req_bytes, ALIGN),
                libc.align_up(self.file_sizes[job.shard], ALIGN),
            )
            dst = job.dst - (job.offset - start)
            need = job.offset + job.req_bytes - start
            got = _pread_into(self.direct_fds[job.shard], dst, end - start, start)
            if got < need:
                raise OSError(f"short read of {path} at {job.offset}: {got} of {need} bytes")
            return end - start
        got = 0
        fd = self.fds[job.shard]
        while got < job.req_bytes:
            n = _pread_into(fd, job.dst + got, job.req_bytes - got, job.offset + got)
            if n <= 0:
                raise OSError(f"short read of {path} at {job.offset + got}")
            got += n
        return got


def _pread_into(fd: int, address: int, nbytes: int, offset: int) -> int:
    view = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")
    return os.preadv(fd, [view], offset)


def open_direct(path: str) -> int | None:
    """An O_DIRECT descriptor of `path` that served an aligned test read, or None."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None
    buf = libc.reserve(ALIGN)
    try:
        if _pread_into(fd, buf, ALIGN, 0) <= 0:
            raise OSError("empty read")
    except OSError:
        os.close(fd)
        return None
    finally:
        libc.unmap(buf, ALIGN)
    return fd
