"""Live progress: the rich panel and the plain log show runs done, each target's running run
with its tokens and tok/s, and the ETA."""

from __future__ import annotations

import io

from rich.console import Console

from bmoe.engine.native import StreamState
from bmoe.render.progress import LiveProgress, PlainProgress
from bmoe.sweep.plan import Cell, Run


def _run(cell_id: str) -> Run:
    return Run(Cell(cell_id, 0, {"model": "m"}, {}), 1, 1, False, 0)


def _drive(sink) -> None:
    sink.sweep_started(4, 1, ["phone", "box"])
    sink.run_started("phone", _run("cache-8"), 1)
    state = StreamState(step=12, steps=64, wall_ms_total=120.0, tokens_seen=12)
    sink.run_progress("phone", _run("cache-8"), state)
    sink.run_finished("box", _run("cache-0"), {"run": "cache-0/r1", "status": "ok",
                                               "duration_s": 30.0, "attempt": 1,
                                               "stream": {"tok_s": 95.5}})  # fmt: skip


def test_live_panel():
    console = Console(record=True, width=120, file=io.StringIO())
    sink = LiveProgress(console)
    _drive(sink)
    console.print(sink)
    text = console.export_text()
    assert "runs 2/4" in text
    assert "cache-8/r1 (attempt 1)" in text and "12/64" in text and "100.0" in text  # 12 tok/0.12 s
    assert "cache-0/r1: ok 95.5 tok/s" in text
    assert "eta 0:30" in text  # 2 runs left, 30 s each, 2 targets


def test_plain_log():
    out = io.StringIO()
    sink = PlainProgress(out, every_s=0.0)
    _drive(sink)
    text = out.getvalue()
    assert "4 runs, 1 already complete, targets: phone, box" in text
    assert "phone: cache-8/r1 token 12/64, 100.0 tok/s" in text
    assert "box: cache-0/r1 attempt 1 ok in 30.0 s, 95.5 tok/s [2/4 done, eta 0:30]" in text


def test_a_farm_shows_runs_per_host_and_per_target():
    console = Console(record=True, width=140, file=io.StringIO())
    live = LiveProgress(console)
    out = io.StringIO()
    plain = PlainProgress(out, every_s=0.0)
    for sink in (live, plain):
        sink.target_hosts({"phone": "lab-1", "box": "lab-2", "tablet": "lab-2"})
        _drive(sink)
        record = {"run": "cache-4/r1", "status": "ok", "duration_s": 10.0, "attempt": 1}
        sink.run_finished("tablet", _run("cache-4"), record)
    console.print(live)
    text = console.export_text()
    assert "lab-1 0 done, 1 running" in text and "lab-2 2 done, 0 running" in text
    box_row = next(line for line in text.splitlines() if line.startswith("box"))
    assert box_row.split()[:3] == ["box", "lab-2", "1"]  # target, host, runs done
    log = out.getvalue()
    assert "host lab-1: targets phone" in log and "host lab-2: targets box, tablet" in log
    assert "box@lab-2: cache-0/r1 attempt 1 ok" in log
    # eta: mean of 30 s and 10 s, one run left, three targets
    assert "[3/4 done, eta 0:06; tablet 1, lab-1 0, lab-2 2]" in log
