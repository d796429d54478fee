"""``bmoe analyze replay`` and ``bmoe analyze drop`` end to end, and the replay plots."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from bmoe.analyze import replay as rp
from bmoe.cli import main
from bmoe.formats.route import read_route_trace
from bmoe.render.plots import replay as plots

TINY_PF = "native-tiny/pf.route.csv"


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["analyze", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("trace", "reference"),
    [
        ("route-trace/gemma.route.csv", "reference/gemma.route-drop-replay.txt"),
        ("native-tiny/drop.route.csv", "reference/native-tiny.drop.route-drop-replay.txt"),
    ],
)
def test_drop_prints_the_reference_text(
    corpus: Path, capsys, monkeypatch, trace, reference
) -> None:
    from bmoe.cli import console

    monkeypatch.setattr(console, "_width", 120)  # the reference's lines, unwrapped
    code, out, _ = run(capsys, "drop", corpus / trace)
    assert code == 0
    assert out == (corpus / reference).read_text(encoding="utf-8")
    # at 80 columns the same text, its longer lines wrapped under their columns
    monkeypatch.setattr(console, "_width", 80)
    code, narrow, _ = run(capsys, "drop", corpus / trace)
    assert code == 0 and max(map(len, narrow.splitlines())) <= 80
    assert narrow.split() == out.split()


def test_drop_json_has_every_phase(corpus: Path, capsys) -> None:
    code, out, _ = run(capsys, "drop", corpus / "native-tiny/drop.route.csv", "-f", "json")
    assert code == 0
    views = json.loads(out)
    assert views["decode"]["recorded_dropped"] == 123
    assert [r["frac"] for r in views["prefill_threshold"]] == [0.25, 0.5, 0.75, 1.0]
    assert views["prefill_static_k"][0]["keep_k"] == 1


def test_replay_prints_shape_validation_and_writes_the_reference_csv(
    corpus: Path, capsys, tmp_path: Path
) -> None:
    out_csv = tmp_path / "curve.csv"
    code, out, err = run(
        capsys, "replay", corpus / TINY_PF, "--budgets", "1,2,3,4,6", "--validate", "3",
        "--metrics", corpus / "native-tiny/pf.csv", "--csv", out_csv,
    )  # fmt: skip
    assert code == 0, err
    ref_txt = (corpus / "reference/native-tiny.pf.replay.txt").read_text().splitlines()
    lines = out.splitlines()
    assert lines[:3] == ref_txt[:3]
    # T = 4 layers x top-2 x 0.1875 MiB = 1.5 MiB, written alike in the header and the rule
    # (the reference's header rounds it to 2)
    assert lines[3] == ref_txt[3].replace(" 2 MiB", " 1.5 MiB")
    assert [line for line in lines if line.startswith("-- T")] == [f"{'-- T = 1.5 MiB --':-<68}"]
    # below T, layer and layerlfu hold T whatever the budget: said under the table
    note = " ".join(" ".join(lines[lines.index(ref_txt[16]) + 1 :]).split())
    assert "layer and layerlfu keep each layer's current batch whatever the budget" in note
    assert "at 1 MiB (below T = 1.5 MiB) they hold at least T" in note
    assert ref_txt[5] in lines  # validation @ 3 MiB: LRU replay = 32.9% ...
    assert "  recorded, trace residency column: 32.9% cumulative (35.2% decode-only)" in lines
    assert "  recorded, metrics summary cache_hit_pct: 32.9% cumulative" in lines
    ref_rows = {line.split()[0]: line for line in ref_txt[10:15]}
    for line in lines[: lines.index(ref_txt[16])]:  # the table's rows, not the note's
        if line and line.split()[0] in ref_rows:
            ours, ref = line.split(), ref_rows[line.split()[0]].split()
            assert [v for i, v in enumerate(ours) if i != 4] == [
                v for i, v in enumerate(ref) if i != 4
            ]  # all but random
    written = out_csv.read_text().splitlines()
    ref_csv = (corpus / "reference/native-tiny.pf.replay.csv").read_text().splitlines()
    assert [r for r in written if ",random," not in r] == [
        r for r in ref_csv if ",random," not in r
    ]
    assert f"wrote {out_csv}" in err


def test_the_help_lists_every_registered_policy_with_its_summary() -> None:
    from bmoe.cache import POLICIES
    from bmoe.cli.replay import analyze_replay

    help_text = analyze_replay.__doc__ or ""
    assert "{policies}" not in help_text
    for name, cls in POLICIES.items():
        assert cls.summary, name
        assert f"- {name}: {cls.summary}\n" in help_text


def test_unknown_policy_is_a_one_line_error(corpus: Path, capsys) -> None:
    code, _, err = run(capsys, "replay", corpus / TINY_PF, "--policies", "lru,mru")
    assert code == 2 and "'mru'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_budget_and_missing_turn_are_errors(corpus: Path, capsys) -> None:
    code, _, err = run(capsys, "replay", corpus / TINY_PF, "--budgets", "1,x")
    assert code == 2 and "'x'" in err
    code, _, err = run(capsys, "replay", corpus / TINY_PF, "--turn", "3")
    assert code == 2 and "no turn 3" in err


def test_json_carries_every_view(corpus: Path, capsys) -> None:
    code, out, _ = run(
        capsys, "replay", corpus / TINY_PF, "--budgets", "1,3", "--policies", "lru,arc",
        "--mrc", "--prefetch", "1", "--format", "json",
    )  # fmt: skip
    assert code == 0
    views = json.loads(out)
    assert set(views) == {"shape", "curve", "mrc_budgets", "mrc", "prefetch"}
    assert [(r["budget_mib"], r["policy"]) for r in views["curve"]] == [
        (1, "lru"), (1, "arc"), (3, "lru"), (3, "arc"),
    ]  # fmt: skip
    lru3 = next(r for r in views["curve"] if r["budget_mib"] == 3 and r["policy"] == "lru")
    mrc3 = next(r for r in views["mrc_budgets"] if r["budget_mib"] == 3)
    assert mrc3["hit_pct_cum"] == pytest.approx(lru3["hit_pct_cum"])
    assert views["shape"]["batches"] == 196


def test_plot_files(corpus: Path, capsys, tmp_path: Path) -> None:
    png = tmp_path / "curve.png"
    code, _, err = run(
        capsys, "replay", corpus / TINY_PF, "--budgets", "1,2,3", "--policies", "lru,lfu",
        "--validate", "3", "--mrc", "--plot", png,
    )  # fmt: skip
    assert code == 0, err
    assert png.stat().st_size > 10_000
    assert (tmp_path / "curve.mrc.png").stat().st_size > 10_000
    code, _, err = run(capsys, "replay", corpus / TINY_PF, "--plot", tmp_path / "x.txt")
    assert code == 2 and "plot files" in err


def test_plot_functions_draw_the_t_line_and_the_recorded_point(corpus: Path) -> None:
    trace = read_route_trace(corpus / TINY_PF)
    views = rp.replay(trace, [1, 2, 3], ["lru", "belady"], validate_mib=3, mrc=True)
    fig = plots.replay_curve_plot(
        views["curve"], t_mib=views["shape"]["t_mib"], recorded=(3, 35.2), mrc=views["mrc"]
    )
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert {"lru", "belady", "recorded", "lru (exact, every budget)"} <= set(labels)
    vertical = [ln for ln in ax.get_lines() if len(set(ln.get_xdata())) == 1]
    assert any(ln.get_xdata()[0] == pytest.approx(1.5) for ln in vertical)  # T
    assert isinstance(plots.mrc_plot(views["mrc"], t_mib=1.5), Figure)
    assert isinstance(views["curve"], pd.DataFrame)


def test_replay_jobs_do_not_change_the_csv(corpus: Path, capsys, tmp_path: Path) -> None:
    outs = []
    for jobs in ("1", "3"):
        out_csv = tmp_path / f"curve{jobs}.csv"
        code, _, err = run(
            capsys, "replay", corpus / TINY_PF, "--budgets", "1,2,3,4,6", "--jobs", jobs,
            "--policies", "lru,lfu,arc,random", "--csv", out_csv,
        )  # fmt: skip
        assert code == 0, err
        outs.append(out_csv.read_text())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 21


def test_replay_refuses_expert_ids_outside_the_key(capsys, tmp_path: Path) -> None:
    path = tmp_path / "bad.route.csv"
    path.write_text(
        "# route_trace v1\n# model=m n_layer=1 n_expert=4 n_expert_used=2\n"
        "# layer=0 expert_bytes=1048576 dense_bytes=0\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n"
        "0,1,0,0,0,-1,0.5,0,0,0\n0,1,0,0,1,-1,0.5,0,0,0\n0,1,1,0,0,-1,0.5,0,0,0\n"
    )
    code, out, err = run(capsys, "replay", path, "--budgets", "1")
    assert code == 2 and "expert id -1" in err and "100" not in out


def test_stream_prints_the_curve_of_the_whole_read(corpus: Path, capsys, tmp_path) -> None:
    path = corpus / "route-trace/gemma.route.csv"
    out_csv = tmp_path / "curve.csv"
    code, out, _ = run(capsys, "replay", str(path), "--stream", "-f", "json")
    assert code == 0
    trace = read_route_trace(path)
    whole = rp.replay_curve(trace, rp.default_budgets(trace), rp.REFERENCE_POLICIES)
    pd.testing.assert_frame_equal(pd.DataFrame(json.loads(out)["curve"]), whole, check_dtype=False)
    code, _, _ = run(
        capsys, "replay", str(path), "--stream", "--policies", "lru", "--budgets", "1000,2000",
        "--csv", str(out_csv),
    )  # fmt: skip
    assert code == 0
    assert (
        out_csv.read_text().splitlines()[0]
        == "budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib"
    )
    assert len(out_csv.read_text().splitlines()) == 3


def test_stream_of_the_parquet_form_gives_the_whole_replay_and_mrc(
    corpus: Path, capsys, tmp_path
) -> None:
    from bmoe.formats.parquet import write_table

    path = corpus / "route-trace/gemma.route.csv"
    pq_path = write_table(read_route_trace(path), "route", tmp_path / "gemma.route.parquet")
    asked = ["--policies", "lru,arc,belady,lfuda", "--mrc", "--budgets", "100,400,1600", "-f"]
    code, out, _ = run(capsys, "replay", str(pq_path), "--stream", *asked, "json")
    assert code == 0
    streamed = json.loads(out)
    code, out, _ = run(capsys, "replay", str(path), *asked, "json")
    assert code == 0
    whole = json.loads(out)
    assert streamed == whole  # shape, curve, mrc_budgets, mrc
    assert len(streamed["mrc"]) > 10
    code, out, _ = run(capsys, "replay", str(pq_path), "--stream", *asked, "table")
    assert code == 0
    code, whole_text, _ = run(capsys, "replay", str(path), *asked, "table")
    assert out == whole_text and "exact LRU curve:" in out and "belady" in out


@pytest.mark.parametrize(
    ("trace", "extra"),
    [
        (TINY_PF, ["--validate", "3", "--metrics", "native-tiny/pf.csv"]),
        (TINY_PF, ["--validate", "2.5", "-f", "json"]),
        ("native-tiny/drop.route.csv", []),
    ],
)
def test_stream_prints_what_the_whole_command_prints(corpus: Path, capsys, trace, extra) -> None:
    """Shape lines, the validation against the recorded run, the budget x policy table, the
    exact LRU curve."""
    extra = [str(corpus / e) if e.endswith(".csv") else e for e in extra]
    asked = ["--mrc", "--budgets", "1,2,3,5", *extra]
    code, whole, whole_err = run(capsys, "replay", corpus / trace, *asked)
    assert code == 0
    code, streamed, err = run(capsys, "replay", corpus / trace, "--stream", *asked)
    assert code == 0
    assert streamed == whole and "batches" in whole
    assert ("dropping on" in err) == ("dropping on" in whole_err)
    assert ("validation" in whole) == ("--validate" in extra)


def test_stream_of_one_turn_is_that_turn(capsys, tmp_path: Path) -> None:
    from bmoe.formats.route import write_route_trace
    from tests.analyze.test_replay import make_trace

    cells = [(t, 1, s, s % 2, [(s + t) % 5, 3 * s % 7]) for t in range(3) for s in range(9)]
    path = tmp_path / "turns.route.csv"
    write_route_trace(make_trace(cells, sizes={0: 1 << 20, 1: 1 << 21}), path)
    asked = ["--turn", "1", "--policies", "lru,lfu", "--budgets", "1,3,6", "-f", "json"]
    code, out, _ = run(capsys, "replay", str(path), "--stream", *asked)
    assert code == 0
    streamed = json.loads(out)["curve"]
    code, out, _ = run(capsys, "replay", str(path), *asked)
    assert streamed == json.loads(out)["curve"]
    code, out, _ = run(capsys, "replay", str(path), "--stream", "--turn", "0", *asked[2:])
    assert streamed != json.loads(out)["curve"]
    code, _, err = run(capsys, "replay", str(path), "--stream", "--turn", "7")
    assert code == 2 and "no turn 7" in err


def test_stream_refuses_prefetch(corpus: Path, capsys) -> None:
    path = corpus / "route-trace/gemma.route.csv"
    code, _, err = run(capsys, "replay", str(path), "--stream", "--prefetch", "1")
    assert code == 2
    assert "--stream does not go with --prefetch" in err


def test_stream_draws_the_curve_and_the_exact_lru_curve(corpus: Path, capsys, tmp_path) -> None:
    png = tmp_path / "curve.png"
    code, _, err = run(
        capsys, "replay", corpus / TINY_PF, "--stream", "--budgets", "1,2,3", "--policies",
        "lru,lfu", "--mrc", "--plot", png,
    )  # fmt: skip
    assert code == 0, err
    assert png.stat().st_size > 10_000
    assert (tmp_path / "curve.mrc.png").stat().st_size > 10_000
    code, _, err = run(capsys, "replay", corpus / TINY_PF, "--stream", "--mrc", "--plot", png)
    assert code == 2 and "exists" in err


def test_stream_warns_once_about_ids_beyond_n_expert(capsys, tmp_path: Path) -> None:
    path = tmp_path / "beyond.route.csv"
    path.write_text(
        "# route_trace v1\n# model=m n_layer=1 n_expert=4 n_expert_used=2\n"
        "# layer=0 expert_bytes=1048576 dense_bytes=0\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n"
        "0,1,0,0,0,1,0.5,0,0,0\n0,1,0,0,1,6,0.5,0,0,0\n0,1,1,0,0,6,0.5,0,0,0\n"
        "0,1,2,0,0,9,0.5,0,0,0\n0,1,3,0,0,1,0.5,0,0,0\n"
    )
    asked = ["--budgets", "1,2", "--policies", "lru,lfu", "-f", "json"]
    code, out, err = run(capsys, "replay", path, "--stream", *asked)
    assert code == 0
    assert err.count("outside 0..3") == 1 and "expert id 6" in err
    streamed = json.loads(out)["curve"]
    code, out, _ = run(capsys, "replay", path, *asked)
    assert streamed == json.loads(out)["curve"]
