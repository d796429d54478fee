"""The kernels compiled ahead of time (:mod:`bmoe.compiled`) give what numba's just-in-time
compilation of the same functions gives, take only arguments of their exact types, and let
a replay run without importing numba; a process that finds them unbuilt runs the JIT and
leaves the build to one detached builder."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bmoe import compiled
from bmoe.cache.kernels import arc, batches, lru, s3fifo

ROOT = Path(__file__).resolve().parents[2]


def ahead(kernel: compiled.Kernel) -> None:
    """Build the kernel's module now (whatever $BMOE_KERNEL_BUILD says); skip, saying why,
    where this machine cannot build it."""
    if not kernel.compile_ahead():
        failed = sorted(compiled.kernel_dir().glob("*.failed"))
        reason = failed[-1].read_text(encoding="utf-8")[-300:] if failed else "BMOE_JIT is set"
        pytest.skip(f"no compiled-ahead kernels here: {reason}")


def random_batches(seed: int, n_keys: int = 300, n_b: int = 4000):
    """Batches of 1-8 distinct keys, some with a repeated id (so ``rec`` differs)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 9, size=n_b)
    bounds = np.zeros(n_b + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    look = np.concatenate(
        [rng.choice(n_keys, size=c, replace=False) for c in counts.tolist()]
    ).astype(np.int32)
    rec = look.copy()
    repeated = rng.random(n_b) < 0.2
    for b in np.flatnonzero(repeated).tolist():
        rec[bounds[b] : bounds[b + 1]] = rec[bounds[b] : bounds[b + 1]][::-1]
    size = rng.choice([3, 5], size=n_b).astype(np.int64)
    return bounds, look, rec, repeated, size


@pytest.mark.parametrize("budget", [0, 40, 200, 900])
def test_replay_kernels_ahead_equal_numba_jit(budget: int) -> None:
    bounds, look, rec, repeated, size = random_batches(budget)
    part = np.zeros(len(size), dtype=np.int64)
    runs = {
        "lru": (lru.lru_continue, (bounds, look, rec, repeated, size, part, budget),
                lambda: lru.lru_state(1, 300)),
        "s3fifo": (s3fifo.s3fifo_continue, (bounds, look, size, budget),
                   lambda: s3fifo.s3fifo_state(300)),
        "s3fifo-libcachesim": (s3fifo.s3fifo_libcachesim_continue, (bounds, look, size, budget),
                               lambda: s3fifo.s3fifo_libcachesim_state(300)),
        "arc": (arc.arc_continue, (bounds, look, rec, repeated, size, budget),
                lambda: arc.arc_state(300)),
    }  # fmt: skip
    for name, (kernel, args, state) in runs.items():
        ahead(kernel)
        fast_state, jit_state = state(), state()
        fast = kernel(*args, fast_state)
        slow = kernel.jit(*args, jit_state)
        assert fast.sum() > 0 or budget == 0, name
        np.testing.assert_array_equal(fast, slow, err_msg=name)
        for a, b in zip(fast_state, jit_state, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_batches_cut_the_same_ahead_and_jit() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    turn = np.zeros(n, dtype=np.int16)
    phase = (np.arange(n) >= 600).astype(np.int8)
    step = (np.arange(n) // 40).astype(np.int32)
    layer = ((np.arange(n) // 4) % 10).astype(np.int16)
    slot = (np.arange(n) % 4).astype(np.int8)
    expert = rng.integers(0, 16, size=n).astype(np.int16)
    resident = rng.random(n) < 0.5
    ahead(batches.cut_batches)
    key = (turn, phase, step, layer, slot, 0, 0, 0, 0, 200, 4)
    for a, b in zip(batches.batch_sort_key(*key), batches.batch_sort_key.jit(*key), strict=True):
        np.testing.assert_array_equal(a, b)
    unordered = (np.zeros(0, dtype=np.int64), turn, phase, step, layer)
    assert batches.count_batches(*unordered) == batches.count_batches.jit(*unordered)
    order = np.argsort(batches.batch_sort_key(turn, phase, step, layer, slot, 0, 0, 0, 0, 200,
                                              4)[0], kind="stable")  # fmt: skip
    n_b = batches.count_batches(order, turn, phase, step, layer)
    assert n_b == batches.count_batches.jit(order, turn, phase, step, layer)
    part_of = np.arange(10, dtype=np.int64)
    for ids in (expert, expert.astype(np.int64)):  # both signatures compiled ahead
        args = (order, turn, phase, step, layer, ids, resident, part_of, 16, n_b, 160,
                np.empty(n, dtype=np.int64))  # fmt: skip
        for a, b in zip(batches.cut_batches(*args), batches.cut_batches.jit(*args), strict=True):
            np.testing.assert_array_equal(a, b)


def test_arguments_of_other_types_take_the_jit_with_the_same_result() -> None:
    bounds, look, rec, repeated, size = random_batches(7)
    part = np.zeros(len(size), dtype=np.int64)
    ahead(lru.lru_continue)
    (matches, _), *_ = lru.lru_continue._fast
    args = (bounds, look, rec, repeated, size, part, 100, lru.lru_state(1, 300))
    assert matches(args)
    wide = (bounds, look.astype(np.int64), rec.astype(np.int64), repeated, size, part, 100,
            lru.lru_state(1, 300))  # fmt: skip
    strided = (bounds, np.repeat(look, 2)[::2], rec, repeated, size, part, 100,
               lru.lru_state(1, 300))  # fmt: skip
    short = (bounds, look, rec, repeated, size, part, 100, lru.lru_state(1, 300)[:5])
    assert not matches(wide) and not matches(strided) and not matches(short)
    assert not matches((*args[:6], 100.0, args[7])) and not matches((*args[:6], np.int32(100),
                                                                     args[7]))  # fmt: skip
    expect = lru.lru_continue(*args)
    np.testing.assert_array_equal(lru.lru_continue(*wide), expect)
    np.testing.assert_array_equal(lru.lru_continue(*strided), expect)


def test_the_build_key_covers_the_modules_a_kernel_calls() -> None:
    deps = compiled._dependencies("bmoe.cache.kernels.lru")
    assert deps[0] == "bmoe.cache.kernels.lru" and "bmoe.cache.kernels.shared" in deps
    assert compiled.build_key("bmoe.cache.kernels.lru") != compiled.build_key(
        "bmoe.cache.kernels.arc"
    )


_PROBE = """
import contextlib, io, json, sys
from bmoe.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "numba": "numba" in sys.modules,
                  "pyarrow": "pyarrow" in sys.modules, "out": out.getvalue()}))
"""


def test_a_replay_runs_without_numba(corpus: Path) -> None:
    ahead(lru.lru_continue)
    for kernel in (s3fifo.s3fifo_continue, arc.arc_continue, batches.cut_batches):
        ahead(kernel)
    argv = ["analyze", "replay", str(corpus / "route-trace/gemma.route.csv"), "--policies",
            "lru,s3fifo,arc", "--budgets", "1000,2000"]  # fmt: skip

    def probe(env: dict[str, str]) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True,
            cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **env},
        )  # fmt: skip
        return json.loads(done.stdout.strip().splitlines()[-1])

    home = {"HOME": str(Path.home()), compiled.DIR_VARIABLE: str(compiled.kernel_dir())}
    probe({**home, compiled.BUILD_VARIABLE: compiled.WAIT})  # whatever else it needs, built
    fast = probe(home)
    assert fast["code"] == 0 and not fast["numba"]
    assert not fast["pyarrow"]  # the CSV parsed by the compiled loop
    slow = probe({**home, compiled.JIT_ONLY: "1"})
    assert slow["numba"] and slow["out"] == fast["out"]


def test_every_kernel_with_examples_is_compiled_ahead() -> None:
    """Each kernel module builds: none of its entry points falls back to the JIT unseen."""
    from bmoe.cache import kernels

    kernels.kernel_specs()  # imports every policy's kernel module
    ahead(lru.lru_continue)
    entries = [
        k for name, ks in compiled._KERNELS.items() if name.startswith("bmoe.") for k in ks
        if k.ahead is not None
    ]  # fmt: skip
    assert len(entries) >= 20
    for kernel in entries:
        for example in kernel.examples():
            assert kernel.takes(*example), kernel


# ----------------------------------------------------------------------------- the first process

_TINY = """
from bmoe.compiled import arrays, njit


@njit(ahead=lambda: arrays("i8"), nogil=True)
def total(values):
    s = 0
    for v in values:
        s += v
    return s
"""

_CALL = """
import json, sys
import numpy as np
from bmoe import compiled
import tiny_kernels
total = int(tiny_kernels.total(np.arange(10, dtype=np.int64)))
print(json.dumps({"total": total, "numba": "numba" in sys.modules,
                  "wanted": list(compiled._WANTED)}))
"""


def _tiny(tmp_path: Path, **env: str) -> tuple[Path, dict[str, str]]:
    """A kernel module of one small kernel, a fresh kernel directory, and the environment of
    a process calling it (the default build mode unless `env` says otherwise)."""
    (tmp_path / "tiny_kernels.py").write_text(_TINY, encoding="utf-8")
    kernels = tmp_path / "kernels"
    base = {k: v for k, v in os.environ.items() if k not in (compiled.BUILD_VARIABLE,
                                                              compiled.JIT_ONLY)}  # fmt: skip
    path = os.pathsep.join([str(ROOT), str(tmp_path)])
    return kernels, {**base, "PYTHONPATH": path, compiled.DIR_VARIABLE: str(kernels), **env}


def _call(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CALL], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


def _outcome(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert err == ""  # nothing from the build, on either stream
    (line,) = out.splitlines()  # only what the process printed itself
    return json.loads(line)


def _builder_done(kernels: Path, timeout_s: float = 900) -> None:
    """Wait until no builder holds the kernel directory's lock."""
    deadline = time.monotonic() + timeout_s
    with open(kernels / "builder.lock", "a+b") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fh, fcntl.LOCK_UN)
                return
            except OSError:
                assert time.monotonic() < deadline, "the builder is still at work"
                time.sleep(0.5)


@pytest.mark.slow
def test_first_processes_run_the_jit_and_one_builder_builds_for_the_next(tmp_path: Path) -> None:
    kernels, env = _tiny(tmp_path)
    first = [_call(env), _call(env)]  # at once: neither waits for a build
    for outcome in map(_outcome, first):
        assert outcome == {"total": 45, "numba": True, "wanted": ["tiny_kernels"]}
    _builder_done(kernels)
    failed = sorted(kernels.glob("*.failed"))
    if failed:
        pytest.skip(f"no compiled-ahead kernels here: {failed[0].read_text()[-300:]}")
    builds = [p.name for p in kernels.glob("tiny_kernels-*") if p.is_dir()]
    assert len(builds) == 1 and "." not in builds[0].removeprefix("tiny_kernels-")  # no work left
    later = _outcome(_call(env))
    assert later == {"total": 45, "numba": False, "wanted": []}


def test_a_failed_build_is_not_tried_again(tmp_path: Path) -> None:
    """Without a C compiler the builder records why it failed; later processes run the JIT
    and ask for no build."""
    kernels, env = _tiny(tmp_path, CC=str(tmp_path / "no-such-compiler"))
    assert _outcome(_call(env))["wanted"] == ["tiny_kernels"]
    _builder_done(kernels)
    (failed,) = kernels.glob("tiny_kernels-*.failed")
    assert failed.read_text(encoding="utf-8")
    assert _outcome(_call(env)) == {"total": 45, "numba": True, "wanted": []}


def test_never_asks_for_no_build(tmp_path: Path) -> None:
    """BMOE_KERNEL_BUILD=never: the JIT, and no build asked for (=wait, the tests' mode, is
    what :func:`ahead` relies on)."""
    kernels, env = _tiny(tmp_path, **{compiled.BUILD_VARIABLE: compiled.NEVER})
    assert _outcome(_call(env)) == {"total": 45, "numba": True, "wanted": []}
    assert not list(kernels.glob("tiny_kernels*"))
