"""Predictions in sweeps: the ``[sweep] profile`` key, the dry run's predicted duration, the
predictions kept beside the outcomes and the report's predicted-vs-measured view."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze.device import sweep_duration
from bmoe.analyze.sweep import predicted_vs_measured
from bmoe.cli import main
from bmoe.errors import BmoeError
from bmoe.formats.profile import write_profile
from bmoe.sweep.config import parse_config, resolved_document
from tests.analyze.device.test_predict import DECODE, PREFILL, make_trace, round_profile

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "bench-data" / "2026-11-29-small-traces"

CONFIG = """
[sweep]
name = "pred"
engine = "embedded"
profile = "device.json"

[base]
model = "m.gguf"
n_predict = 30
moe_stream = true

[grid]
cache_mb = [0, 100]
io_threads = [1]
"""


def test_profile_key_is_kept_in_the_resolved_config(tmp_path: Path) -> None:
    cfg = parse_config(CONFIG, "sweep.toml", tmp_path)
    assert cfg.settings.profile == "device.json"
    assert resolved_document(cfg)["sweep"]["profile"] == "device.json"
    with pytest.raises(BmoeError, match="profile"):
        parse_config(CONFIG.replace('"device.json"', "3"), "sweep.toml", tmp_path)


def test_sweep_duration_hand_worked() -> None:
    """Load 1 s + prefill 2 s, then 30 tokens: at budget 0 each takes 21 ms (see
    test_predict); without a trace every routed expert (2 layers x top-2) misses, the same."""
    prof = round_profile(prefill={"load_s": 1.0, "prefill_s": 2.0})
    prof.model["n_expert_used"] = 2
    runs = pd.DataFrame({"cache_mb": [0, 0], "io_threads": [1, 1], "n_predict": [30, 30]})
    with_trace = sweep_duration(make_trace(PREFILL, DECODE), prof, runs)
    assert with_trace["predicted_s"].tolist() == pytest.approx([3 + 30 * 0.021] * 2)
    assert not with_trace["bound"].any()
    bound = sweep_duration(None, prof, runs)
    assert bound["predicted_s"].tolist() == pytest.approx([3 + 30 * 0.021] * 2)
    assert bound["bound"].all()


def test_dry_run_prints_the_predicted_duration(tmp_path: Path, capsys) -> None:
    prof = round_profile(prefill={"load_s": 1.0, "prefill_s": 2.0})
    prof.model["n_expert_used"] = 2
    write_profile(prof, tmp_path / "device.json")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "sweep.toml").write_text(CONFIG)
    code = main(["sweep", str(tmp_path / "sweep.toml"), "--dry-run", "-o", str(tmp_path)])
    out = capsys.readouterr().out.replace("\n", " ")
    assert code == 0
    # no routing recorded with the profile: every expert a miss, 2 runs x 3.63 s
    assert "at most 0.1 min of engine time for 2 runs" in out


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
def test_report_shows_predicted_against_measured(tmp_path: Path) -> None:
    root = tmp_path / SMALL.name
    shutil.copytree(SMALL, root)
    import bmoe

    results = bmoe.load_archive(root).cells
    cells = sorted(results["cell"].unique())
    predictions = pd.DataFrame({"cell": cells, "tok_s": [1.0, 2.0, 3.0, 4.0]})
    predictions.to_csv(root / "predictions.csv", index=False)
    table = predicted_vs_measured(results, predictions).set_index("cell")
    measured = results.set_index("cell")["tok_s_reported"]
    for cell, predicted in zip(cells, [1.0, 2.0, 3.0, 4.0], strict=True):
        assert table.loc[cell, "error_pct"] == pytest.approx(100 * (predicted / measured[cell] - 1))
    out = tmp_path / "report.html"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["report", str(root), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Predicted against measured" in page
    # the scatter is drawn: an inline figure right after the heading
    section = page.split("Predicted against measured", 1)[1]
    assert '<img alt="predicted against measured" src="data:image/png;base64,' in section


def _sweep_with_predictions(tmp_path: Path) -> tuple[Path, list[str], list[float]]:
    root = tmp_path / SMALL.name
    shutil.copytree(SMALL, root)
    import bmoe

    cells = sorted(bmoe.load_archive(root).cells["cell"].unique())
    predicted = [1.0 + i for i in range(len(cells))]
    pd.DataFrame({"cell": cells, "tok_s": predicted}).to_csv(root / "predictions.csv", index=False)
    return root, cells, predicted


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
def test_analyze_sweep_shows_predicted_against_measured(tmp_path: Path, capsys) -> None:
    """bmoe analyze sweep of a sweep with predictions.csv: the table of each cell's predicted
    and measured tok/s with the error, and with --plots the scatter written as a PNG."""
    import json

    root, cells, predicted = _sweep_with_predictions(tmp_path)
    plots = tmp_path / "plots"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["analyze", "sweep", str(root), "-f", "json", "--plots", str(plots)])
    captured = capsys.readouterr()
    assert code == 0
    views = json.loads(captured.out)
    table = pd.DataFrame(views["predicted"]).set_index("cell")
    from bmoe.sweep.archive import load_results

    measured = load_results(root).set_index("cell")["tok_s_reported"]
    assert sorted(table.index) == cells
    for cell, value in zip(cells, predicted, strict=True):
        assert table.loc[cell, "tok_s_predicted"] == value
        assert table.loc[cell, "error_pct"] == pytest.approx(100 * (value / measured[cell] - 1))
    png = plots / "predicted.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
def test_analyze_sweep_without_predictions_has_no_such_view(tmp_path: Path, capsys) -> None:
    import json

    root = tmp_path / SMALL.name
    shutil.copytree(SMALL, root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["analyze", "sweep", str(root), "-f", "json"]) == 0
    assert "predicted" not in json.loads(capsys.readouterr().out)


@pytest.mark.skipif(not SMALL.is_dir(), reason="bench-data small sweep absent")
def test_analyze_sweep_refuses_a_predictions_file_without_tok_s(tmp_path: Path, capsys) -> None:
    root, _, _ = _sweep_with_predictions(tmp_path)
    (root / "predictions.csv").write_text("cell,rate\na,1\n")
    assert main(["analyze", "sweep", str(root)]) == 2
    err = capsys.readouterr().err
    assert "predictions.csv: line 1: no tok_s column" in err.replace("\n", "")
    assert "Traceback" not in err


def test_scatter_has_the_identity_line_and_one_dot_per_cell() -> None:
    from matplotlib.collections import PathCollection

    from bmoe.render.plots.predict import predicted_vs_measured_plot

    table = pd.DataFrame(
        {
            "cell": ["a", "b", "c"],
            "tok_s_measured": [2.0, 4.0, 8.0],
            "tok_s_predicted": [2.5, 4.0, 6.0],
        }
    )
    ax = predicted_vs_measured_plot(table).axes[0]
    lines = [line for line in ax.get_lines() if line.get_label() == "predicted = measured"]
    assert len(lines) == 1
    x, y = lines[0].get_data()
    assert list(x) == list(y) and max(x) >= 8.0  # the identity spans every measured cell
    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(dots) == 1
    assert dots[0].get_offsets().tolist() == [[2.0, 2.5], [4.0, 4.0], [8.0, 6.0]]


def test_scatter_labels_stay_inside_and_apart_and_intervals_are_error_bars() -> None:
    """Twenty cells crowded along the identity line: every label placed is inside the axes
    and overlaps no other label; those that find no room are counted in the title; each
    interval is an error bar from its low to its high."""
    from matplotlib.container import ErrorbarContainer

    from bmoe.render.plots.predict import predicted_vs_measured_plot

    n = 20
    measured = np.linspace(1.0, 3.0, n)
    table = pd.DataFrame(
        {
            "cell": [f"cell-{i}" for i in range(n)],
            "cache_mb": [64 * (i + 1) for i in range(n)],
            "io_threads": 4,
            "tok_s_measured": measured,
            "tok_s_predicted": measured * 1.05,
            "tok_s_low_predicted": measured * 0.9,
            "tok_s_high_predicted": measured * 1.2,
        }
    )
    fig = predicted_vs_measured_plot(table)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert boxes
    for i, box in enumerate(boxes):
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1
        assert not any(box.overlaps(other) for other in boxes[i + 1 :])
    if len(boxes) < n:
        assert ax.get_title().startswith(f"{n - len(boxes)} of {n} labels left out")
    # short labels of each configuration, not the cell ids
    assert all(t.get_text().endswith("M 4L") for t in ax.texts)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()
    assert len(segments) == n
    for seg, m in zip(segments, measured, strict=True):
        assert seg[0][1] == pytest.approx(m * 0.9) and seg[1][1] == pytest.approx(m * 1.2)
