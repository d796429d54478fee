"""A C front for the eval callback: answers ggml's "do you want this node?" without Python.

ggml asks the eval callback about every node of the graph (hundreds per token); in Python each
answer costs a couple of microseconds, which on a small model is a visible share of a token.
For single-token decodes the answer only depends on the node's name, so this filter, compiled
once with the system C compiler into the user's cache folder, answers from a list of name
prefixes and calls Python only for the nodes it wants (when they are computed) and, when told
to pass through, for every question (prefill, traces, the warm-up's discovery).

It also takes the most common routing off Python: when told (``fast``), a computed
``ffn_moe_topk-<il>`` node of one token whose every routed expert is resident and readable
(a flag per expert that the streamer keeps) is written to a log and the graph goes on; the
hook hands the log to the cache after the decode, in order, so the cache's state and counts are
those of routing in Python. As it logs, the filter also keeps what that hand-over needs (the
keys staged, in order, and the counts: lookups, slots, drops, demand bytes), so the hand-over
is one call for the whole log rather than a step per layer in Python. With dropping on, the
drop is decided and applied in C as well, and a routing whose kept experts must be read is
logged too: the filter then calls Python once, without a node, to hand the log to the cache
and read. Otherwise only a routing that must read goes to Python during the graph: on a
budget that holds the experts a token needs, the graph runs from end to end without stopping
in the interpreter, as the native engine's C++ callback does.

Without a C compiler (or with ``BMOE_EVAL_FILTER=0``) :func:`load` returns None and the hook
answers every question in Python, as before; the results are the same.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

MAX_PREFIXES = 8
PREFIX_BYTES = 48
#: The widest routing (top-k) the resident fast path logs; a wider one goes to Python.
MAX_K = 32
#: A log entry: the layer, the number of ids, the dropped slots (a bit each), the ids staged.
ENTRY = 3 + MAX_K
#: The bit of an entry's layer that says the routing must read (the last entry of the log).
READS_FLAG = 1 << 30
#: The logged resident routings' totals the filter keeps: keys staged, lookups (distinct keys),
#: slots, dropped slots, demand bytes (their distinct experts') and the widest routing's.
TOTALS = ("touches", "lookups", "slots", "dropped", "demand_bytes", "widest_bytes")
N_TOTALS = len(TOTALS)

_SOURCE = r"""
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef bool (*eval_cb)(void * t, bool ask, void * user);

struct bmoe_filter {
    eval_cb python;
    size_t name_offset;
    int pass_through;
    int n_prefixes;
    char prefixes[N_PREFIXES][PREFIX_BYTES];
    /* the resident fast path */
    size_t data_offset;
    size_t ne_offset;
    size_t nb_offset;
    int fast;
    int n_layer;
    int n_expert;
    int log_cap;
    const unsigned char * resident;  /* n_layer x n_expert: 1 = resident and readable */
    int32_t * log;                   /* log_cap entries of ENTRY int32s: layer, k, mask, ids */
    int log_len;
    /* live dropping: the routing is decided at the layer's last weights node */
    int drop;
    int renorm;
    float drop_frac;                 /* F: a slot under F x (1/k) may be dropped (float32) */
    char weights_prefix[PREFIX_BYTES];
    void * pending;                  /* the topk node of the routing waiting for its weights */
    int pending_layer;
    int routed_layer;                /* the layer routed at its topk node: no weights work */
    /* the resident routings logged (not the one that reads), as the cache takes them */
    const int64_t * expert_bytes;    /* n_layer: the bytes of one expert of each layer */
    int32_t * touches;               /* log_cap x MAX_K: their keys (layer << 16 | id), staged */
    int32_t * ends;                  /* log_cap: where each one's keys end in touches */
    int64_t totals[N_TOTALS];        /* touches, lookups, slots, dropped, demand, widest */
};

static const char TOPK[] = "ffn_moe_topk-";
#define READS READS_FLAG  /* a log entry's layer bit: the routing reads (Python drains now) */

