"""Rows of a plain numeric CSV parsed straight into numpy columns by a compiled loop.

A route trace is a million rows of small integers and one float; pyarrow's general CSV reader
spends ~250 ns a row on it, a loop that knows the grammar ~65. :func:`parse_rows` takes only
the plainest form: fields ``-?[0-9]+`` (integer columns, within their type), decimal floats
with an optional exponent, ``nan``, ``,`` between fields and ``\\n`` after each row (the last one
may lack it). Anything else (quotes, blanks, ``\\r``, ``inf``, a value beyond its type, a row of
another width, a float it cannot round exactly) stops it with the row it reached, and the
caller reads the file with pyarrow instead, which names the problem or takes the value. So a
file parsed here gives the columns pyarrow would give, bit for bit (floats are correctly
rounded: decimal to float64 exactly rounded, then to float32 unless the float64 lies on a
float32 rounding boundary, where it stops). The rows up to the last newline are parsed
without checking each byte against the end of the data (the newline ends every scan), which
takes about a tenth off the loop's time on a route trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from bmoe.compiled import arrays, njit

#: column kinds: skipped (not kept), integers of 1, 2, 4 bytes, float32
SKIP, INT8, INT16, INT32, FLOAT32 = 0, 1, 2, 3, 4
KINDS = {np.dtype(np.int8): INT8, np.dtype(np.int16): INT16, np.dtype(np.int32): INT32,
         np.dtype(np.float32): FLOAT32}  # fmt: skip
#: why :func:`parse_rows` stopped (0: it did not)
DONE = 0

# powers of ten exact in float64 (10**22 is the largest)
_POW10 = np.array([10.0**i for i in range(23)])
_OPTS = {"cache": True, "nogil": True, "boundscheck": False}


def _examples() -> tuple:
    u1, k, s = arrays("u1 i1 i8")
    return (u1, 0, 1, k, s, s, s, *arrays("i1[:,:] i2[:,:] i4[:,:] f4[:,:]"), 0, 1, _POW10)


@njit(ahead=_examples, **_OPTS)
def parse_rows(buf, pos, end, kind, slot, lo, hi, out1, out2, out4, outf, row0, max_rows, pow10):
    """Parse rows from ``buf[pos:end]`` (`pos` at a row's start) into the columns: column
    ``c`` of kind ``kind[c]`` goes to row ``slot[c]`` of the output array of its kind, from
    index `row0` on; integers must lie in ``lo[c]..hi[c]``. At most `max_rows` rows.
    Returns (rows parsed, the position after them, 0 or the reason it stopped there).

    The rows up to the last newline are parsed by a loop that needs no check for the end;
    a last row without its newline by one that checks."""
    lines = end
    while lines > pos and buf[lines - 1] != 10:
        lines -= 1
    r, pos, status = _rows_to_newline(
        buf, pos, lines, kind, slot, lo, hi, out1, out2, out4, outf, row0, max_rows, pow10
    )
    if status != DONE or r == max_rows or pos >= end:
        return r, pos, status
    more, pos, status = _rows_checked(
        buf, pos, end, kind, slot, lo, hi, out1, out2, out4, outf, row0 + r, max_rows - r, pow10
    )
    return r + more, pos, status


@njit(inline="always", **_OPTS)
def _decimal(m, e, pow10):
    """``m * 10**e`` as a float64 and whether it is exact enough: correctly rounded (`m`
    below 2**53 and ``|e|`` at most 22, so that one division or product of exact values
    rounds once) and off a float32 rounding boundary (where the narrowing would round
    twice). False: the caller stops, and pyarrow reads the value instead."""
    if m >= (np.int64(1) << 53):
        return 0.0, False
    if m == 0:
        return 0.0, True
    if e < 0:
        if e < -22:
            return 0.0, False
        x = m / pow10[-e]  # both exact: one correctly rounded division
    else:
        if e > 22:
            return 0.0, False
        x = m * pow10[e]
        if x >= 9007199254740992.0:  # 2**53: the product may have been rounded
            return 0.0, False
    bits = np.float64(x).view(np.int64)
    return x, (bits & 0x1FFFFFFF) != 0x10000000  # on a float32 boundary: not exact


@njit(**_OPTS)
def _rows_to_newline(
    buf, pos, end, kind, slot, lo, hi, out1, out2, out4, outf, row0, max_rows, pow10
):
    """:func:`parse_rows` of ``buf[pos:end]``, whose last byte is a newline: every scan of a
    field stops at a byte that is no digit by that one at the latest, so none checks for the
    end; integers and floats read digit runs whole (unsigned compares; leading zeros skipped
    instead of each digit asking whether one came before). The same columns, stops and
    reasons as :func:`_rows_checked`."""
    n_col = len(kind)
    r = 0
    while pos < end and r < max_rows:
        row_start = pos
        at = row0 + r
        for c in range(n_col):
            k = kind[c]
            if k == SKIP:
                while buf[pos] != 44 and buf[pos] != 10:
                    pos += 1
            elif k != FLOAT32:
                neg = buf[pos] == 45
                if neg:
                    pos += 1
                start = pos
                v = np.int64(0)
                d = np.uint64(buf[pos]) - np.uint64(48)
                while d <= 9:
                    v = v * 10 + np.int64(d)
                    pos += 1
                    d = np.uint64(buf[pos]) - np.uint64(48)
                if pos == start or pos - start > 10:
                    return r, row_start, 1
                if neg:
                    v = -v
                if v < lo[c] or v > hi[c]:
                    return r, row_start, 2
                if k == INT8:
                    out1[slot[c], at] = v
                elif k == INT16:
                    out2[slot[c], at] = v
                else:
                    out4[slot[c], at] = v
            elif buf[pos] == 110 and buf[pos + 1] == 97 and buf[pos + 2] == 110:  # nan
                outf[slot[c], at] = np.float32(np.nan)
                pos += 3
            else:
                neg = buf[pos] == 45
                if neg:
                    pos += 1
                start = pos
                while buf[pos] == 48:  # leading zeros: not significant
                    pos += 1
                sig = pos
                m = np.int64(0)
                d = np.uint64(buf[pos]) - np.uint64(48)
                while d <= 9:
                    m = m * 10 + np.int64(d)
                    pos += 1
                    d = np.uint64(buf[pos]) - np.uint64(48)
                whole = pos - start
                digits = pos - sig
                scale = 0
                if buf[pos] == 46:
                    pos += 1
                    frac = pos
                    if digits == 0:
                        while buf[pos] == 48:  # zeros before the first significant digit
                            pos += 1
                    sig = pos
                    d = np.uint64(buf[pos]) - np.uint64(48)
                    while d <= 9:
                        m = m * 10 + np.int64(d)
                        pos += 1
                        d = np.uint64(buf[pos]) - np.uint64(48)
                    scale = pos - frac
                    digits += pos - sig
                if whole + scale == 0 or digits > 15:
                    return r, row_start, 3
                e = -scale
                if buf[pos] == 101 or buf[pos] == 69:
                    pos += 1
                    eneg = False
                    if buf[pos] == 45 or buf[pos] == 43:
                        eneg = buf[pos] == 45
                        pos += 1
                    es = pos
                    ev = 0
                    while pos - es < 4:
                        d = np.uint64(buf[pos]) - np.uint64(48)
                        if d > 9:
                            break
                        ev = ev * 10 + np.int64(d)
                        pos += 1
                    if pos == es or pos - es > 3:
                        return r, row_start, 3
                    e += -ev if eneg else ev
                x, exact = _decimal(m, e, pow10)
                if not exact:
                    return r, row_start, 4
                outf[slot[c], at] = np.float32(-x if neg else x)
            if c == n_col - 1:
                if buf[pos] != 10:
                    return r, row_start, 5
                pos += 1
            else:
                if buf[pos] != 44:
                    return r, row_start, 5
                pos += 1
        r += 1
    return r, pos, DONE


@njit(**_OPTS)
def _rows_checked(buf, pos, end, kind, slot, lo, hi, out1, out2, out4, outf, row0, max_rows, pow10):
    """:func:`parse_rows` of any ``buf[pos:end]``: every scan checks for the end (the last
    row may lack its newline)."""
    n_col = len(kind)
    r = 0
    while pos < end and r < max_rows:
        row_start = pos
        for c in range(n_col):
            k = kind[c]
            if k == SKIP:
                while pos < end and buf[pos] != 44 and buf[pos] != 10:
                    pos += 1
            elif k != FLOAT32:
                neg = pos < end and buf[pos] == 45
                if neg:
                    pos += 1
                start = pos
                v = np.int64(0)
                while pos < end and pos - start < 11:
                    d = np.int64(buf[pos]) - 48
                    if d < 0 or d > 9:
                        break
                    v = v * 10 + d
                    pos += 1
                if pos == start or pos - start > 10:
                    return r, row_start, 1
                if neg:
                    v = -v
                if v < lo[c] or v > hi[c]:
                    return r, row_start, 2
                at = row0 + r
                if k == INT8:
                    out1[slot[c], at] = v
                elif k == INT16:
                    out2[slot[c], at] = v
                else:
                    out4[slot[c], at] = v
            elif (
                pos + 2 < end and buf[pos] == 110 and buf[pos + 1] == 97 and buf[pos + 2] == 110
            ):  # "nan", as the writer spells a missing weight
                outf[slot[c], row0 + r] = np.float32(np.nan)
                pos += 3
            else:
                neg = pos < end and buf[pos] == 45
                if neg:
                    pos += 1
                start = pos
                m = np.int64(0)
                digits = 0  # significant digits in m
                scale = 0  # digits after the point
                while pos < end:
                    d = np.int64(buf[pos]) - 48
                    if d < 0 or d > 9:
                        break
                    if digits or d:
                        digits += 1
                    m = m * 10 + d
                    pos += 1
                whole = pos - start
                if pos < end and buf[pos] == 46:
                    pos += 1
                    while pos < end:
                        d = np.int64(buf[pos]) - 48
                        if d < 0 or d > 9:
                            break
                        if digits or d:
                            digits += 1
                        m = m * 10 + d
                        scale += 1
                        pos += 1
                if whole + scale == 0 or digits > 15:
                    return r, row_start, 3
                e = -scale
                if pos < end and (buf[pos] == 101 or buf[pos] == 69):
                    pos += 1
                    eneg = False
                    if pos < end and (buf[pos] == 45 or buf[pos] == 43):
                        eneg = buf[pos] == 45
                        pos += 1
                    es = pos
                    ev = 0
                    while pos < end and pos - es < 4:
                        d = np.int64(buf[pos]) - 48
                        if d < 0 or d > 9:
                            break
                        ev = ev * 10 + d
                        pos += 1
                    if pos == es or pos - es > 3:
                        return r, row_start, 3
                    e += -ev if eneg else ev
                x, exact = _decimal(m, e, pow10)
                if not exact:
                    return r, row_start, 4
                f = np.float32(-x if neg else x)
                outf[slot[c], row0 + r] = f
            if c == n_col - 1:
                if pos < end:
                    if buf[pos] != 10:
                        return r, row_start, 5
                    pos += 1
            else:
                if pos >= end or buf[pos] != 44:
                    return r, row_start, 5
                pos += 1
        r += 1
    return r, pos, DONE


def compiled_ahead() -> bool:
    """Whether :func:`parse_rows` runs compiled ahead of time here (not through numba's JIT,
    which would first compile it for seconds: a reader can take another parser then)."""
    return parse_rows.takes(*_examples())


class Layout:
    """Where :func:`parse_rows` puts each column of a header: its kind and slot, the range of
    its values, and the output arrays (one 2-d array per kind, a row per column)."""

    def __init__(self, header: list[str], types: dict[str, np.dtype], keep: set[str] | None):
        self.names: list[str] = []
        kind, slot, lo, hi = [], [], [], []
        per_kind = dict.fromkeys(range(5), 0)
        self.where: dict[str, tuple[int, int]] = {}
        for name in header:
            dtype = np.dtype(types[name])
            k = KINDS[dtype] if keep is None or name in keep else SKIP
            kind.append(k)
            slot.append(per_kind[k])
            per_kind[k] += 1
            info = np.iinfo(dtype) if dtype.kind == "i" else None
            lo.append(info.min if info else 0)
            hi.append(info.max if info else 0)
            if k != SKIP:
                self.where[name] = (k, slot[-1])
                self.names.append(name)
        self.kind = np.array(kind, dtype=np.int8)
        self.slot = np.array(slot, dtype=np.int64)
        self.lo = np.array(lo, dtype=np.int64)
        self.hi = np.array(hi, dtype=np.int64)
        self.counts = per_kind

    def outputs(self, rows: int) -> list[np.ndarray]:
        """Empty output arrays for `rows` rows (pages never written are never resident)."""
        return [
            np.empty((self.counts[k], rows if self.counts[k] else 0), dtype=dtype)
            for k, dtype in ((INT8, np.int8), (INT16, np.int16), (INT32, np.int32),
                             (FLOAT32, np.float32))
        ]  # fmt: skip

    def columns(self, outputs: list[np.ndarray], n: int) -> dict[str, np.ndarray]:
        """The kept columns, in header order: views of the first `n` rows of `outputs`."""
        return {name: outputs[k - 1][s, :n] for name, (k, s) in self.where.items()}

    def parse(
        self, buf: np.ndarray, pos: int, end: int, outputs: list[np.ndarray], row0: int, most: int
    ) -> tuple[int, int, int]:
        """:func:`parse_rows` into `outputs` from row `row0`, at most `most` rows."""
        return parse_rows(buf, pos, end, self.kind, self.slot, self.lo, self.hi, *outputs, row0,
                          most, _POW10)  # fmt: skip


#: bytes read from a file at a time
CHUNK = 8 << 20
#: the longest line a chunk's end is searched back over for the last whole row
LONGEST_LINE = 1 << 16


class Stopped(Exception):
    """A row :func:`parse_rows` does not take, at byte `at` of the source (the rows before it
    were given): the caller reads on from there another way."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at


def iter_blocks(
    source: str | bytes | memoryview | Any,
    start: int,
    end: int,
    layout: Layout,
    rows: int,
    *,
    header: bool = True,
) -> Iterator[dict[str, np.ndarray]]:
    """The kept columns of the rows in bytes ``start:end`` of `source` (a file's path, or
    bytes in memory, parsed in place; the span led by its header line unless not `header`,
    and ending with a newline or at the end of the data), `rows` rows a block (the last one
    fewer). A file is read a chunk at a time. At a row it does not take, the rows before it
    are given and :class:`Stopped` is raised with that row's byte offset."""
    blocks = _Blocks(layout, rows)
    if not isinstance(source, str):
        buf = np.frombuffer(source, dtype=np.uint8)
        pos = _after_header(buf, start, end, 0) if header else start
        yield from blocks.fill(buf, pos, end, 0)
        yield from blocks.rest()
        return
    buf = np.empty(CHUNK, dtype=np.uint8)
    view = memoryview(buf.data)
    with open(source, "rb", buffering=0) as fh:
        fh.seek(start)
        held = 0  # bytes of rows not parsed yet at the front of `buf`
        at = start  # the file offset after what `buf` holds
        while held or at < end:
            more = fh.readinto(view[held : held + min(CHUNK - held, end - at)])
            if not more and at < end:
                raise Stopped(at - held)  # the file shrank
            held += more
            at += more
            base = at - held  # the file offset of buf[0]
            pos = 0
            if header:
                pos, header = _after_header(buf, 0, held, base), False
            stop = held
            if at < end:  # up to the last whole row
                back = max(pos, held - LONGEST_LINE)
                tail = np.flatnonzero(buf[back:held] == 10)
                if not len(tail):
                    raise Stopped(base + pos)
                stop = back + int(tail[-1]) + 1
            yield from blocks.fill(buf, pos, stop, base)
            buf[: held - stop] = buf[stop:held]
            held -= stop
    yield from blocks.rest()


def _after_header(buf: np.ndarray, start: int, end: int, base: int) -> int:
    lines = np.flatnonzero(buf[start : min(end, start + LONGEST_LINE)] == 10)
    if not len(lines):
        raise Stopped(base + start)
    return start + int(lines[0]) + 1


class _Blocks:
    """Rows parsed into blocks of `rows` rows, span after span."""

    def __init__(self, layout: Layout, rows: int) -> None:
        self.layout, self.rows = layout, rows
        self.outputs: list[np.ndarray] | None = None
        self.n = 0

    def fill(
        self, buf: np.ndarray, pos: int, stop: int, base: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """Parse the whole rows of ``buf[pos:stop]`` (`base`: the source offset of buf[0]),
        giving each block that fills."""
        layout = self.layout
        while pos < stop:
            if self.outputs is None:
                self.outputs = layout.outputs(self.rows)
            r, pos, status = layout.parse(buf, pos, stop, self.outputs, self.n, self.rows - self.n)
            self.n += r
            if status != DONE:
                yield from self.rest()
                raise Stopped(base + pos)
            if self.n == self.rows:
                yield from self.rest()

    def rest(self) -> Iterator[dict[str, np.ndarray]]:
        """The rows parsed and not given yet, as a block (none if there are none)."""
        if self.n and self.outputs is not None:
            yield self.layout.columns(self.outputs, self.n)
            self.outputs, self.n = None, 0
