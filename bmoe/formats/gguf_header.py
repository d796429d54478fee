"""A GGUF model's header (metadata and tensor table), read with the standard library.

Two readers need the header and nothing else. A sweep decides whether the native engine can
stream a model before any run, on a machine that may not have the engine extra installed
(:func:`read_architecture`). The embedded engine needs every tensor's name, shape, type and file
position (:func:`read_header`); the ``gguf`` package's reader would also turn every metadata
array (a tokenizer's hundreds of thousands of strings) into objects, which costs seconds and
memory the engine then holds for the whole run. Here arrays of strings and long arrays are
skipped, not read.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from bmoe.errors import BmoeError

_MAGIC = b"GGUF"
_ARCH_KEY = "general.architecture"
_STRING = 8
_ARRAY = 9
#: struct formats of the fixed-width value types (8 is a string, 9 an array).
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
#: Arrays up to this many numbers are read (per-layer values); longer ones are skipped.
ARRAY_READ_MAX = 4096
#: Bounds that keep a damaged header from asking for absurd reads.
_MAX_COUNT = 1 << 32
_MAX_STRING = 1 << 26
_MAX_DIMS = 8
DEFAULT_ALIGNMENT = 32


class _Damaged(Exception):
    pass


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table: ``offset`` is from the start of the data section."""

    name: str
    shape: tuple[int, ...]  # ne0, ne1, ... as stored
    type: int  # a ggml type number
    offset: int


@dataclass
class GgufHeader:
    """The metadata values read (scalars, strings, short numeric arrays), the tensor table and
    where the data section starts in the file."""

    fields: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0


class _Reader:
    def __init__(self, fh: BinaryIO):
        self.fh = fh

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise _Damaged("the header ends early")
        return data

    def fixed(self, kind: int) -> Any:
        fmt = "<" + _FIXED[kind]
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return int(self.fixed(4))

    def u64(self) -> int:
        return int(self.fixed(10))

    def count(self, what: str) -> int:
        n = self.u64()
        if n > _MAX_COUNT:
            raise _Damaged(f"{n} {what}")
        return n

    def string(self) -> str:
        n = self.u64()
        if n > _MAX_STRING:
            raise _Damaged(f"a string of {n} bytes")
        return self.read(n).decode("utf-8", "replace")

    def skip_string(self) -> None:
        n = self.u64()
        if n > _MAX_STRING:
            raise _Damaged(f"a string of {n} bytes")
        self.fh.seek(n, os.SEEK_CUR)

    def value(self, kind: int) -> Any:
        """A value of type `kind`; None for an array this reader skips."""
        if kind in _FIXED:
            return self.fixed(kind)
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise _Damaged(f"value type {kind}")
        item, n = self.u32(), self.count("array items")
        if item in _FIXED:
            size = struct.calcsize(_FIXED[item])
            if n > ARRAY_READ_MAX:
                self.fh.seek(size * n, os.SEEK_CUR)
                return None
            return list(struct.unpack(f"<{n}{_FIXED[item]}", self.read(size * n)))
        if item == _STRING:
            for _ in range(n):
                self.skip_string()
            return None
        raise _Damaged(f"an array of value type {item}")


def _open(path: str | os.PathLike[str]) -> BinaryIO:
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the callers)
    except OSError as exc:
        raise BmoeError(f"{path}: cannot read the model ({exc.strerror or exc})") from None
    if fh.read(4) != _MAGIC:
        fh.close()
        raise BmoeError(f"{path}: not a GGUF model (no GGUF magic)")
    return fh


def _start(r: _Reader) -> tuple[int, int]:
    version = r.u32()
    if version < 2:
        raise _Damaged(f"GGUF version {version} (2 or later is read)")
    return r.count("tensors"), r.count("metadata keys")


def read_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The header of the GGUF file at `path` (one file: a shard of a split model is read on
    its own). Raises :class:`BmoeError` naming the file when it is not a readable GGUF."""
    with _open(path) as fh:
        r = _Reader(fh)
        try:
            n_tensors, n_keys = _start(r)
            header = GgufHeader()
            for _ in range(n_keys):
                key = r.string()
                value = r.value(r.u32())
                if value is not None:
                    header.fields[key] = value
            for _ in range(n_tensors):
                name = r.string()
                n_dims = r.u32()
                if n_dims > _MAX_DIMS:
                    raise _Damaged(f"tensor {name} with {n_dims} dimensions")
                shape = tuple(r.u64() for _ in range(n_dims))
                header.tensors.append(TensorInfo(name, shape, r.u32(), r.u64()))
            alignment = int(header.fields.get("general.alignment", DEFAULT_ALIGNMENT) or 1)
            end = fh.tell()
            header.data_offset = -(-end // alignment) * alignment
        except (_Damaged, struct.error) as exc:
            raise BmoeError(f"{path}: a damaged GGUF header ({exc})") from None
    return header


def read_architecture(path: str | os.PathLike[str]) -> str | None:
    """The model's ``general.architecture`` (None when the header has none), reading only as
    far as that key. Raises :class:`BmoeError` naming the file when it is not a GGUF model."""
    with _open(path) as fh:
        r = _Reader(fh)
        try:
            _n_tensors, n_keys = _start(r)
            for _ in range(n_keys):
                key = r.string()
                kind = r.u32()
                if key == _ARCH_KEY:
                    if kind != _STRING:
                        raise _Damaged(f"{_ARCH_KEY} is not a string")
                    return r.string()
                r.value(kind)
        except (_Damaged, struct.error) as exc:
            raise BmoeError(f"{path}: a damaged GGUF header ({exc})") from None
    return None
