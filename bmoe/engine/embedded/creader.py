"""Read lanes in C: the expert reads without the interpreter.

The Python lanes (:class:`~bmoe.engine.embedded.reader.ExpertReader`) take the interpreter
lock around every read (queueing, the ``pread`` wrapper, the record), so on a busy machine a
read waits for the lock as well as for the disk, and each costs tens of microseconds of Python.
This reader does the same work in POSIX threads of a small C library, compiled once with the
system compiler like the eval filter: the layers' expert tensors are registered once (shard,
file offset, slice size, arena address), a layer's misses are submitted as expert ids in one
call, and a wait runs in C with the interpreter lock released: the waiting thread reads queued
slices itself (it is lane 0, as the native engine's eval thread is; ``--io-threads N`` starts
N - 1 threads), so a layer that misses one expert reads it without waking anyone, and blocks
only once nothing is left to read. It keeps the Python reader's
semantics: demand reads ahead of speculative ones, O_DIRECT reads of the aligned window around
a slice, the byte counts, and per-read records when the io trace is on. A buffered read first
makes the slice's pages present in one call (``MADV_POPULATE_WRITE``, Linux 5.14 and later)
rather than taking a page fault for each page as the copy reaches it: the same pages, about a
tenth less CPU a read.

``BMOE_C_READER=0`` (or no C compiler) keeps the Python lanes; so does a run that injects a
fault after each read (the tests' corruption check), which needs a Python callback per read.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from bmoe.engine.embedded import evalfilter
from bmoe.engine.embedded.reader import (
    ALIGN,
    ExpertReader,
    ReadBatch,
    Reader,
    ReadJob,
    ReadRecord,
    SliceTable,
    open_direct,
)

_SOURCE = r"""
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define TICKETS 65536
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

typedef struct {
    int64_t offset;      /* file offset of expert 0's slice */
    int64_t slice_bytes;
    int64_t data;        /* arena address of expert 0's slice */
    int32_t shard;
    int32_t proj;
} block_t;

typedef struct {
    int32_t layer, expert, proj, lane, spec, pad;
    int64_t offset, req_bytes, read_bytes, latency_ns, start_ns;
} record_t;

typedef struct { int32_t block, expert, layer, spec; int64_t ticket; } job_t;

typedef struct { job_t *jobs; int64_t head, tail, cap; } queue_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t *threads;
    int lanes, stop, direct, trace, populate;
    int32_t *fds, *dfds;
    int64_t *sizes;
    block_t *blocks;
    int32_t *first, *count; /* per layer: its blocks */
    int n_layers;
    queue_t demand, spec;
    int32_t remaining[TICKETS];
    int32_t error[TICKETS];
    int64_t next_ticket;
    record_t *records;
    int64_t n_records, cap_records;
    int64_t bytes, spec_bytes, origin_ns;
} reader_t;

typedef struct { reader_t *r; int lane; } lane_arg_t;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int push(queue_t *q, job_t j) {
    if (q->tail - q->head == q->cap) {
        int64_t cap = q->cap ? q->cap * 2 : 1024;
        job_t *grown = malloc(sizeof(job_t) * cap);
        if (!grown) return -1;
        for (int64_t i = q->head; i < q->tail; i++) grown[i - q->head] = q->jobs[i % q->cap];
        free(q->jobs);
        q->jobs = grown;
        q->tail -= q->head;
        q->head = 0;
        q->cap = cap;
    }
    q->jobs[q->tail % q->cap] = j;
    q->tail++;
    return 0;
}

