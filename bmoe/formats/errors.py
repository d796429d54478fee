"""Errors and warnings raised while reading telemetry files.

Every problem names the file and, where it can, the 1-based line, so the CLI can print one
line (``file:line: problem``) instead of a traceback.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from bmoe.errors import BmoeError


def location(path: str | None, line: int | None = None) -> str:
    where = path or "<input>"
    return f"{where}:{line}" if line else where


class FormatError(BmoeError, ValueError):
    """A file that cannot be read as the format it claims (or was asked) to be."""

    def __init__(self, path: str | None, line: int | None, problem: str):
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(f"{location(path, line)}: {problem}")


class FormatWarning(UserWarning):
    """A recoverable problem: the good rows were kept, something was dropped or is suspect."""


@dataclass(frozen=True)
class Finding:
    """One validation finding (also used for reader warnings kept on the parsed object)."""

    severity: str  # "error" | "warning"
    path: str | None
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{location(self.path, self.line)}: {self.severity}: {self.message}"


def warn(path: str | None, line: int | None, message: str) -> str:
    """Emit a FormatWarning and return its text (readers also keep it on the result)."""
    text = f"{location(path, line)}: {message}"
    warnings.warn(text, FormatWarning, stacklevel=3)
    return text
