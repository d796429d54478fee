"""Numeric columns kept on disk while a long computation needs them: a scratch folder of raw
binary files (one per column, native byte order, no header), appended to, read back by
slice and written in place. An out-of-core replay keeps its lookups here instead of in
memory (:class:`bmoe.analyze.replay_stream.SpillStore` is what it takes); the caller owns
the folder's life (``with SpillFolder() as spill: ...``), which is made at the first write
under the system's temporary folder (``TMPDIR``) and removed on leaving.
"""

from __future__ import annotations

import tempfile
from types import TracebackType

import numpy as np


class SpillFolder:
    """Columns by name in a temporary folder; see the module's text."""

    def __init__(self, prefix: str = "bmoe-spill-") -> None:
        self.prefix = prefix
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def where(self) -> str:
        """The folder's path (made when first asked for)."""
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix=self.prefix)
        return self._dir.name

    def path(self, name: str) -> str:
        return f"{self.where}/{name}"

    def append(self, name: str, values: np.ndarray) -> None:
        """Add `values` at the end of column `name` (OSError when the disk refuses)."""
        with open(self.path(name), "ab") as fh:
            fh.write(np.ascontiguousarray(values).tobytes())

    def read(self, name: str, dtype: np.dtype, start: int, n: int) -> np.ndarray:
        """`n` values of column `name` from value `start`."""
        dtype = np.dtype(dtype)
        return np.fromfile(self.path(name), dtype=dtype, count=n, offset=start * dtype.itemsize)

    def reserve(self, name: str, dtype: np.dtype, n: int) -> None:
        """Column `name` made (or remade) `n` zero values long, to be written in place."""
        with open(self.path(name), "wb") as fh:
            fh.truncate(n * np.dtype(dtype).itemsize)

    def write(self, name: str, start: int, values: np.ndarray) -> None:
        """`values` written over column `name` from value `start`."""
        with open(self.path(name), "r+b") as fh:
            fh.seek(start * values.dtype.itemsize)
            fh.write(np.ascontiguousarray(values).tobytes())

    def close(self) -> None:
        """Remove the folder and its files."""
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> SpillFolder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["SpillFolder"]