/* one slice: the aligned window with O_DIRECT, the exact bytes otherwise; bytes read or -errno */
static int64_t read_slice(reader_t *r, const block_t *b, int expert) {
    int64_t off = b->offset + (int64_t) expert * b->slice_bytes;
    int64_t len = b->slice_bytes;
    char *dst = (char *) (intptr_t) (b->data + (int64_t) expert * b->slice_bytes);
    if (r->direct) {
        int64_t a = ALIGN;
        int64_t start = off - off % a;
        int64_t end = (off + len + a - 1) / a * a;
        int64_t limit = (r->sizes[b->shard] + a - 1) / a * a;
        if (end > limit) end = limit;
        int64_t need = off + len - start, got = 0;
        while (got < need) {
            ssize_t n = pread(r->dfds[b->shard], dst - (off - start) + got, end - start - got,
                              start + got);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return -errno;
            if (n == 0) return -EIO;
            got += n;
        }
        return end - start;
    }
    if (r->populate) {  /* the slice's pages made present in one call, not a fault a page */
        int64_t page = sysconf(_SC_PAGESIZE);
        int64_t lo = (int64_t) (intptr_t) dst / page * page;
        int64_t hi = ((int64_t) (intptr_t) dst + len + page - 1) / page * page;
        if (madvise((void *) (intptr_t) lo, (size_t) (hi - lo), MADV_POPULATE_WRITE) != 0 &&
            (errno == EINVAL || errno == ENOSYS))
            r->populate = 0;  /* a kernel before 5.14: the pread faults them in */
    }
    int64_t got = 0;
    while (got < len) {
        ssize_t n = pread(r->fds[b->shard], dst + got, len - got, off + got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        if (n == 0) return -EIO;
        got += n;
    }
    return got;
}

/* read job `j` (taken off its queue, lock not held) and account it (returns with the lock) */
static void run_job(reader_t *r, job_t j, int lane) {
    {
        const block_t *b = &r->blocks[j.block];
        int64_t t0 = now_ns();
        int64_t got = read_slice(r, b, j.expert);
        int64_t t1 = now_ns();
        pthread_mutex_lock(&r->mu);
        int slot = (int) (j.ticket % TICKETS);
        if (got < 0) {
            if (!r->error[slot]) r->error[slot] = (int32_t) -got;
        } else {
            if (j.spec) r->spec_bytes += got;
            r->bytes += got;
            if (r->trace) {
                if (r->n_records == r->cap_records) {
                    int64_t cap = r->cap_records ? r->cap_records * 2 : 4096;
                    record_t *grown = realloc(r->records, sizeof(record_t) * cap);
                    if (grown) { r->records = grown; r->cap_records = cap; }
                }
                if (r->n_records < r->cap_records) {
                    record_t *rec = &r->records[r->n_records++];
                    rec->layer = j.layer; rec->expert = j.expert; rec->proj = b->proj;
                    rec->lane = lane; rec->spec = j.spec; rec->pad = 0;
                    rec->offset = b->offset + (int64_t) j.expert * b->slice_bytes;
                    rec->req_bytes = b->slice_bytes; rec->read_bytes = got;
                    rec->latency_ns = t1 - t0; rec->start_ns = t0 - r->origin_ns;
                }
            }
        }
        if (--r->remaining[slot] == 0) pthread_cond_broadcast(&r->done);
    }
}

static void *lane_main(void *p) {
    lane_arg_t *arg = p;
    reader_t *r = arg->r;
    int lane = arg->lane;
    free(arg);
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->demand.head == r->demand.tail && r->spec.head == r->spec.tail)
            pthread_cond_wait(&r->work, &r->mu);
        if (r->stop) break;
        queue_t *q = r->demand.head != r->demand.tail ? &r->demand : &r->spec;
        job_t j = q->jobs[q->head % q->cap];
        q->head++;
        pthread_mutex_unlock(&r->mu);
        run_job(r, j, lane);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

reader_t *bmoe_reader_new(int lanes, int n_shards, const int32_t *fds, const int32_t *dfds,
                          const int64_t *sizes, int direct, int64_t origin_ns) {
    reader_t *r = calloc(1, sizeof(reader_t));
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work, NULL);
    pthread_cond_init(&r->done, NULL);
    r->fds = malloc(sizeof(int32_t) * n_shards);
    r->dfds = malloc(sizeof(int32_t) * n_shards);
    r->sizes = malloc(sizeof(int64_t) * n_shards);
    memcpy(r->fds, fds, sizeof(int32_t) * n_shards);
    memcpy(r->dfds, dfds, sizeof(int32_t) * n_shards);
    memcpy(r->sizes, sizes, sizeof(int64_t) * n_shards);
    r->direct = direct;
    r->populate = 1;
    r->origin_ns = origin_ns;
    r->lanes = lanes;
    r->threads = calloc(lanes, sizeof(pthread_t));
    for (int i = 1; i < lanes; i++) {  /* lane 0 is the caller, reading while it waits */
        lane_arg_t *arg = malloc(sizeof(lane_arg_t));
        arg->r = r;
        arg->lane = i;
        pthread_create(&r->threads[i], NULL, lane_main, arg);
    }
    return r;
}

