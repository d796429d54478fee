"""Compiled kernels that a process calls without loading numba.

numba costs a process about 0.35 CPU-s before its first compiled call, even when every
kernel is in its disk cache (importing it, then its typing and lowering registries), which
is more than a short command spends on its work. So the kernel modules decorate their loops
with this module's :func:`njit` (numba's options) instead of numba's:

- A function given ``ahead=`` is an entry point that Python calls. ``ahead`` returns example
  arguments (a list of such tuples for several signatures): their types are the signatures
  compiled ahead of time, with numba's ``pycc``, into one extension module per kernel module,
  built on the first call in any process (a minute at most, once) and kept in
  :func:`kernel_dir`. Later processes load it as a plain extension module: no numba.
- A call whose arguments are of those types (dtype, dimensions, C order; exactly) runs the
  compiled module; any other call, a machine without a C compiler or ``setuptools``, or
  ``BMOE_JIT=1`` in the environment, runs numba's just-in-time compilation of the same
  function as before (numba imported then, its own disk cache used). Both compile the same
  source with the same options, so they give the same results.
- A function without ``ahead`` (an inlined helper, a rarely used kernel) is compiled by numba
  when first called or when a kernel that calls it is compiled.

A build is keyed by the source of the kernel module and of every module whose kernels it
calls, this file, the versions of numba, llvmlite and Python and the CPU's features: a change
to any of them builds again. Numba's intrinsics that a kernel calls are named with
:func:`numba_global` (numba is imported only to compile).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: kernel module name -> its kernels, in definition order
_KERNELS: dict[str, list[Kernel]] = {}
#: kernel module name -> its loaded extension module (None: none can be had)
_EXTENSIONS: dict[str, Any] = {}
#: set in the environment to run every kernel through numba's JIT
JIT_ONLY = "BMOE_JIT"
#: where the compiled modules go (default: the user's cache directory)
DIR_VARIABLE = "BMOE_KERNEL_DIR"
#: a build that takes longer is given up (the JIT runs instead)
BUILD_TIMEOUT_S = 900
#: builds of a module not loaded for this long are removed when it is built again (several
#: checkouts of different sources may share the directory)
STALE_S = 30 * 86400


def njit(**options: Any) -> Callable[[Callable], Kernel]:
    """numba's ``njit`` with these `options`, compiled when first needed; with `ahead` (a
    callable giving example arguments, or a list of argument tuples) also compiled ahead of
    time for those argument types (see the module docstring)."""

    ahead = options.pop("ahead", None)

    def wrap(f: Callable) -> Kernel:
        return Kernel(f, options, ahead)

    return wrap


def arrays(codes: str) -> tuple[np.ndarray, ...]:
    """Example arrays for ``ahead``, one per numpy type code in `codes` (``"i8 i4 b1"``); a
    code ending in ``[:,:]`` makes a 2-d array."""
    out = []
    for code in codes.split():
        two = code.endswith("[:,:]")
        out.append(np.zeros((1, 1) if two else 1, dtype=np.dtype(code.removesuffix("[:,:]"))))
    return tuple(out)


def numba_global(module: str, name: str) -> Any:
    """A numba object (an intrinsic such as ``numba.cpython.unsafe.numbers.trailing_zeros``)
    for kernels to call, imported only when a kernel is compiled."""
    return _NumbaGlobal(module, name)


class _NumbaGlobal:
    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    @property
    def _numba_type_(self) -> Any:
        from numba.core.registry import cpu_target

        value = getattr(importlib.import_module(self.module), self.name)
        return cpu_target.typing_context.resolve_value_type(value)


class Kernel:
    """A numba function compiled when first needed: ahead of time for the argument types of
    its examples, just in time for any other."""

    def __init__(
        self, func: Callable, options: dict[str, Any], ahead: Callable[[], Any] | None
    ) -> None:
        functools.update_wrapper(self, func)
        self.py_func = func
        self.options = options
        self.ahead = ahead
        self._dispatcher: Any = None
        self._fast: list[tuple[Callable[[tuple], bool], Callable]] | None = None
        _KERNELS.setdefault(func.__module__, []).append(self)

    def __call__(self, *args: Any) -> Any:
        fast = self._fast
        if fast is None:
            fast = self._fast = self._compiled_ahead()
        for matches, call in fast:
            if matches(args):
                return call(*args)
        return self.jit(*args)

    def __repr__(self) -> str:
        return f"<kernel {self.py_func.__module__}.{self.py_func.__qualname__}>"

    @property
    def jit(self) -> Any:
        """numba's dispatcher of the function (numba imported on first use)."""
        if self._dispatcher is None:
            import numba

            self._dispatcher = numba.njit(**self.options)(self.py_func)
        return self._dispatcher

    @property
    def _numba_type_(self) -> Any:
        # a kernel calling this one is typed as calling numba's dispatcher of it
        return self.jit._numba_type_

    def examples(self) -> list[tuple]:
        """The argument tuples of the signatures compiled ahead (none without `ahead`)."""
        if self.ahead is None:
            return []
        found = self.ahead()
        return [tuple(a) for a in found] if isinstance(found, list) else [tuple(found)]

    def takes(self, *args: Any) -> bool:
        """Whether code compiled ahead takes these arguments (a caller with a numpy way of
        its own can take that instead of numba's JIT)."""
        fast = self._fast
        if fast is None:
            fast = self._fast = self._compiled_ahead()
        return any(matches(args) for matches, _ in fast)

    def export_name(self, i: int) -> str:
        return f"{self.py_func.__name__}__{i}"

    def _compiled_ahead(self) -> list[tuple[Callable[[tuple], bool], Callable]]:
        examples = self.examples()
        if not examples or os.environ.get(JIT_ONLY):
            return []
        module = extension(self.py_func.__module__)
        if module is None:
            return []
        return [
            (matcher(ex), getattr(module, self.export_name(i))) for i, ex in enumerate(examples)
        ]


