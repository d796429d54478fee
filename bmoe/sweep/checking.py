"""Checking a parsed TOML document: type checks that raise a :class:`ConfigError` naming the
file, the line and the key.

Shared by the sweep configuration (:mod:`bmoe.sweep.config`) and the target kinds
(:mod:`bmoe.sweep.targets`), which check their own keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bmoe.errors import BmoeError
from bmoe.sweep.tomltext import KeyPath, line_of

Scalar = str | int | float | bool


class ConfigError(BmoeError):
    """A problem in a sweep configuration, located by file, line and key."""

    def __init__(self, path: str, line: int | None, key: str, problem: str):
        self.path, self.line, self.key, self.problem = path, line, key, problem
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


def dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Checker:
    """Type checks that raise a located :class:`ConfigError`."""

    def __init__(self, path: str, lines: dict[KeyPath, int]):
        self.path = path
        self.lines = lines

    def fail(self, key: KeyPath, problem: str) -> ConfigError:
        return ConfigError(self.path, line_of(self.lines, key), dotted(key), problem)

    def table(self, value: Any, key: KeyPath) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a table, got {describe(value)}")
        return value

    def known(self, table: Mapping[str, Any], allowed: tuple[str, ...], key: KeyPath) -> None:
        for name in table:
            if name not in allowed:
                hint = closest(name, allowed)
                raise self.fail(
                    (*key, name),
                    "unknown key"
                    + (f" (did you mean {hint!r}?)" if hint else "")
                    + f"; expected one of: {', '.join(allowed)}",
                )

    def string(self, value: Any, key: KeyPath, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {describe(value)}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def integer(
        self, value: Any, key: KeyPath, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, f"expected an integer, got {describe(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be at most {maximum}, got {value}")
        return value

    def number(
        self, value: Any, key: KeyPath, positive: bool = False, maximum: float | None = None
    ) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.fail(key, f"expected a number, got {describe(value)}")
        if not math.isfinite(value):
            raise self.fail(key, f"expected a finite number, got {value}")
        if positive and value <= 0:
            raise self.fail(key, f"must be greater than 0, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be at most {maximum:g}, got {value:g}")
        return float(value)

    def boolean(self, value: Any, key: KeyPath) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {describe(value)}")
        return value

    def strings(self, value: Any, key: KeyPath) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"expected a list of strings, got {describe(value)}")
        return list(value)

    def scalar(self, value: Any, key: KeyPath) -> Scalar:
        if isinstance(value, list):
            raise self.fail(key, "a list of values belongs in [grid] (one cell per value)")
        if not isinstance(value, str | int | float | bool):
            raise self.fail(key, f"expected a string, number or boolean, got {describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(key, f"expected a finite number, got {value}")
        return value

    def no_nul(self, value: Any, key: KeyPath) -> None:
        """Refuse a NUL character anywhere in `value` (no command line or environment can
        carry one: the run would fail mid-sweep)."""
        if isinstance(value, str):
            if "\x00" in value:
                raise self.fail(key, "contains a NUL character (\\u0000), which no command "
                                "line or environment can carry")  # fmt: skip
        elif isinstance(value, dict):
            for k, v in value.items():
                self.no_nul(k, (*key, k))
                self.no_nul(v, (*key, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.no_nul(v, (*key, i) if value and isinstance(v, dict) else key)


def describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return type(value).__name__


def closest(name: str, allowed: tuple[str, ...]) -> str | None:
    import difflib

    found = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return found[0] if found else None