/* The layer number after `prefix` in `name` ("ffn_moe_topk-12"), or -1. */
static long layer_after(const struct bmoe_filter * f, const char * name, const char * prefix,
                        size_t n) {
    if (strncmp(name, prefix, n) != 0) {
        return -1;
    }
    char * end = NULL;
    long layer = strtol(name + n, &end, 10);
    if (end == name + n || *end != '\0' || layer < 0 || layer >= f->n_layer) {
        return -1;
    }
    return layer;
}

/* One token's routed ids (a view of the argsort: ne0 ids, contiguous), or NULL. */
static int32_t * token_ids(const struct bmoe_filter * f, void * t, int * k) {
    const int64_t * ne = (const int64_t *) ((const char *) t + f->ne_offset);
    int32_t * ids = *(int32_t * const *) ((const char *) t + f->data_offset);
    if (ne[1] != 1 || ne[0] < 1 || ne[0] > MAX_K || ids == NULL) {
        return NULL;
    }
    *k = (int) ne[0];
    return ids;
}

static bool readable(const struct bmoe_filter * f, long layer, int32_t e) {
    return e >= 0 && e < f->n_expert && f->resident[(size_t) layer * (size_t) f->n_expert + e];
}

/* A routing that needed no read, added to the totals the cache takes at the drain: its keys
   in slot order (a dropped slot repeats its token's top expert), its distinct keys (one
   lookup each), its slots, dropped slots and the bytes its distinct experts occupy. */
static void add_resident(struct bmoe_filter * f, long layer, int k, uint32_t mask,
                         const int32_t * ids) {
    int64_t * total = f->totals;
    int32_t * keys = f->touches + total[0];
    int distinct = 0;
    for (int i = 0; i < k; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) {
            seen = seen || ids[j] == ids[i];
        }
        distinct += !seen;
        keys[i] = (int32_t) (layer << 16 | ids[i]);
    }
    total[0] += k;
    f->ends[f->log_len] = (int32_t) total[0];
    int64_t demand = (int64_t) distinct * f->expert_bytes[layer];
    total[1] += distinct;
    total[2] += k;
    total[3] += __builtin_popcount(mask);
    total[4] += demand;
    if (demand > total[5]) total[5] = demand;
}

static void log_entry(struct bmoe_filter * f, long layer, int k, uint32_t mask,
                      const int32_t * ids) {
    int32_t * entry = f->log + (size_t) f->log_len * ENTRY;
    entry[0] = (int32_t) layer;
    entry[1] = k;
    entry[2] = (int32_t) mask;
    memcpy(entry + 3, ids, (size_t) k * sizeof(int32_t));
    if (!(layer & READS)) {
        add_resident(f, layer, k, mask, ids);
    }
    f->log_len++;
}

/* A computed routing node of one token: logged when its experts are all resident; with
   dropping on, otherwise kept for its weights node. False: Python routes it now. */
static bool at_topk(struct bmoe_filter * f, void * t, long layer) {
    int k = 0;
    int32_t * ids = token_ids(f, t, &k);
    if (ids == NULL || f->log_len >= f->log_cap) {
        return false;
    }
    bool all = true;
    for (int i = 0; i < k; i++) {
        all = all && readable(f, layer, ids[i]);
    }
    if (all) {
        log_entry(f, layer, k, 0, ids);
        f->routed_layer = (int) layer;
        return true;
    }
    if (f->drop) {
        f->pending = t;
        f->pending_layer = (int) layer;
        return true;
    }
    return false;
}

/* The pending routing's weights node: the drop decision, slot by slot (a miss under the limit,
   not the top slot), applied here (weights zeroed, the rest rescaled to the routing's mass, a
   dropped slot pointed at the top expert), as the native engine applies it, and logged. When a
   slot it keeps must be read, the entry is marked READS and Python is called (with no node) to
   hand the log to the cache and read, before the expert matmuls run. 1: handled, 0: not one
   token's weights of the routing waiting (Python decides), -1: stop the graph. */