void bmoe_reader_blocks(reader_t *r, int n_layers, const int32_t *first, const int32_t *count,
                        int n_blocks, const block_t *blocks) {
    pthread_mutex_lock(&r->mu);
    free(r->first); free(r->count); free(r->blocks);
    r->first = malloc(sizeof(int32_t) * n_layers);
    r->count = malloc(sizeof(int32_t) * n_layers);
    r->blocks = malloc(sizeof(block_t) * (n_blocks ? n_blocks : 1));
    memcpy(r->first, first, sizeof(int32_t) * n_layers);
    memcpy(r->count, count, sizeof(int32_t) * n_layers);
    memcpy(r->blocks, blocks, sizeof(block_t) * n_blocks);
    r->n_layers = n_layers;
    pthread_mutex_unlock(&r->mu);
}

void bmoe_reader_trace(reader_t *r, int on) { r->trace = on; }

/* queue every projection of `n` experts of `layer`; the ticket, or -1 */
int64_t bmoe_reader_submit(reader_t *r, int layer, const int32_t *experts, int n, int spec) {
    pthread_mutex_lock(&r->mu);
    int64_t ticket = r->next_ticket++;
    int slot = (int) (ticket % TICKETS);
    int nb = layer < r->n_layers ? r->count[layer] : 0;
    r->remaining[slot] = nb * n;
    r->error[slot] = 0;
    queue_t *q = spec ? &r->spec : &r->demand;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nb; k++) {
            job_t j = {r->first[layer] + k, experts[i], layer, spec, ticket};
            if (push(q, j)) { r->error[slot] = ENOMEM; r->remaining[slot]--; }
        }
    /* wake a worker for every job beyond the one the caller reads when it waits (a demand
       submission is waited for at once; a speculative one is the workers' alone), once the
       lock is let go: a lane woken under it would only block on it again */
    int wake = r->remaining[slot] - (spec ? 0 : 1);
    int none = !r->remaining[slot];
    pthread_mutex_unlock(&r->mu);
    if (none) pthread_cond_broadcast(&r->done);
    else if (wake >= r->lanes - 1) pthread_cond_broadcast(&r->work);
    else for (int i = 0; i < wake; i++) pthread_cond_signal(&r->work);
    return ticket;
}

/* give back the whole pages inside every projection's slice of `n` (layer, expert) pairs
   (layers numbered as registered); the bytes released, or -errno */
int64_t bmoe_reader_release(reader_t *r, int n, const int32_t *layers, const int32_t *experts) {
    int64_t page = sysconf(_SC_PAGESIZE), released = 0;
    for (int i = 0; i < n; i++) {
        int layer = layers[i];
        if (layer < 0 || layer >= r->n_layers) continue;
        for (int k = 0; k < r->count[layer]; k++) {
            const block_t *b = &r->blocks[r->first[layer] + k];
            int64_t addr = b->data + (int64_t) experts[i] * b->slice_bytes;
            int64_t start = (addr + page - 1) / page * page;
            int64_t end = (addr + b->slice_bytes) / page * page;
            if (end <= start) continue;
            if (madvise((void *) (intptr_t) start, (size_t) (end - start), MADV_DONTNEED) != 0)
                return -errno;
            released += end - start;
        }
    }
    return released;
}

int bmoe_reader_wait(reader_t *r, int64_t ticket);

/* a routing step's reads in one call: the demand reads of `n` experts of `layer` queued and
   waited for (the caller reading as lane 0), then the pages of `nv` victims given back, as the
   native engine evicts (after the reads: no page release, and no TLB flush it sends to the
   lanes' cores, while they read); with `release_first`, before the reads (a wide step, whose
   reads would otherwise sit in memory beside its victims). 0, else the errno of the first
   failed read; out[0]: the bytes released, or -errno of a failed release; out[1]: the ns the
   release took (cache management, apart from the reads) */
