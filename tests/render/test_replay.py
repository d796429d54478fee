"""The replay's text and plot say T alike, note where layer and layerlfu hold more than the
budget, and every policy is defined where a user looks: ``--help`` and docs/replay.md."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bmoe.cache import POLICIES
from bmoe.render import replay as text

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("t_mib", "said"),
    [(1.5, "1.5"), (120.0, "120"), (675.9, "676"), (0.9375, "0.94"), (12.25, "12.2"), (2, "2")],
)
def test_t_is_written_one_way(t_mib: float, said: str) -> None:
    assert text.t_text(t_mib) == said


def _curve(budgets, values: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        {"budget_mib": b, "policy": p, "hit_pct_decode": v[i], "hit_pct_cum": v[i], "read_mib": 0}
        for p, v in values.items()
        for i, b in enumerate(budgets)
    ]
    return pd.DataFrame(rows)


def test_the_header_the_rule_and_the_plot_give_the_same_t() -> None:
    from bmoe.render.plots.replay import replay_curve_plot

    curve = _curve([1, 2, 4], {"belady": [26.0, 49.0, 81.0], "lru": [0.0, 14.8, 48.4]})
    shape = {"model": "m", "n_layer": 4, "moe_layers": 4, "n_expert": 8, "k": 2,
             "mib_per_expert": 0.1875, "batches": 3, "prefill_batches": 1, "decode_batches": 2,
             "t_mib": 1.5}  # fmt: skip
    out = text.replay_text({"shape": shape, "curve": curve})
    assert "T       1.5 MiB touched per token cycle" in out
    assert "-- T = 1.5 MiB --" in out
    lines = out.splitlines()  # the rule sits between the budgets below and above T
    rule = next(i for i, line in enumerate(lines) if line.startswith("-- T"))
    assert lines[rule - 1].startswith("1 ") and lines[rule + 1].startswith("2 ")
    fig = replay_curve_plot(curve, t_mib=1.5)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["T = 1.5 MiB\n(one token cycle)"]


def test_a_note_says_when_layer_policies_hold_more_than_the_budget() -> None:
    # below T = 120 the layer policies hold T: they beat belady at 30, not at 60
    curve = _curve(
        [30, 60, 120, 240],
        {"belady": [18.8, 52.0, 67.3, 87.7], "lru": [0, 0, 42.6, 65.2],
         "layer": [49.7, 49.7, 49.7, 72.4], "layerlfu": [49.7, 49.7, 49.7, 75.2]},
    )  # fmt: skip
    (note,) = text.budget_notes(curve, 120.0)
    assert note.startswith("layer and layerlfu keep each layer's current batch whatever")
    assert "at 30 and 60 MiB (below T = 120 MiB) they hold at least T" in note
    assert note.endswith("which is how they beat belady at 30 MiB")
    # no layer policy, or no budget below T: nothing to say
    assert text.budget_notes(curve[curve["policy"].isin(["belady", "lru"])], 120.0) == []
    assert text.budget_notes(curve[curve["budget_mib"] >= 120], 120.0) == []
    # only one of them replayed, no belady to beat
    only = curve[curve["policy"] == "layerlfu"]
    assert text.budget_notes(only, 120.0) == [
        "layerlfu keep each layer's current batch whatever the budget: at 30 and 60 MiB "
        "(below T = 120 MiB) they hold at least T, more than the budget"
    ]
    wrapped = text.curve_table_text(curve, 120.0, width=60).splitlines()
    note_lines = wrapped[wrapped.index(next(x for x in wrapped if x.startswith("note:"))) :]
    assert len(note_lines) > 2 and all(len(line) <= 60 for line in note_lines)


def test_every_policy_is_defined_in_the_help_and_the_replay_page(capsys) -> None:
    from bmoe.cli import main

    assert main(["analyze", "replay", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    page = " ".join((ROOT / "docs" / "replay.md").read_text(encoding="utf-8").split())
    for name in POLICIES:
        assert f"- {name}: " in help_text, name
        assert f"`{name}`" in page, name
    defined = page.split("Which policies")[1].split("Which variants")[0]
    for name in POLICIES:
        assert f"`{name}`" in defined, f"docs/replay.md's policy list lacks {name}"
