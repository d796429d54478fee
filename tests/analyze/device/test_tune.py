"""The decisions of a tune (:mod:`bmoe.analyze.device.tune`) on hand-made tables: what it
must choose follows from the rules, worked out here; the t quantiles and the ratio it decides by.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.analyze.device.tune import (
    CHEAPER_RULE,
    Constraint,
    cost_key,
    decide,
    estimates,
    excluded_by_fidelity,
    measured_cells,
    ratio_at,
    recommend,
    t_at,
)
from bmoe.analyze.verdict import ratio_interval

#: Two-sided 95 % quantiles of Student's t from a printed table (dof: value).
T_TABLE_95 = {1: 12.706, 2: 4.303, 3: 3.182, 5: 2.571, 10: 2.228, 20: 2.086, 30: 2.042}


def test_t_quantiles_match_a_printed_table() -> None:
    for dof, expected in T_TABLE_95.items():
        assert t_at(0.95, dof) == pytest.approx(expected, abs=5e-4)
    assert t_at(0.99, 1) == pytest.approx(63.657, abs=1e-3)  # a textbook value
    assert t_at(0.90, 10) == pytest.approx(1.812, abs=1e-3)


def test_the_ratio_is_the_verdict_layers_at_95_and_wider_at_99() -> None:
    args = (100.0, 5.0, 4, 90.0, 6.0, 5)
    expected = tuple(float(x[0]) for x in ratio_interval(*([a] for a in args)))
    assert ratio_at(0.95, *args) == pytest.approx(expected)
    r, low, high = ratio_at(0.99, *args)
    assert r == pytest.approx(expected[0]) and low < expected[1] and high > expected[2]


CON = (Constraint("fidelity", "min", 0.9),)


def _results(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"cell": c, "status": "ok", "tok_s_reported": v, "fidelity": f} for c, v, f in rows]
    )


def _candidates(cells: dict[str, tuple[float, float]], predicted: dict[str, float]):
    return pd.DataFrame(
        [
            {
                "cell": c,
                "cache_mb": cache,
                "drop_cold_experts": drop,
                "predicted": predicted.get(c, np.nan),
                "predicted_low": predicted.get(c, np.nan) * 0.9,
                "predicted_high": predicted.get(c, np.nan) * 1.1,
            }
            for c, (cache, drop) in cells.items()
        ]
    )


def test_the_fastest_cell_breaking_a_constraint_is_never_the_incumbent() -> None:
    results = _results([("fast", 300, 0.5)] * 3 + [("ok", 200, 1.0)] * 3)
    m = measured_cells(results, ["fast", "ok"], "tok_s_reported", False, CON)
    feasible = dict(zip(m["cell"], m["feasible"], strict=True))
    assert feasible == {"fast": False, "ok": True}
    table = estimates(_candidates({"fast": (8, 1.0), "ok": (8, 0.0)}, {}), m, 0.95)
    d = decide(table, feasible, {}, confidence=0.95, slots=2)
    assert d.incumbent == "ok" and d.settled


def test_a_constraint_column_never_measured_does_not_count_as_met() -> None:
    results = _results([("a", 300, np.nan)] * 3)
    m = measured_cells(results, ["a"], "tok_s_reported", False, CON)
    assert not m["feasible"].iloc[0] and "not measured" in m["broken"].iloc[0]


def test_the_worst_run_decides_feasibility() -> None:
    results = _results([("a", 300, 0.95), ("a", 310, 0.85), ("a", 305, 0.99)])
    m = measured_cells(results, ["a"], "tok_s_reported", False, CON)
    assert not m["feasible"].iloc[0] and "0.85 breaks fidelity >= 0.9" in m["broken"].iloc[0]


def test_a_lossier_cell_than_one_that_broke_fidelity_is_excluded() -> None:
    cells = {
        "c4d5": (4, 0.5),
        "c4d1": (4, 1.0),
        "c2d1": (2, 1.0),
        "c8d1": (8, 1.0),
        "c4d0": (4, 0.0),
    }
    m = measured_cells(_results([("c4d5", 100, 0.8)]), list(cells), "tok_s_reported", False, CON)
    out = excluded_by_fidelity(_candidates(cells, {}), ["cache_mb", "drop_cold_experts"], m, CON)
    # more dropping at the same or a smaller cache: excluded; a larger cache or less dropping
    # may keep more of the output, so they stay
    assert set(out) == {"c4d1", "c2d1"}


def test_unmeasured_cells_whose_interval_reaches_the_best_are_run_first() -> None:
    cells = {c: (v, 0.0) for c, v in {"best": 8, "near": 6, "far": 1}.items()}
    predicted = {"best": 100.0, "near": 95.0, "far": 10.0}
    results = _results([("best", 100.0, 1.0), ("best", 101.0, 1.0), ("best", 99.0, 1.0)])
    m = measured_cells(results, list(cells), "tok_s_reported", False, CON)
    table = estimates(_candidates(cells, predicted), m, 0.95)
    d = decide(
        table, dict(zip(m["cell"], m["feasible"], strict=True)), {}, confidence=0.95, slots=3
    )
    assert d.incumbent == "best" and not d.settled
    assert [c for c, _ in d.chosen] == ["near"]  # "far" cannot reach it, "best" has 3 runs


def test_settled_when_every_contender_is_measured_and_worse() -> None:
    cells = {"a": (8, 0.0), "b": (6, 0.0)}
    results = _results(
        [("a", v, 1.0) for v in (100, 101, 99)] + [("b", v, 1.0) for v in (80, 81, 79)]
    )
    m = measured_cells(results, list(cells), "tok_s_reported", False, CON)
    table = estimates(_candidates(cells, {"a": 100.0, "b": 95.0}), m, 0.95)
    d = decide(
        table, dict(zip(m["cell"], m["feasible"], strict=True)), {}, confidence=0.95, slots=3
    )
    assert d.settled and d.runner_up == "b" and d.distinguishable and not d.chosen


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(10, 1000), st.floats(0, 1), st.integers(0, 3)), min_size=1, max_size=8
    )
)
def test_the_incumbent_is_never_a_cell_known_to_break_a_constraint(cells) -> None:
    rows, names = [], []
    for i, (speed, fid, n) in enumerate(cells):
        names.append(f"c{i}")
        rows += [(f"c{i}", speed * (1 + 0.01 * k), fid) for k in range(n)]
    m = measured_cells(_results(rows), names, "tok_s_reported", False, CON)
    spec = {c: (1.0 + i, 0.0) for i, c in enumerate(names)}
    table = estimates(_candidates(spec, {c: 100.0 for c in names}), m, 0.95)
    feasible = dict(zip(m["cell"], m["feasible"], strict=True)) if len(m) else {}
    d = decide(table, feasible, {}, confidence=0.95, slots=3)
    if any(feasible.values()):
        assert feasible.get(d.incumbent) is True
    if d.settled:
        assert feasible.get(d.incumbent) is True
    assert all(feasible.get(c) is not False for c, _ in d.chosen)


def _measured_table(rows: dict[str, list[float]], fidelity: dict[str, float] | None = None):
    """The estimates of measured cells (`rows`: cell -> its runs' tok/s), none predicted."""
    fidelity = fidelity or {}
    results = _results([(c, v, fidelity.get(c, 1.0)) for c, vs in rows.items() for v in vs])
    m = measured_cells(results, list(rows), "tok_s_reported", False, CON)
    table = estimates(_candidates({c: (4, 0.0) for c in rows}, {}), m, 0.95)
    return table, dict(zip(m["cell"], m["feasible"], strict=True))


def test_a_cell_measured_once_never_takes_the_recommendation_from_a_repeated_one() -> None:
    table, feasible = _measured_table({"lucky": [900.0], "firm": [600.0, 610.0, 590.0]})
    costs = {"lucky": cost_key({"cache_mb": 2}, True), "firm": cost_key({"cache_mb": 4}, True)}
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    # lucky is cheaper and faster on its one run, yet one run does not outweigh three
    assert r.cell == "firm"
    assert any("lucky" in why and "1 run" in why for why in r.reasons), r.reasons
    # with nothing measured three times, the best mean is all there is (and it says so)
    table, feasible = _measured_table({"lucky": [900.0], "other": [600.0, 610.0]})
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs={})
    assert r.cell == "lucky" and any("fewer than 3" in why for why in r.reasons), r.reasons


