"""The kernels compiled ahead of time (:mod:`bmoe.compiled`) give what numba's just-in-time
compilation of the same functions gives, take only arguments of their exact types, and let
a replay run without importing numba."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bmoe import compiled
from bmoe.cache.kernels import arc, batches, lru, s3fifo

ROOT = Path(__file__).resolve().parents[2]


def ahead(kernel: compiled.Kernel) -> None:
    """Skip, saying why, where this machine cannot build the compiled modules."""
    if kernel._fast is None:
        kernel._fast = kernel._compiled_ahead()
    if not kernel._fast:
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
print(json.dumps({"code": code, "numba": "numba" in sys.modules, "out": out.getvalue()}))
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
    fast = probe(home)
    assert fast["code"] == 0 and not fast["numba"]
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
