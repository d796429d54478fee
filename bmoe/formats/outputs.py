"""The one check before a command writes a file: never over one of its inputs, and over an
existing file only when asked (``--force``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from bmoe.formats.errors import FormatError


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` name one file (links and relative spellings included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_output(
    dest: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), *, force: bool = False
) -> Path:
    """`dest` as a Path when a command may write it: refused when it is one of `inputs`
    (whatever `force` says) or, without `force`, when it exists already."""
    dest = Path(dest)
    for source in inputs:
        if same_file(dest, source):
            raise FormatError(str(dest), None, "is also an input of this command; not overwritten")
    if dest.is_dir():
        raise FormatError(str(dest), None, "is a directory; name a file to write")
    if not force and (dest.exists() or dest.is_symlink()):
        raise FormatError(str(dest), None, "exists; pass --force to overwrite it")
    return dest