int bmoe_reader_load(reader_t *r, int layer, const int32_t *experts, int n, int nv,
                     const int32_t *vlayers, const int32_t *vexperts, int release_first,
                     int64_t *out) {
    int64_t t0 = now_ns();
    out[0] = out[1] = 0;
    if (release_first && nv > 0) {
        out[0] = bmoe_reader_release(r, nv, vlayers, vexperts);
        out[1] = now_ns() - t0;
    }
    if (out[0] < 0) return 0;
    int64_t ticket = n > 0 ? bmoe_reader_submit(r, layer, experts, n, 0) : -1;
    int err = ticket < 0 ? 0 : bmoe_reader_wait(r, ticket);
    if (!release_first && nv > 0) {
        t0 = now_ns();
        out[0] = bmoe_reader_release(r, nv, vlayers, vexperts);
        out[1] = now_ns() - t0;
    }
    return err;
}

/* 0 once the ticket's reads are done without error, else the errno of the first failure;
   the caller reads queued jobs (demand first) as lane 0 while it waits */
int bmoe_reader_wait(reader_t *r, int64_t ticket) {
    int slot = (int) (ticket % TICKETS);
    pthread_mutex_lock(&r->mu);
    while (r->remaining[slot] > 0) {
        queue_t *q = r->demand.head != r->demand.tail ? &r->demand
                     : r->spec.head != r->spec.tail ? &r->spec : NULL;
        if (q == NULL) {
            pthread_cond_wait(&r->done, &r->mu);
            continue;
        }
        job_t j = q->jobs[q->head % q->cap];
        q->head++;
        pthread_mutex_unlock(&r->mu);
        run_job(r, j, 0);  /* returns with the lock held */
    }
    int err = r->error[slot];
    pthread_mutex_unlock(&r->mu);
    return err;
}

int bmoe_reader_pending(reader_t *r, int64_t ticket) {
    pthread_mutex_lock(&r->mu);
    int left = r->remaining[ticket % TICKETS];
    pthread_mutex_unlock(&r->mu);
    return left;
}

/* the bytes read since the last call (all, speculative), and up to `cap` records */
int64_t bmoe_reader_drain(reader_t *r, int64_t *bytes, record_t *out, int64_t cap) {
    pthread_mutex_lock(&r->mu);
    bytes[0] = r->bytes;
    bytes[1] = r->spec_bytes;
    r->bytes = r->spec_bytes = 0;
    int64_t n = r->n_records < cap ? r->n_records : cap;
    memcpy(out, r->records, sizeof(record_t) * n);
    memmove(r->records, r->records + n, sizeof(record_t) * (r->n_records - n));
    r->n_records -= n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

int64_t bmoe_reader_n_records(reader_t *r) { return r->n_records; }

void bmoe_reader_free(reader_t *r) {
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->work);
    pthread_mutex_unlock(&r->mu);
    for (int i = 1; i < r->lanes; i++) pthread_join(r->threads[i], NULL);
    free(r->threads); free(r->fds); free(r->dfds); free(r->sizes);
    free(r->first); free(r->count); free(r->blocks);
    free(r->demand.jobs); free(r->spec.jobs); free(r->records);
    free(r);
}
""".replace("ALIGN", str(ALIGN))


class _Block(ctypes.Structure):
    _fields_ = [
        ("offset", ctypes.c_int64),
        ("slice_bytes", ctypes.c_int64),
        ("data", ctypes.c_int64),
        ("shard", ctypes.c_int32),
        ("proj", ctypes.c_int32),
    ]


RECORD = np.dtype(
    [
        ("layer", np.int32),
        ("expert", np.int32),
        ("proj", np.int32),
        ("lane", np.int32),
        ("spec", np.int32),
        ("pad", np.int32),
        ("offset", np.int64),
        ("req_bytes", np.int64),
        ("read_bytes", np.int64),
        ("latency_ns", np.int64),
        ("start_ns", np.int64),
    ]
)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled reader library, or None (no compiler, or ``BMOE_C_READER=0``)."""
    if os.environ.get("BMOE_C_READER", "1") in ("0", "", "off", "no"):
        return None
    lib = evalfilter.build_library("reader", _SOURCE, ("-pthread",))
    if lib is None:
        return None
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    ip32, ip64 = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)
    lib.bmoe_reader_new.restype = p
    lib.bmoe_reader_new.argtypes = [ctypes.c_int, ctypes.c_int, ip32, ip32, ip64, ctypes.c_int, i64]
    lib.bmoe_reader_blocks.argtypes = [p, ctypes.c_int, ip32, ip32, ctypes.c_int, p]
    lib.bmoe_reader_trace.argtypes = [p, ctypes.c_int]
    lib.bmoe_reader_submit.restype = i64
    lib.bmoe_reader_submit.argtypes = [p, ctypes.c_int, ip32, ctypes.c_int, ctypes.c_int]
    lib.bmoe_reader_wait.restype = ctypes.c_int
    lib.bmoe_reader_wait.argtypes = [p, i64]
    lib.bmoe_reader_pending.restype = ctypes.c_int
    lib.bmoe_reader_pending.argtypes = [p, i64]
    lib.bmoe_reader_drain.restype = i64
    lib.bmoe_reader_drain.argtypes = [p, ip64, p, i64]
    lib.bmoe_reader_n_records.restype = i64
    lib.bmoe_reader_n_records.argtypes = [p]
    lib.bmoe_reader_free.argtypes = [p]
    lib.bmoe_reader_release.restype = i64
    lib.bmoe_reader_release.argtypes = [p, ctypes.c_int, ip32, ip32]
    lib.bmoe_reader_load.restype = ctypes.c_int
    lib.bmoe_reader_load.argtypes = [p, ctypes.c_int, ip32, ctypes.c_int, ctypes.c_int, ip32,
                                     ip32, ctypes.c_int, ip64]  # fmt: skip
    del i32
    return lib


