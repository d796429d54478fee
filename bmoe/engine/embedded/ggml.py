"""ctypes views of ggml tensors: the one place that knows ``struct ggml_tensor``'s layout.

The layout below is the one in ``ggml/include/ggml.h`` of the ggml bundled with
llama-cpp-python 0.3.36 (``GGML_MAX_DIMS`` 4, ``GGML_MAX_SRC`` 10, ``GGML_MAX_OP_PARAMS`` 64,
``GGML_MAX_NAME`` 64). :func:`check_layout` verifies it against the loaded library before the
engine touches a real tensor: it builds tensors with ggml's own functions and checks that every
field this module reads lands where ggml put it. A mismatch is a clear error, never a crash.
"""

from __future__ import annotations

import ctypes
import functools
import re
from typing import Any

import numpy as np

from bmoe.errors import BmoeError

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor``."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


#: Byte offsets the hot path reads with raw pointer arithmetic.
NAME_OFFSET = GgmlTensor.name.offset
DATA_OFFSET = GgmlTensor.data.offset
NE_OFFSET = GgmlTensor.ne.offset
NB_OFFSET = GgmlTensor.nb.offset
OP_OFFSET = GgmlTensor.op.offset
SRC_OFFSET = GgmlTensor.src.offset

#: ggml_type values the engine needs to know by name.
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26

_LAYER_SUFFIX = re.compile(r"-(\d+)$")


class _InitParams(ctypes.Structure):
    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


@functools.cache
def lib() -> ctypes.CDLL:
    """libggml as loaded by llama-cpp-python, with the prototypes this module calls."""
    from llama_cpp import _ggml

    g = _ggml.libggml
    g.ggml_op_name.restype = ctypes.c_char_p
    g.ggml_op_name.argtypes = [ctypes.c_int]
    g.ggml_op_desc.restype = ctypes.c_char_p
    g.ggml_op_desc.argtypes = [ctypes.c_void_p]
    g.ggml_nbytes.restype = ctypes.c_size_t
    g.ggml_nbytes.argtypes = [ctypes.c_void_p]
    g.ggml_tensor_overhead.restype = ctypes.c_size_t
    g.ggml_init.restype = ctypes.c_void_p
    g.ggml_init.argtypes = [_InitParams]
    g.ggml_free.argtypes = [ctypes.c_void_p]
    g.ggml_new_tensor_3d.restype = ctypes.c_void_p
    g.ggml_new_tensor_3d.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_int64] * 3
    g.ggml_set_name.restype = ctypes.c_void_p
    g.ggml_set_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    g.ggml_add.restype = ctypes.c_void_p
    g.ggml_add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    g.ggml_view_1d.restype = ctypes.c_void_p
    g.ggml_view_1d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t]
    g.ggml_get_data.restype = ctypes.c_void_p
    g.ggml_get_data.argtypes = [ctypes.c_void_p]
    return g


@functools.cache
def check_layout() -> None:
    """Verify :class:`GgmlTensor` against the loaded ggml; raise :class:`BmoeError` if off."""
    g = lib()
    problems: list[str] = []
    ctx = g.ggml_init(_InitParams(1 << 20, None, False))
    if not ctx:
        raise BmoeError("ggml: cannot create a scratch context to verify the tensor layout")
    try:
        a = g.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 3, 5, 7)
        g.ggml_set_name(a, b"bmoe-probe")
        ta = tensor(a)
        if tuple(ta.ne) != (3, 5, 7, 1):
            problems.append(f"ne reads {tuple(ta.ne)}")
        if tuple(ta.nb) != (4, 12, 60, 420):
            problems.append(f"nb reads {tuple(ta.nb)}")
        if ta.name != b"bmoe-probe":
            problems.append(f"name reads {ta.name!r}")
        if ta.data != g.ggml_get_data(a) or not ta.data:
            problems.append("data pointer does not match ggml_get_data")
        if ta.type != GGML_TYPE_F32:
            problems.append(f"type reads {ta.type}")
        s = g.ggml_add(ctx, a, a)
        ts = tensor(s)
        if ts.src[0] != a or ts.src[1] != a or ts.src[2]:
            problems.append("src[] does not point at the operands")
        if op_name(ts.op) != "ADD":
            problems.append(f"op reads {op_name(ts.op)!r}")
        v = g.ggml_view_1d(ctx, a, 2, 8)
        tv = tensor(v)
        if tv.view_src != a or tv.view_offs != 8 or tv.data != ta.data + 8:
            problems.append("view_src / view_offs / data of a view are off")
        if g.ggml_nbytes(a) != 420:
            problems.append("ggml_nbytes disagrees")
    finally:
        g.ggml_free(ctx)
    if problems:
        raise BmoeError(
            "this ggml build's struct ggml_tensor differs from the layout bmoe knows ("
            + "; ".join(problems)
            + "): the embedded engine cannot stream with it"
        )


def tensor(address: int) -> GgmlTensor:
    """The struct at `address` (a live view: writes go to ggml's memory)."""
    return GgmlTensor.from_address(address)


def name_of(address: int) -> bytes:
    return ctypes.string_at(address + NAME_OFFSET)


@functools.cache
def op_name(op: int) -> str:
    return (lib().ggml_op_name(op) or b"?").decode()


def op_desc(address: int) -> str:
    """The operator of a node as the compute trace prints it (``MUL_MAT``, ``GLU``...)."""
    return op_name(tensor(address).op)


def nbytes(address: int) -> int:
    return int(lib().ggml_nbytes(address))


def layer_of(name: str) -> int:
    """The layer a node name's ``-<il>`` suffix names, or -1."""
    m = _LAYER_SUFFIX.search(name)
    return int(m.group(1)) if m else -1


def set_data(address: int, data: int) -> None:
    """Point tensor `address` at `data` (the rebinding)."""
    tensor(address).data = data


def read_rows(address: int, dtype: Any) -> np.ndarray:
    """A copy of a materialised 2-D tensor (``ne0`` x ``ne1``, row stride ``nb1``) as
    (ne1, ne0), e.g. the routed ids ``ffn_moe_topk`` (a strided view of the argsort); the fast
    path the routing callback takes once per layer."""
    t = GgmlTensor.from_address(address)
    k, n, nb1 = t.ne[0], t.ne[1], t.nb[1]
    item = np.dtype(dtype).itemsize
    if k == 0 or n == 0 or not t.data:
        return np.zeros((n, k), dtype=dtype)
    if n == 1 or nb1 == k * item:
        raw = ctypes.string_at(t.data, n * k * item)
        return np.frombuffer(raw, dtype=dtype).reshape(n, k)
    raw = ctypes.string_at(t.data, (n - 1) * nb1 + k * item)
    flat = np.frombuffer(raw, dtype=dtype)
    return np.lib.stride_tricks.as_strided(flat, (n, k), (nb1, item)).copy()


def as_array(address: int, dtype: Any) -> np.ndarray:
    """A numpy view of a materialised tensor (shape = reversed ``ne``, strides = ``nb``)."""
    t = tensor(address)
    ne = list(t.ne)
    nb = list(t.nb)
    dims = GGML_MAX_DIMS
    while dims > 1 and ne[dims - 1] == 1:
        dims -= 1
    shape = tuple(reversed(ne[:dims]))
    strides = tuple(reversed(nb[:dims]))
    if any(n == 0 for n in shape) or not t.data:
        return np.zeros(shape, dtype=dtype)
    extent = (
        sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + np.dtype(dtype).itemsize
    )
    raw = (ctypes.c_char * extent).from_address(t.data)
    return np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides)
