"""The kernel package's own rules: every policy's kernels are found from its live class, its
state is named, its whole-trace call is the driver's one-chunk replay, numba's on-disk cache
is invalidated when the shared structures change, and the analysis names no policy."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze import replay as rp
from bmoe.cache import POLICIES
from bmoe.cache import kernels as k
from bmoe.formats.route import RouteTrace

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "bmoe" / "cache" / "kernels"


def test_every_policy_has_kernels_naming_its_live_class() -> None:
    specs = k.kernel_specs()
    assert list(specs) == list(POLICIES)
    for name, spec in specs.items():
        assert spec.live is POLICIES[name]
        assert spec.name == name
        family = spec.live.__module__.rsplit(".", 1)[-1]
        assert (KERNELS / f"{family}.py").is_file(), name


def test_states_are_named_and_their_per_key_arrays_hold_a_slot_per_key() -> None:
    for name, spec in k.kernel_specs().items():
        state = spec.new(k.Setup(n_keys=10, n_parts=3, seed=1))
        assert state._fields, name
        for field in spec.per_key:
            assert len(getattr(state, field)) >= 10, (name, field)


def test_an_unknown_policy_is_an_error_naming_it() -> None:
    from bmoe.errors import BmoeError

    with pytest.raises(BmoeError, match="'lru2'"):
        k.kernel_spec("lru2")


def _trace(seed: int) -> RouteTrace:
    rng = np.random.default_rng(seed)
    rows = [(0, 1, s, layer, slot, int(rng.integers(0, 9)))
            for s in range(60) for layer in range(3) for slot in range(3)]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["turn", "phase", "step", "layer", "slot", "expert"])
    table = pd.DataFrame({"layer": [0, 1, 2], "expert_bytes": [3, 5, 4]})
    return RouteTrace(None, 1, {"n_layer": 3, "n_expert": 9, "n_expert_used": 3}, table, frame)


def _whole_trace_calls(b: rp.ReplayBatches, budget: int) -> dict[str, Callable[[], np.ndarray]]:
    """Each policy's whole-trace call on the batches `b` (its own arguments, so by hand)."""
    from bmoe.cache.kernels import (
        arc,
        belady,
        clock,
        fifo,
        lfu,
        lfuda,
        lru,
        randomized,
        s3fifo,
        sieve,
    )

    one = np.zeros(len(b), dtype=np.int64)
    shift = k.counter_bits(len(b.look))
    return {
        "lru": lambda: lru.lru(b.bounds, b.look, b.rec, b.repeated, b.size, one, 1, b.n_keys,
                               budget),
        "layer": lambda: lru.lru(b.bounds, b.look, b.rec, b.repeated, b.size, b.part, b.n_parts,
                                 b.n_keys, budget // 3),
        "lfu": lambda: lfu.lfu(b.bounds, b.look, b.rec, b.repeated, b.size, one, 1, b.n_keys,
                               budget, True),
        "lfu-incache": lambda: lfu.lfu(b.bounds, b.look, b.rec, b.repeated, b.size, one, 1,
                                       b.n_keys, budget, False),
        "layerlfu": lambda: lfu.lfu(b.bounds, b.look, b.rec, b.repeated, b.size, b.part,
                                    b.n_parts, b.n_keys, budget // 3, True),
        "belady": lambda: belady.belady(b.bounds, b.look, b.size, b.next_use_flat, b.n_keys,
                                        budget, shift),
        "lfuda": lambda: lfuda.lfuda(b.bounds, b.look, b.rec, b.repeated, b.size, b.n_keys,
                                     budget, shift),
        "lfuda-libcachesim": lambda: lfuda.lfuda_libcachesim(b.bounds, b.look, b.rec,
                                                             b.repeated, b.size, b.n_keys,
                                                             budget, shift)[0],
        "arc": lambda: arc.arc(b.bounds, b.look, b.rec, b.repeated, b.size, b.n_keys, budget),
        "s3fifo": lambda: s3fifo.s3fifo(b.bounds, b.look, b.size, b.n_keys, budget),
        "s3fifo-libcachesim": lambda: s3fifo.s3fifo_libcachesim(b.bounds, b.look, b.size,
                                                                b.n_keys, budget),
        "random": lambda: randomized.randomized(b.bounds, b.look, b.size, b.n_keys, budget,
                                                *k.mt_state(0)),
        "sieve": lambda: sieve.sieve(b.bounds, b.look, b.size, b.n_keys, budget),
        "clock": lambda: clock.clock(b.bounds, b.look, b.size, b.n_keys, budget),
        "fifo": lambda: fifo.fifo(b.bounds, b.look, b.size, b.n_keys, budget),
    }  # fmt: skip


@pytest.mark.parametrize("budget", [0, 10, 40, 90])
def test_the_whole_trace_calls_are_the_driver_fed_one_chunk(budget: int) -> None:
    """Every registered policy's whole-trace call (an empty state, then the continue step)
    gives the hits of :func:`~bmoe.analyze.replay.simulate`, which feeds the driver one
    chunk."""
    b = rp.prepare_batches(_trace(budget))
    whole = _whole_trace_calls(b, budget)
    assert [p for p in POLICIES if p not in whole] == [], "add its call to _whole_trace_calls"
    total = 0
    for name in POLICIES:
        hits = whole[name]()
        assert hits.tolist() == rp.simulate(b, name, budget).tolist(), name
        total += int(hits.sum())
    assert total > 0 or budget == 0


def _stamp() -> str:
    return hashlib.sha256((KERNELS / "shared.py").read_bytes()).hexdigest()[:12]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_modules_compiled_with_the_shared_structures_carry_their_stamp() -> None:
    """numba's on-disk cache of a function is invalidated when the function's own file
    changes, not when a file it inlines from does. So every module that imports from
    ``shared.py`` carries ``SHARED_STAMP``, the digest of ``shared.py``: a change there fails
    this test until each stamp is updated, and that edit recompiles each module."""
    users = [p for p in sorted(KERNELS.glob("*.py")) if "bmoe.cache.kernels.shared" in _imports(p)]
    assert len(users) >= 8
    for path in users:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stamps = [
            n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "SHARED_STAMP" for t in n.targets)
            and isinstance(n.value, ast.Constant)
        ]
        assert stamps == [_stamp()], f"{path.name}: SHARED_STAMP is not {_stamp()!r}"


def test_compiled_modules_take_compiled_code_from_the_shared_module_only() -> None:
    """A module with compiled functions imports compiled helpers from ``shared.py`` alone
    (the stamp covers that one file); other kernel modules it may call from Python."""
    plain = {"bmoe.cache.kernels.base", "bmoe.cache.kernels.shared"}
    for path in sorted(KERNELS.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        if "@njit" not in source:
            continue
        siblings = {m for m in _imports(path) if m.startswith("bmoe.cache.kernels")}
        assert siblings <= plain, f"{path.name} imports {sorted(siblings - plain)}"


@pytest.mark.slow
def test_numba_keeps_a_stale_inlined_helper_until_the_callers_file_changes(tmp_path) -> None:
    """Why the stamp: a cached function that inlines a helper from another file keeps the
    helper's old code after that file changes; editing the caller's file (as a stamp
    update does) recompiles it."""
    (tmp_path / "helper.py").write_text(
        textwrap.dedent("""
        from numba import njit
        @njit(cache=True, inline="always")
        def value():
            return 1
    """)
    )
    (tmp_path / "caller.py").write_text(
        textwrap.dedent("""
        from numba import njit
        from helper import value
        STAMP = "a"
        @njit(cache=True)
        def call():
            return value()
    """)
    )
    run = [sys.executable, "-c", "import caller; print(caller.call())"]

    def result() -> str:
        return subprocess.run(run, cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    assert result() == "1"
    (tmp_path / "helper.py").write_text((tmp_path / "helper.py").read_text().replace("1", "2"))
    assert result() == "1"  # stale: numba checked caller.py only
    caller = tmp_path / "caller.py"
    caller.write_text(caller.read_text().replace('STAMP = "a"', 'STAMP = "b"'))
    assert result() == "2"


def _constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]  # fmt: skip


def test_the_analysis_names_no_policy() -> None:
    """The replay finds a policy's kernels and traits through the registry
    (import-linter forbids ``bmoe.analyze`` to import a kernel module); no string in
    ``bmoe/analyze`` is a policy's name either (``layer``, also a trace column, excepted),
    and no comparison there involves a variable named for a policy (no branching on
    names)."""
    names = set(POLICIES) - {"layer"}
    found = []
    for path in sorted((ROOT / "bmoe" / "analyze").glob("*.py")):
        found += [(path.name, line, text) for line, text in _constants(path) if text in names]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Name) and "policy" in c.id for c in [node.left, *node.comparators]
            ):
                found += [(path.name, node.lineno, "a comparison with a policy name")]
    assert not found