class CTicket:
    """Completion of one submission's reads."""

    __slots__ = ("_id", "_lib", "_path", "_reader")

    def __init__(self, lib: ctypes.CDLL, reader: int, ticket: int, path: str):
        self._lib, self._reader, self._id, self._path = lib, reader, ticket, path

    @property
    def finished(self) -> bool:
        return self._lib.bmoe_reader_pending(self._reader, self._id) == 0

    def wait(self) -> None:
        err = self._lib.bmoe_reader_wait(self._reader, self._id)
        if err:
            raise OSError(err, f"expert read of {self._path} failed: {os.strerror(err)}")


class CExpertReader:
    """``lanes`` read lanes of the registered slices (see the module docstring): lane 0 is the
    thread that waits, reading queued slices itself until its own are done, as the native
    engine's eval thread does; lanes 1.. are POSIX threads."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        paths: str | list[str],
        lanes: int,
        *,
        o_direct: bool = True,
        clock_origin_ns: int | None = None,
    ):
        self.lib = lib
        self.paths = [paths] if isinstance(paths, str) else list(paths)
        self.lanes = max(1, int(lanes))
        self.fds = [os.open(path, os.O_RDONLY) for path in self.paths]
        sizes = [os.fstat(fd).st_size for fd in self.fds]
        self.direct_fds: list[int] | None = None
        if o_direct:
            direct = [open_direct(path) for path in self.paths]
            if all(fd is not None for fd in direct):
                self.direct_fds = [fd for fd in direct if fd is not None]
            else:
                for fd in direct:
                    if fd is not None:
                        os.close(fd)
        n = len(self.paths)
        fds = (ctypes.c_int32 * n)(*self.fds)
        dfds = (ctypes.c_int32 * n)(*(self.direct_fds or self.fds))
        size_arr = (ctypes.c_int64 * n)(*sizes)
        origin = time.monotonic_ns() if clock_origin_ns is None else clock_origin_ns
        self._r = lib.bmoe_reader_new(
            self.lanes, n, fds, dfds, size_arr, int(self.direct_fds is not None), origin
        )
        if not self._r:
            raise OSError("could not start the read lanes")
        self._trace = False
        self._layer_slot: dict[int, int] = {}
        self._slot_layer: list[int] = []

    @property
    def o_direct(self) -> bool:
        return self.direct_fds is not None

    @property
    def trace(self) -> bool:
        return self._trace

    @trace.setter
    def trace(self, on: bool) -> None:
        self._trace = bool(on)
        self.lib.bmoe_reader_trace(self._r, int(on))

    def set_slices(self, tables: Sequence[SliceTable]) -> None:
        """Register every projection tensor (layers in any order)."""
        layers = sorted({t.layer for t in tables})
        self._layer_slot = {il: i for i, il in enumerate(layers)}
        self._slot_layer = layers  # the C side numbers the layers 0..n-1
        ordered = sorted(tables, key=lambda t: (t.layer, t.proj))
        blocks = (_Block * max(1, len(ordered)))()
        first = (ctypes.c_int32 * max(1, len(layers)))()
        count = (ctypes.c_int32 * max(1, len(layers)))()
        for i, t in enumerate(ordered):
            blocks[i] = _Block(t.offset, t.slice_bytes, t.data, t.shard, t.proj)
            slot = self._layer_slot[t.layer]
            if count[slot] == 0:
                first[slot] = i
            count[slot] += 1
        self.lib.bmoe_reader_blocks(
            self._r, len(layers), first, count, len(ordered), ctypes.addressof(blocks)
        )

    def submit_experts(self, layer: int, experts: list[int], *, spec: bool = False) -> CTicket:
        """Queue every projection of `experts` of `layer`; demand ahead of speculative."""
        ids = (ctypes.c_int32 * max(1, len(experts)))(*experts)
        ticket = self.lib.bmoe_reader_submit(
            self._r, self._layer_slot[layer], ids, len(experts), int(spec)
        )
        return CTicket(self.lib, self._r, ticket, self.paths[0])

    def load(
        self,
        layer: int,
        experts: list[int],
        victims: list[tuple[int, int]],
        release_first: bool = False,
    ) -> int:
        """A routing step's demand reads of `experts` of `layer` in one call, waited for, then
        the pages of `victims` ((layer, expert) pairs, none of them being read) given back
        (with `release_first`, before the reads): what :meth:`submit_experts`, the wait and
        the arena's release of each victim do, without coming back to Python in between.
        Returns the ns the release took."""
        n, nv = len(experts), len(victims)
        slot = self._layer_slot
        ids = (ctypes.c_int32 * max(1, n))(*experts)
        vlayers = (ctypes.c_int32 * max(1, nv))(*[slot.get(v[0], -1) for v in victims])
        vexperts = (ctypes.c_int32 * max(1, nv))(*[v[1] for v in victims])
        out = (ctypes.c_int64 * 2)()
        err = self.lib.bmoe_reader_load(
            self._r,
            slot[layer],
            ids,
            n,
            nv,
            vlayers,
            vexperts,
            int(release_first),
            out,
        )
        if out[0] < 0:
            code = -out[0]
            raise OSError(code, f"madvise(MADV_DONTNEED) failed: {os.strerror(code)}")
        if err:
            raise OSError(err, f"expert read of {self.paths[0]} failed: {os.strerror(err)}")
        return int(out[1])

    def drain(self) -> ReadBatch:
        """The bytes read since the last drain, and the records when tracing."""
        totals = (ctypes.c_int64 * 2)()
        n = int(self.lib.bmoe_reader_n_records(self._r)) if self._trace else 0
        out = np.zeros(max(n, 1), dtype=RECORD)
        got = self.lib.bmoe_reader_drain(self._r, totals, out.ctypes.data, n)
        records = [
            ReadRecord(
                self._slot_layer[int(r["layer"])],
                int(r["expert"]),
                int(r["proj"]),
                int(r["lane"]),
                bool(r["spec"]),
                int(r["offset"]),
                int(r["req_bytes"]),
                int(r["read_bytes"]),
                int(r["latency_ns"]),
                int(r["start_ns"]),
            )
            for r in out[:got]
        ]
        return ReadBatch(records, int(totals[0]), int(totals[1]))

    def close(self) -> None:
        if self._r:
            self.lib.bmoe_reader_free(self._r)
            self._r = None
        for fd in self.fds + (self.direct_fds or []):
            os.close(fd)


def make_reader(
    paths: str | list[str],
    lanes: int,
    *,
    o_direct: bool = True,
    clock_origin_ns: int | None = None,
    after_read: Callable[[ReadJob], None] | None = None,
) -> Reader:
    """The C lanes (:mod:`bmoe.engine.embedded.creader`) where they compiled and no
    per-read Python callback is asked for; else the Python lanes. Both take
    :meth:`~bmoe.engine.embedded.reader.Reader.set_slices`, ``submit_experts`` and
    ``drain``."""
    if after_read is None:
        lib = load()
        if lib is not None:
            return CExpertReader(
                lib, paths, lanes, o_direct=o_direct, clock_origin_ns=clock_origin_ns
            )
    return ExpertReader(
        paths, lanes, o_direct=o_direct, clock_origin_ns=clock_origin_ns, after_read=after_read
    )


__all__ = ["RECORD", "CExpertReader", "CTicket", "SliceTable", "load", "make_reader"]
