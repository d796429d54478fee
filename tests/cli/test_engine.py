"""``bmoe run -h`` (the flag table) and ``bmoe run --progress`` drawn for a terminal."""

from __future__ import annotations

import io
import re
import sys

import pytest

from bmoe.engine.embedded import config


def test_the_flag_table_lists_every_flag_the_engine_takes(capsys) -> None:
    from bmoe.cli import main

    assert main(["run", "-h"]) == 0
    out = capsys.readouterr().out
    listed = set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", out))
    accepted = set(config._VALUE) | set(config._SWITCH) | {"--version", "-h", "--help"}
    assert accepted <= listed, sorted(accepted - listed)
    assert "Examples:" in out and "what it does" in out
    # a "-h" that is the value of -p is a prompt, not a request for help
    assert not config.wants_help(["-m", "x.gguf", "-p", "-h"])
    assert config.wants_help(["-m", "x.gguf", "--help"])


def test_progress_in_a_terminal_is_drawn_not_dumped(monkeypatch) -> None:
    pytest.importorskip("rich")
    from bmoe.cli.engine import _ProgressView
    from bmoe.formats import protocol

    class Stdout(io.StringIO):  # the text side is where the bar is drawn
        buffer = io.BytesIO()

    monkeypatch.setattr(sys, "stdout", Stdout())
    view = _ProgressView()
    for step in (1, 2, 3):
        data = {"step": step, "steps": 3, "wall_ms": 4.0, "cache_hit_pct": 50.0, "read_mb": 1.0}
        view.write(protocol.to_bytes(protocol.format_event("LOAD", {"mb": 1.0, "ms": 1.0})))
        view.write(b"\n" + protocol.to_bytes(protocol.format_event("PROGRESS", data)) + b"\n")
    assert view._progress.tasks[0].completed == 3
    # read_mb is MiB (bytes / 2^20, telemetry.md): the bar says so
    assert view._progress.tasks[0].fields["info"].endswith("read   1.00 MiB")
    view.write(b"=== answer ===\nhello\n=== perf ===\ngeneration: 3 tokens\n")
    view.close()
    text = sys.stdout.buffer.getvalue()
    assert b"BMOE_" not in text
    assert text.startswith(b"=== answer ===\nhello\n") and text.endswith(b"generation: 3 tokens\n")
