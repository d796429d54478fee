"""A module imported on first use of one of its names.

Reading a plain route trace needs no pyarrow (:mod:`bmoe.formats.numeric_csv` parses it), and
importing pyarrow costs a short command ~35 ms of CPU; the readers that fall back to it, or
read Parquet, name it as ``pa = lazy_module("pyarrow")`` and import it when they use it.
"""

from __future__ import annotations

import importlib
from typing import Any


class _Lazy:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


def lazy_module(name: str) -> Any:
    """The module `name`, imported when one of its attributes is first read."""
    return _Lazy(name)
