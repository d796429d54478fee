"""Command lines shown to be pasted into a shell: every argument quoted so that the pasted
line names exactly the files and values the program used.

:func:`shlex.quote` keeps a control character as it is inside single quotes; printed, it is
shown spelled (``\\x1b``) by the output filter, and the pasted command then names another
file. An argument holding one is written in ANSI-C quoting instead (``$'a\\x1bb'``: bash, zsh
and ksh read it back to the same bytes), so the shown line is plain text and still exact.
Scripts a target's ``sh`` runs keep :func:`shlex.quote` (POSIX sh has no ``$'...'``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

#: What cannot travel literally in a pasted line: C0 controls (tab and newline too, which
#: would split or reshape it), DEL, C1 controls, the Unicode controls that reorder or break a
#: line on display, and surrogates (a file name's undecodable bytes).
_UNPASTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _bytes_of(ch: str) -> bytes:
    try:
        return ch.encode("utf-8", "surrogateescape")  # a file name's byte comes back as it was
    except UnicodeEncodeError:
        return ch.encode("utf-8", "surrogatepass")


def _ansi_c(text: str) -> str:
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif _UNPASTABLE.match(ch):
            out.append("".join(f"\\x{b:02x}" for b in _bytes_of(ch)))  # in any locale
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def shell_quote(arg: object) -> str:
    """`arg` as one shell word that pastes back to the same string."""
    text = str(arg)
    return _ansi_c(text) if _UNPASTABLE.search(text) else shlex.quote(text)


def shell_join(args: Iterable[object]) -> str:
    """`args` as one command line to paste (see :func:`shell_quote`)."""
    return " ".join(shell_quote(a) for a in args)
