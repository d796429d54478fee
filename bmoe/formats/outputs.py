"""The one check before a command writes a file the user named: never over one of its
inputs (a link to an input, or another name of it, counts as the input), and over an existing
file only when asked (``--force``).

Every command that writes goes through :func:`check_output` (or :func:`check_outputs` for
several files) before it does any work; ``tests/formats/test_outputs.py`` enumerates the commands'
path options and fails on a writer that is not checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from bmoe.formats.errors import FormatError

PathLike = str | os.PathLike


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether `a` and `b` name one file (links and relative spellings included)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        try:
            return Path(a).resolve() == Path(b).resolve()
        except (OSError, RuntimeError, ValueError):  # a link loop
            return os.path.abspath(a) == os.path.abspath(b)


def _inside(dest: Path, folder: PathLike) -> bool:
    """Whether `dest` is an existing file under input folder `folder` (one the command may
    read)."""
    try:
        if not (os.path.isdir(folder) and dest.exists()):
            return False
        return Path(folder).resolve() in dest.resolve().parents
    except (OSError, RuntimeError, ValueError):  # a link loop
        return False


def check_output(
    dest: PathLike, inputs: Iterable[PathLike | None] = (), *, force: bool = False
) -> Path:
    """`dest` as a Path when a command may write it: refused when it is one of `inputs`, or
    an existing file inside an input folder (whatever `force` says), or, without `force`,
    when it exists already (a dangling link too); a directory is never a file to write."""
    dest = Path(dest)
    for source in inputs:
        if source is not None and (same_file(dest, source) or _inside(dest, source)):
            raise FormatError(str(dest), None, "is also an input of this command; not overwritten")
    if dest.is_dir():
        raise FormatError(str(dest), None, "is a directory; name a file to write")
    if not force and (dest.exists() or dest.is_symlink()):
        raise FormatError(str(dest), None, "exists; pass --force to overwrite it")
    return dest


def check_outputs(
    dests: Iterable[PathLike | None], inputs: Iterable[PathLike | None] = (), *, force: bool = False
) -> list[Path]:
    """:func:`check_output` of every file a command will write (None: not asked for), and no
    two of them one file."""
    sources = [s for s in inputs if s is not None]
    checked: list[Path] = []
    for dest in dests:
        if dest is None or dest == "":
            continue
        path = check_output(dest, sources, force=force)
        for other in checked:
            if same_file(path, other):
                raise FormatError(str(path), None, f"is also the output {other}; name two files")
        checked.append(path)
    return checked