# ----------------------------------------------------------------------------- matching


def matcher(example: tuple) -> Callable[[tuple], bool]:
    """A test that arguments have exactly the types of `example`'s (what the compiled code
    takes without checking)."""
    checks = [_check(a) for a in example]
    n = len(checks)

    def matches(args: tuple) -> bool:
        return len(args) == n and all(c(a) for c, a in zip(checks, args, strict=True))

    return matches


def _check(example: Any) -> Callable[[Any], bool]:
    if isinstance(example, np.ndarray):
        dtype, ndim = example.dtype, example.ndim
        return lambda a: (
            type(a) is np.ndarray and a.dtype == dtype and a.ndim == ndim and a.flags.c_contiguous
        )
    if isinstance(example, tuple):
        kind = type(example)
        items = [_check(x) for x in example]
        return lambda a: (
            type(a) is kind
            and len(a) == len(items)
            and all(c(x) for c, x in zip(items, a, strict=True))
        )
    if isinstance(example, bool | np.bool_):
        return lambda a: isinstance(a, bool | np.bool_)
    if isinstance(example, int | np.int64):
        return lambda a: (type(a) is int and -(1 << 63) <= a < (1 << 63)) or type(a) is np.int64
    if isinstance(example, float | np.float64):
        return lambda a: type(a) is float or type(a) is np.float64
    raise TypeError(f"no compiled-ahead argument type for {type(example).__name__}")


# ----------------------------------------------------------------------------- building, loading


def kernel_dir() -> Path:
    """Where the compiled modules are kept: ``$BMOE_KERNEL_DIR``, else ``bmoe/kernels`` in
    the user's cache directory (``$XDG_CACHE_HOME``, ``~/.cache``)."""
    given = os.environ.get(DIR_VARIABLE)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bmoe" / "kernels"


def _extension_name(module: str) -> str:
    return "_bmoe_ahead_" + module.replace(".", "_")


def _dependencies(module: str) -> list[str]:
    """`module` and every module whose kernels its kernels call, directly or not."""
    found = [module]
    for name in found:
        for kernel in _KERNELS.get(name, []):
            for value in kernel.py_func.__globals__.values():
                if isinstance(value, Kernel) and value.py_func.__module__ not in found:
                    found.append(value.py_func.__module__)
    return found


def _package_file(package: str, name: str) -> bytes:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(package)
    return Path(next(iter(spec.submodule_search_locations)), name).read_bytes()


@functools.cache
def _machine() -> bytes:
    """What the compiled code depends on besides its source: Python, numba, llvmlite, the
    platform and (Linux) the CPU's features."""
    parts = [sys.version.encode(), platform.platform().encode(), platform.machine().encode()]
    parts += [_package_file("numba", "_version.py"), _package_file("llvmlite", "_version.py")]
    with contextlib.suppress(OSError), open("/proc/cpuinfo", "rb") as fh:
        for line in fh:
            if line.startswith((b"flags", b"model name")):
                parts.append(line)
            if line.strip() == b"":
                break
    parts.append(Path(__file__).read_bytes())
    return b"\0".join(parts)