static int at_weights(struct bmoe_filter * f, void * t, long layer) {
    void * topk = f->pending;
    int k = 0;
    int32_t * ids = topk ? token_ids(f, topk, &k) : NULL;
    const int64_t * ne = (const int64_t *) ((const char *) t + f->ne_offset);
    const size_t * nb = (const size_t *) ((const char *) t + f->nb_offset);
    char * data = *(char * const *) ((const char *) t + f->data_offset);
    if (ids == NULL || layer != f->pending_layer || data == NULL || *(const int *) t != 0 ||
        f->log_len >= f->log_cap) {
        return 0;  /* not one token's f32 weights of the routing waiting */
    }
    bool fits_3d = ne[0] == 1 && ne[1] == k && ne[2] == 1;
    bool fits_2d = ne[0] == k && ne[1] == 1 && ne[2] == 1;
    if (!fits_3d && !fits_2d) {
        return 0;
    }
    size_t slot_nb = fits_3d ? nb[1] : nb[0];
    float * w[MAX_K];
    int best = 0;
    for (int i = 0; i < k; i++) {
        w[i] = (float *) (data + (size_t) i * slot_nb);
        if (*w[i] > *w[best]) best = i;
    }
    uint32_t mask = 0;
    bool reads = false;
    for (int i = 0; i < k; i++) {
        bool miss = !readable(f, layer, ids[i]);
        if (i != best && miss && *w[i] < f->drop_frac / (float) k) {
            mask |= 1u << i;
        } else if (miss) {
            reads = true;  /* a kept expert must be read */
        }
    }
    float total = 0.0f, kept = 0.0f;
    for (int i = 0; i < k; i++) {
        total += *w[i];
        if (!(mask >> i & 1u)) kept += *w[i];
    }
    int32_t staged[MAX_K];
    for (int i = 0; i < k; i++) {
        staged[i] = mask >> i & 1u ? ids[best] : ids[i];
    }
    for (int i = 0; i < k; i++) {
        if (mask >> i & 1u) *w[i] = 0.0f;
    }
    if (f->renorm && mask && kept > 0.0f) {
        float g = total / kept;
        for (int i = 0; i < k; i++) {
            if (!(mask >> i & 1u)) *w[i] *= g;
        }
    }
    log_entry(f, layer | (reads ? READS : 0), k, mask, staged);
    for (int i = 0; i < k; i++) {
        ids[i] = staged[i];
    }
    f->pending = NULL;
    if (reads) {
        return f->python(NULL, false, NULL) ? 1 : -1;
    }
    return 1;
}

/* A computed node the filter asked for: 1 handled here, 0 for Python, -1 stop the graph. */
static int computed(struct bmoe_filter * f, void * t, const char * name) {
    long layer = layer_after(f, name, TOPK, sizeof(TOPK) - 1);
    if (layer >= 0) {
        f->pending = NULL;
        return at_topk(f, t, layer);
    }
    if (!f->drop) {
        return 0;
    }
    layer = layer_after(f, name, f->weights_prefix, strlen(f->weights_prefix));
    if (layer < 0) {
        return 0;
    }
    if (layer == f->routed_layer) {
        return 1;  /* routed at its topk node: every expert resident, nothing to drop */
    }
    int applied = at_weights(f, t, layer);
    if (applied != 0) {
        return applied;
    }
    if (f->pending != NULL) {  /* Python decides: it sees the routing node first */
        void * topk = f->pending;
        f->pending = NULL;
        if (!f->python(topk, false, NULL)) {
            return -1;
        }
    }
    return 0;
}

