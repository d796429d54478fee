"""Drop replay on a hand-made trace (the corpus references are matched byte for byte by the
command's tests)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bmoe.analyze.drop import drop_replay
from bmoe.errors import BmoeError
from bmoe.formats.route import RouteTrace

NAN = math.nan


def trace(with_residency: bool = True) -> RouteTrace:
    """k = 3, decode. Cell A (step 0): weights .5 .3 .2, residency miss miss hit, bytes
    10 10 0. Cell B (step 1): weights .2 .15 .1, all misses of 10 bytes. Cell C (step 2):
    a nan weight, so it is left out of the threshold figures."""
    rows = pd.DataFrame(
        {
            "turn": 0,
            "phase": 1,
            "step": [0, 0, 0, 1, 1, 1, 2, 2, 2],
            "layer": 0,
            "slot": [0, 1, 2] * 3,
            "expert": [1, 2, 3, 4, 5, 6, 7, 8, 9],
            "weight": [0.5, 0.3, 0.2, 0.2, 0.15, 0.1, 0.6, NAN, 0.1],
            "residency": [0, 0, 1, 0, 0, 0, 0, 0, 0],
            "expert_bytes": [10, 10, 0, 10, 10, 10, 10, 10, 10],
        }
    )
    if not with_residency:
        rows = rows.drop(columns="residency")
    meta = {"n_layer": 1, "n_expert": 16, "n_expert_used": 3}
    return RouteTrace(None, 1, meta, pd.DataFrame({"layer": [0], "expert_bytes": [10]}), rows)


def test_thresholds_and_static_k_by_hand() -> None:
    """frac 1.0 (thr 1/3): A drops slot 1 (a miss of .3); B drops slots 1 and 2 but keeps
    slot 0, its highest weight, though it is below the threshold too. io_saved = 30 of 50
    miss bytes = 60 %, mass_lost = .55 of 1.45. frac 0.5 (thr 1/6): only B's .15 and .1:
    20 of 50 bytes, .25 of 1.45. Static keep_k 2 drops every slot 2: A's is a hit (0 bytes),
    B's 10 bytes: 20 %, mass .3 / 1.45; keep_k 1 drops slots 1 and 2: 30 bytes, .75 / 1.45."""
    out = drop_replay(trace(), [0.5, 1.0])
    assert list(out) == ["decode"]
    part = out["decode"]
    s = part["summary"]
    assert (s["cells"], s["cells_with_weights"], s["routed"]) == (3, 2, 9)
    assert s["miss_pct"] == pytest.approx(100 * 8 / 9)
    thr = part["threshold"].set_index("frac")
    assert thr.loc[1.0, "io_saved_pct"] == pytest.approx(60.0)
    assert thr.loc[1.0, "mass_lost_pct"] == pytest.approx(100 * 0.55 / 1.45)
    assert thr.loc[1.0, "surviving"] == "1:50% 2:50%"
    assert thr.loc[0.5, "io_saved_pct"] == pytest.approx(40.0)
    assert thr.loc[0.5, "mass_lost_pct"] == pytest.approx(100 * 0.25 / 1.45)
    assert thr.loc[0.5, "surviving"] == "1:50% 3:50%"
    static = part["static_k"].set_index("keep_k")
    assert static.loc[2, "io_saved_pct"] == pytest.approx(20.0)
    assert static.loc[2, "mass_lost_pct"] == pytest.approx(100 * 0.3 / 1.45, rel=1e-6)
    assert static.loc[1, "io_saved_pct"] == pytest.approx(60.0)
    assert static.loc[1, "mass_lost_pct"] == pytest.approx(100 * 0.75 / 1.45, rel=1e-6)
    assert "recorded_dropped" not in s


def test_drop_needs_the_residency_column() -> None:
    with pytest.raises(BmoeError, match="residency"):
        drop_replay(trace(with_residency=False))


def test_cells_numbered_in_order_of_first_appearance() -> None:
    import numpy as np
    import pandas as pd

    from bmoe.analyze.drop import _runs_or_factorized

    def cells(steps: list[int], layers: list[int]) -> tuple[np.ndarray, ...]:
        turn = np.zeros(len(steps), dtype=np.int16)
        return turn, np.array(steps, dtype=np.int32), np.array(layers, dtype=np.int16)

    runs = cells([5, 5, 7, 7, 7, 7], [0, 0, 0, 0, 1, 1])  # each cell one run: run numbers
    assert _runs_or_factorized(runs).tolist() == [0, 0, 1, 1, 2, 2]
    split = cells([5, 5, 7, 7, 5, 9], [0, 0, 0, 0, 0, 0])  # cell 5 comes back: hashing
    keys = pd.MultiIndex.from_arrays(list(split))
    assert _runs_or_factorized(split).tolist() == pd.factorize(keys)[0].tolist()
    assert _runs_or_factorized(split).tolist() == [0, 0, 1, 1, 0, 2]
    # the same step at another layer, or the same layer at another turn, is another cell
    turned = cells([5, 5, 5, 5], [3, 3, 3, 3])
    turned[0][2:] = 1
    assert _runs_or_factorized(turned).tolist() == [0, 0, 1, 1]
