"""A C front for the eval callback: answers ggml's "do you want this node?" without Python.

ggml asks the eval callback about every node of the graph (hundreds per token); in Python each
answer costs a couple of microseconds, which on a small model is a visible share of a token.
For single-token decodes the answer only depends on the node's name, so this filter, compiled
once with the system C compiler into the user's cache folder, answers from a list of name
prefixes and calls Python only for the nodes it wants (when they are computed) and, when told
to pass through, for every question (prefill, traces, the warm-up's discovery).

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

_SOURCE = r"""
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef bool (*eval_cb)(void * t, bool ask, void * user);

struct bmoe_filter {
    eval_cb python;
    size_t name_offset;
    int pass_through;
    int n_prefixes;
    char prefixes[N_PREFIXES][PREFIX_BYTES];
};

bool bmoe_eval_filter(void * t, bool ask, void * user) {
    struct bmoe_filter * f = (struct bmoe_filter *) user;
    if (!ask || f->pass_through) {
        return f->python(t, ask, NULL);
    }
    const char * name = (const char *) t + f->name_offset;
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
""".replace("N_PREFIXES", str(MAX_PREFIXES)).replace("PREFIX_BYTES", str(PREFIX_BYTES))


class FilterState(ctypes.Structure):
    """The C struct the filter reads (its ``user`` pointer)."""

    _fields_ = [
        ("python", ctypes.c_void_p),
        ("name_offset", ctypes.c_size_t),
        ("pass_through", ctypes.c_int),
        ("n_prefixes", ctypes.c_int),
        ("prefixes", (ctypes.c_char * PREFIX_BYTES) * MAX_PREFIXES),
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