bool bmoe_eval_filter(void * t, bool ask, void * user) {
    struct bmoe_filter * f = (struct bmoe_filter *) user;
    const char * name = (const char *) t + f->name_offset;
    if (!ask) {
        int handled = f->fast && !f->pass_through ? computed(f, t, name) : 0;
        if (handled != 0) {
            return handled > 0;
        }
        return f->python(t, ask, NULL);
    }
    if (f->pass_through) {
        return f->python(t, ask, NULL);
    }
    if (strchr(name, '(') != NULL) {
        return false;  /* views of a node ("... (reshaped)") are not the node */
    }
    for (int i = 0; i < f->n_prefixes; i++) {
        if (strncmp(name, f->prefixes[i], strlen(f->prefixes[i])) == 0) {
            return true;
        }
    }
    return false;
}
"""
for _name, _value in (("N_PREFIXES", MAX_PREFIXES), ("PREFIX_BYTES", PREFIX_BYTES),
                      ("MAX_K", MAX_K), ("ENTRY", ENTRY), ("READS_FLAG", READS_FLAG),
                      ("N_TOTALS", N_TOTALS)):  # fmt: skip
    _SOURCE = _SOURCE.replace(_name, str(_value))


class FilterState(ctypes.Structure):
    """The C struct the filter reads (its ``user`` pointer)."""

    _fields_ = [
        ("python", ctypes.c_void_p),
        ("name_offset", ctypes.c_size_t),
        ("pass_through", ctypes.c_int),
        ("n_prefixes", ctypes.c_int),
        ("prefixes", (ctypes.c_char * PREFIX_BYTES) * MAX_PREFIXES),
        ("data_offset", ctypes.c_size_t),
        ("ne_offset", ctypes.c_size_t),
        ("nb_offset", ctypes.c_size_t),
        ("fast", ctypes.c_int),
        ("n_layer", ctypes.c_int),
        ("n_expert", ctypes.c_int),
        ("log_cap", ctypes.c_int),
        ("resident", ctypes.c_void_p),
        ("log", ctypes.c_void_p),
        ("log_len", ctypes.c_int),
        ("drop", ctypes.c_int),
        ("renorm", ctypes.c_int),
        ("drop_frac", ctypes.c_float),
        ("weights_prefix", ctypes.c_char * PREFIX_BYTES),
        ("pending", ctypes.c_void_p),
        ("pending_layer", ctypes.c_int),
        ("routed_layer", ctypes.c_int),
        ("expert_bytes", ctypes.c_void_p),
        ("touches", ctypes.c_void_p),
        ("ends", ctypes.c_void_p),
        ("totals", ctypes.c_int64 * N_TOTALS),
    ]

    def set_prefixes(self, prefixes: list[bytes]) -> None:
        if len(prefixes) > MAX_PREFIXES or any(len(p) >= PREFIX_BYTES for p in prefixes):
            raise ValueError(f"too many or too long node-name prefixes: {prefixes}")
        for i, prefix in enumerate(prefixes):
            self.prefixes[i].value = prefix
        self.n_prefixes = len(prefixes)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bmoe"


def build_library(stem: str, source: str, flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """`source` compiled once with the system C compiler into the user's cache folder (the
    file named by its hash, so an edited source compiles anew), loaded; None without one."""
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    try:
        folder = _cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        lib = folder / f"{stem}-{digest}.so"
        if not lib.is_file():
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                src = Path(tmp) / f"{stem}.c"
                src.write_text(source)
                out = Path(tmp) / lib.name
                cc = os.environ.get("CC", "cc")
                subprocess.run(
                    [cc, "-O2", "-shared", "-fPIC", *flags, "-o", str(out), str(src)],
                    check=True,
                    capture_output=True,
                    timeout=60,
                )
                os.replace(out, lib)  # atomic: concurrent processes agree
        return ctypes.CDLL(str(lib))
    except (OSError, subprocess.SubprocessError):
        return None


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled filter library, or None (no compiler, or ``BMOE_EVAL_FILTER=0``)."""
    if os.environ.get("BMOE_EVAL_FILTER", "1") in ("0", "", "off", "no"):
        return None
    return build_library("evalfilter", _SOURCE)
