"""TOML text helpers the standard library lacks: where a key sits, and writing a document back.

``tomllib`` parses but reports no positions, so :func:`key_lines` scans the text once and maps
every key path (``("grid", "cache_mb")``, ``("targets", 1, "serial")``) to its 1-based line, for
error messages. :func:`dumps` writes the plain documents a sweep configuration is made of
(tables, arrays of tables, scalars, arrays and inline tables of scalars).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

KeyPath = tuple[str | int, ...]

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_KEY_PART = re.compile(r"""\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*""")


def _split_key(text: str) -> tuple[list[str], int] | None:
    """Parse a (dotted, possibly quoted) key at the start of `text`; returns parts and the
    index just past it, or None when `text` does not start with a key."""
    parts: list[str] = []
    pos = 0
    while True:
        m = _KEY_PART.match(text, pos)
        if not m:
            return None
        token = m.group(1)
        if token.startswith('"'):
            try:
                parts.append(json.loads(token))
            except ValueError:
                parts.append(token[1:-1])
        elif token.startswith("'"):
            parts.append(token[1:-1])
        else:
            parts.append(token)
        pos = m.end()
        if pos < len(text) and text[pos] == ".":
            pos += 1
            continue
        return parts, pos


def _strip_strings(line: str) -> str:
    """`line` with the content of single-line strings blanked and any comment removed."""
    out = []
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "#":
            break
        if ch in "\"'":
            quote = ch
            j = i + 1
            while j < len(line) and line[j] != quote:
                j += 2 if (quote == '"' and line[j] == "\\") else 1
            out.append(quote + " " * max(0, min(j, len(line)) - i - 1) + quote)
            i = j + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def key_lines(text: str) -> dict[KeyPath, int]:
    """Every key path in a TOML document and the 1-based line where it is defined.

    Tables map to their header line; arrays of tables are indexed in order of appearance;
    keys inside inline tables on one line map to that line. Best effort on exotic layouts.
    """
    lines: dict[KeyPath, int] = {}
    counts: dict[KeyPath, int] = {}
    current: KeyPath = ()
    multiline: str | None = None  # the closing delimiter of an open multi-line string
    depth = 0  # open brackets of a multi-line array / inline table
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw
        if multiline is not None:
            end = line.find(multiline)
            if end < 0:
                continue
            line = line[end + 3 :]
            multiline = None
        for delim in ('"""', "'''"):
            start = line.find(delim)
            if start >= 0 and line.find(delim, start + 3) < 0:
                multiline = delim
                line = line[:start]
        clean = _strip_strings(line)
        stripped = clean.strip()
        if depth == 0 and stripped.startswith("["):
            array = stripped.startswith("[[")
            inner = stripped[2:] if array else stripped[1:]
            parsed = _split_key(inner)
            if parsed:
                parts, _ = parsed
                path: KeyPath = tuple(parts)
                if array:
                    index = counts.get(path, 0)
                    counts[path] = index + 1
                    lines.setdefault(path, number)
                    path = (*path, index)
                current = path
                lines.setdefault(path, number)
            continue
        if depth == 0:
            parsed = _split_key(line)
            if parsed and line[parsed[1] : parsed[1] + 1] == "=":
                parts, end = parsed
                key_path = (*current, *parts)
                lines.setdefault(key_path, number)
                rest = line[end + 1 :]
                _inline_keys(rest, key_path, number, lines)
        depth += clean.count("[") + clean.count("{") - clean.count("]") - clean.count("}")
        depth = max(depth, 0)
    return lines


def _inline_keys(text: str, prefix: KeyPath, number: int, lines: dict[KeyPath, int]) -> None:
    """Record keys of inline tables (``{ a = 1, b = 2 }``) written on one line."""
    clean = _strip_strings(text)
    for m in re.finditer(r"[{,]\s*([A-Za-z0-9_-]+)\s*=", clean):
        lines.setdefault((*prefix, m.group(1)), number)


def line_of(lines: Mapping[KeyPath, int], path: KeyPath) -> int | None:
    """The line of `path`, or of its nearest enclosing key or table that has one."""
    for end in range(len(path), 0, -1):
        found = lines.get(tuple(path[:end]))
        if found is not None:
            return found
    return None


# ----------------------------------------------------------------------------- writing


def _string(value: str) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("\x7f", "\\u007f")


def format_key(key: str) -> str:
    return key if _BARE.fullmatch(key) else _string(key)


def format_value(value: Any) -> str:
    """One TOML value: string, integer, float, boolean, array or inline table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{format_key(k)} = {format_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def dumps(document: Mapping[str, Any], header: str = "") -> str:
    """A TOML document: top-level scalars, then one ``[table]`` per mapping and one
    ``[[array]]`` entry per mapping in a list of mappings (nested mappings inline)."""
    out: list[str] = [header.rstrip("\n")] if header else []
    scalars = {k: v for k, v in document.items() if not _is_table(v) and not _is_table_array(v)}
    for key, value in scalars.items():
        out.append(f"{format_key(key)} = {format_value(value)}")
    for key, value in document.items():
        if _is_table(value):
            out.append("")
            out.append(f"[{format_key(key)}]")
            out.extend(f"{format_key(k)} = {format_value(v)}" for k, v in value.items())
        elif _is_table_array(value):
            for item in value:
                out.append("")
                out.append(f"[[{format_key(key)}]]")
                out.extend(f"{format_key(k)} = {format_value(v)}" for k, v in item.items())
    return "\n".join(out).lstrip("\n") + "\n"


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)