def test_when_the_best_is_not_distinguishable_the_cheaper_cell_is_recommended() -> None:
    noisy = {"lossy": [700.0, 500.0, 600.0], "exact": [650.0, 450.0, 560.0]}
    table, feasible = _measured_table(noisy)
    costs = {
        "lossy": cost_key({"cache_mb": 4, "drop_cold_experts": 0.5}, False),
        "exact": cost_key({"cache_mb": 4, "drop_cold_experts": 0.0}, True),
    }
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    assert r.cell == "exact" and r.runner_up == "lossy" and r.distinguishable is False
    assert any(CHEAPER_RULE in why for why in r.reasons), r.reasons
    # measured twice is enough to be told apart, or not: the cheaper still wins the tie
    table, feasible = _measured_table({"lossy": noisy["lossy"], "exact": [450.0, 470.0]})
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    assert r.cell == "exact" and r.runner_up == "lossy"
    # lossless alike: the smaller cache, then the fewer read lanes
    assert cost_key({"cache_mb": 2, "io_threads": 4}, True) < cost_key(
        {"cache_mb": 4, "io_threads": 1}, True
    )
    assert cost_key({"cache_mb": 4, "io_threads": 1}, True) < cost_key(
        {"cache_mb": 4, "io_threads": 4}, True
    )
    # distinguishable: the faster stays, whatever it costs
    table, feasible = _measured_table({"lossy": [900.0, 905.0, 895.0], "exact": [600.0] * 3})
    r = recommend(table, feasible, confidence=0.95, min_repeats=3, costs=costs)
    assert r.cell == "lossy" and r.distinguishable is True and not r.reasons