def build_key(module: str) -> str:
    """The digest a build of `module` is kept under (see the module docstring)."""
    digest = hashlib.sha256(_machine())
    for name in _dependencies(module):
        digest.update(name.encode())
        digest.update(Path(sys.modules[name].__file__ or "").read_bytes())
    return digest.hexdigest()[:20]


def extension(module: str) -> Any:
    """The compiled module of kernel module `module`, built first if there is none; None
    when it cannot be built here (the reason is kept in a ``.failed`` file beside it)."""
    if module in _EXTENSIONS:
        return _EXTENSIONS[module]
    found = None
    try:
        found = _load_or_build(module)
    except (OSError, ImportError, subprocess.SubprocessError):
        found = None
    _EXTENSIONS[module] = found
    return found


def _load_or_build(module: str) -> Any:
    key = build_key(module)
    root = kernel_dir()
    home = root / f"{module}-{key}"
    name = _extension_name(module)
    built = home / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    failed = root / f"{module}-{key}.failed"
    if not built.exists():
        if failed.exists():
            return None
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / f"{module}.lock"):
            if not built.exists() and not failed.exists():
                _build(module, key, home, failed)
        if not built.exists():
            return None
    with contextlib.suppress(OSError):  # loaded now: not stale
        os.utime(home / "manifest.json")
    loader = importlib.machinery.ExtensionFileLoader(name, str(built))
    spec = importlib.util.spec_from_file_location(name, built, loader=loader)
    assert spec is not None
    loaded = importlib.util.module_from_spec(spec)
    loader.exec_module(loaded)
    return loaded


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (a build at a time; others wait for it and load it)."""
    with open(path, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # not on POSIX: builds may race, each in its own directory
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(module: str, key: str, home: Path, failed: Path) -> None:
    """Build `module`'s compiled module (of build key `key`) into `home` in a child process
    that imports this bmoe (its compiler's output and memory stay there); on failure write
    why to `failed`."""
    work = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=home.parent))
    package_root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bmoe.compiled", module, str(work), key],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            env={**os.environ, JIT_ONLY: "1", "PYTHONPATH": path},
            check=False,
        )
        if done.returncode != 0:
            failed.write_text((done.stderr or done.stdout)[-4000:], encoding="utf-8")
            return
        _prune(module)
        os.replace(work, home)
    except subprocess.TimeoutExpired:
        failed.write_text(f"the build took over {BUILD_TIMEOUT_S} s", encoding="utf-8")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prune(module: str) -> None:
    """Remove the builds of `module` not loaded for :data:`STALE_S`."""
    import time

    for old in kernel_dir().glob(f"{module}-*"):
        try:
            if old.is_dir() and time.time() - (old / "manifest.json").stat().st_mtime > STALE_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            continue


def _compile(module: str, out: Path, key: str) -> None:
    """Compile the kernels of `module` that have examples into an extension module in `out`
    (the child process of :func:`_build`), if its build key is `key`."""
    import warnings

    warnings.simplefilter("ignore")  # pycc's pending deprecation, distutils' notices
    imported = importlib.import_module(module)
    if build_key(module) != key:
        raise SystemExit(f"{module} changed while it was being built")
    import numba
    import numba.pycc.compiler as pycc_compiler
    from numba.core import compiler, typed_passes
    from numba.core.registry import cpu_target
    from numba.pycc import CC

    plain_flags = pycc_compiler.Flags

    def flags() -> Any:  # the kernels release the GIL, as numba's njit(nogil=True) does
        made = plain_flags()
        made.release_gil = True
        return made

    pycc_compiler.Flags = flags
    cc = CC(_extension_name(module), source_module=imported)
    cc.output_dir = str(out)
    cc.verbose = False
    if sys.platform.startswith("linux"):
        cc.target_cpu = "host"  # the key holds the CPU's features
    typing, target = cpu_target.typing_context, cpu_target.target_context
    typing.refresh()
    target.refresh()
    exported = []
    for kernel in _KERNELS.get(module, []):
        for i, example in enumerate(kernel.examples()):
            argtypes = tuple(numba.typeof(a) for a in example)
            interp = compiler.run_frontend(kernel.py_func)
            typed = typed_passes.type_inference_stage(typing, target, interp, argtypes, None)
            cc.export(kernel.export_name(i), typed.return_type(*argtypes))(kernel.py_func)
            exported.append(kernel.export_name(i))
    cc.compile()
    manifest = {"module": module, "key": build_key(module), "exports": exported}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")


if __name__ == "__main__":  # the registry is the imported module's, not this script's
    importlib.import_module("bmoe.compiled")._compile(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