def test_lfu_moves_to_its_heap_form_with_the_same_figures(monkeypatch) -> None:
    """Past ``LIST_SLOTS`` count-list slots a stream's LFU caches move to a heap per slice;
    the figures stay those of the count lists, new ids met after the move included."""
    from bmoe.analyze.replay_stream import stream_replay
    from bmoe.cache.kernels import lfu

    rng = np.random.default_rng(3)
    rows = [(0, 1, s, layer, slot, int(rng.integers(0, 4 if s < 30 else 9)))
            for s in range(80) for layer in range(3) for slot in range(3)]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["turn", "phase", "step", "layer", "slot", "expert"])
    table = pd.DataFrame({"layer": [0, 1, 2], "expert_bytes": [3, 5, 4]})
    trace = RouteTrace(None, 1, {"n_layer": 3, "n_expert": 4, "n_expert_used": 3}, table, frame)
    budgets, policies = [0, 10, 30, 60], ["lfu", "lfu-incache", "layerlfu"]
    lists = rp.replay_curve(trace, budgets, policies, jobs=1)

    monkeypatch.setattr(lfu, "LIST_SLOTS", 8)
    blocks = [frame.iloc[i : i + 40] for i in range(0, len(frame), 40)]
    with pytest.warns(UserWarning, match="outside 0..3"):
        heaps = stream_replay(trace, blocks, budgets, policies, jobs=1)["curve"]
    pd.testing.assert_frame_equal(heaps, lists)
    b = rp.prepare_batches(trace)
    cache = k.Replay(k.kernel_spec("lfu"), 30, k.Setup(b.n_keys, b.n_parts))
    cache.feed(rp.whole_chunk(b))
    assert isinstance(cache.state, lfu.LFUHeapState)