def test_an_unsettled_answer_says_how_many_more_runs_would_settle_it() -> None:
    # b measured once, 3 % below a (whose runs agree within 1 %): two more runs of b tell
    table, feasible = _measured_table({"a": [100.0, 101.0, 99.0], "b": [97.0]})
    d = decide(table, feasible, {}, confidence=0.95, slots=3, min_repeats=3, max_repeats=5)
    assert not d.settled and d.more_runs == 2
    # alike within the noise: both to their repeat bound (5), where they count as equivalent
    table, feasible = _measured_table({"a": [100.0, 110.0, 90.0], "b": [99.0, 109.0, 89.0]})
    d = decide(table, feasible, {}, confidence=0.95, slots=3, min_repeats=3, max_repeats=5)
    assert not d.settled and d.more_runs == 4


def test_before_any_cell_is_known_feasible_the_best_lossless_cell_runs_too() -> None:
    cells = {"drop": (8, 1.0), "drop2": (6, 1.0), "keep": (8, 0.0), "keep_small": (2, 0.0)}
    predicted = {"drop": 300.0, "drop2": 290.0, "keep": 200.0, "keep_small": 50.0}
    m = measured_cells(_results([]), list(cells), "tok_s_reported", False, CON)
    table = estimates(_candidates(cells, predicted), m, 0.95)
    d = decide(table, {}, {}, confidence=0.95, slots=2, lossless=["keep", "keep_small"])
    # the predicted best, then the best cell a fidelity floor cannot fail
    assert [c for c, _ in d.chosen] == ["drop", "keep"]
