"""``key=value`` tokens: preambles, ``# summary`` trailers, device sidecars.

Tokens are whitespace separated; tokens without ``=`` are skipped; unknown keys are kept in
file order. Values are typed from their text (int, float, str) unless a key is known to be a
boolean flag (``0``/``1`` in the file, ``bool`` in Python), or a float whose text happens to
look like an integer (``temp=0``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from bmoe.formats.errors import FormatError

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|nan|inf|-inf)$", re.I)

#: Preamble keys that are 0/1 flags in the files and booleans in Python.
BOOL_KEYS = frozenset(
    {
        "chatml",
        "moe_stream",
        "cache_auto",
        "force_cache",
        "load_all",
        "o_direct",
        "overlap",
        "io_two_wave",
        "predict_prefetch",
        "predict_log",
        "prefetch_sync",
        "drop_renorm",
        "drop_prefill",
        "mtp",
    }
)

#: Keys that are floats even when the file spells them like an integer.
FLOAT_KEYS = frozenset(
    {"temp", "top_p", "drop_cold_frac", "substitute_lambda", "mtp_p_min", "min_p"}
)

#: Keys that stay strings even when they look numeric (versions, names, paths).
STR_KEYS = frozenset({"engine", "model", "arch", "dense_weights", "spec", "date"})


def parse_value(key: str, text: str) -> Any:
    """Type one value from its text, using what is known about the key."""
    if key in STR_KEYS:
        return text
    if key in BOOL_KEYS and text in ("0", "1"):
        return text == "1"
    if _INT.match(text):
        return float(text) if key in FLOAT_KEYS else int(text)
    if _FLOAT.match(text):
        return float(text)
    if text in ("true", "false"):
        return text == "true"
    return text


def parse_tokens(text: str) -> dict[str, Any]:
    """Parse whitespace-separated ``key=value`` tokens into a typed, ordered dict."""
    out: dict[str, Any] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep or not key:
            continue
        out[key] = parse_value(key, value)
    return out


#: Counts every consumer sizes things by: non-negative integers below 2**31.
COUNT_KEYS = frozenset(
    {"n_layer", "n_expert", "n_expert_used", "threads", "n_threads", "io_threads", "n_ctx",
     "n_ubatch"}
)  # fmt: skip
#: Indices (a route trace's ``# layer=`` lines): non-negative integers below 2**31.
INDEX_KEYS = frozenset({"layer"})
#: Byte sizes: non-negative integers that fit an int64.
SIZE_KEYS = frozenset({"expert_bytes", "dense_bytes"})
_LIMITS = {
    **dict.fromkeys(COUNT_KEYS | INDEX_KEYS, 2**31 - 1),
    **dict.fromkeys(SIZE_KEYS, 2**63 - 1),
}


def quoted(text: Any, limit: int = 40) -> str:
    """`text` quoted for a message, cut to `limit` characters."""
    text = str(text)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def contract_problem(key: str, value: Any) -> str | None:
    """Why `value` is not what the contract allows for `key` (None when it is, or when the key
    has no numeric contract)."""
    if key in FLOAT_KEYS:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return None
        return f"{key}={quoted(value)} is not a number"
    limit = _LIMITS.get(key)
    if limit is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit:
        return None
    what = "a count" if key in COUNT_KEYS else "an index" if key in INDEX_KEYS else "a size"
    return f"{key}={quoted(value)} is not {what} (an integer from 0 to {limit})"


def parse_checked(text: str, path: str | None, line: int | None) -> dict[str, Any]:
    """:func:`parse_tokens` of a preamble line, with counts and sizes outside the contract
    (``n_expert=x``, ``n_layer=nan``, ``expert_bytes`` beyond int64) as a FormatError."""
    values = parse_tokens(text)
    for key, value in values.items():
        problem = contract_problem(key, value)
        if problem is not None:
            raise FormatError(path, line, problem)
    return values


def format_value(key: str, value: Any, precision: dict[str, int] | None = None) -> str:
    """Spell a typed value back the way the native engine writes it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if precision and key in precision:
            return f"{value:.{precision[key]}f}"
        if math.isnan(value):
            return "nan"
        return f"{value:g}"
    return str(value)


def format_tokens(values: dict[str, Any], precision: dict[str, int] | None = None) -> str:
    """The inverse of :func:`parse_tokens` (one line, no leading ``#``)."""
    return " ".join(f"{k}={format_value(k, v, precision)}" for k, v in values.items())
