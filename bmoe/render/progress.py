"""Live progress of a running sweep: a rich display for terminals, a plain log otherwise.

Both take the runner's events (:class:`bmoe.sweep.runner.ProgressSink`) from several target
threads at once; what they show is runs done out of the total, each target's running run
with its tokens and tok/s (from the engine's progress lines), runs done per target (and per
host, on a farm), and an ETA from the durations of the runs finished so far.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from bmoe.render.messages import literal, printable


@dataclass
class _Running:
    run: str
    attempt: int
    started: float
    step: int = 0
    steps: int | None = None
    tok_s: float | None = None


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = 0
        self.done = 0  # runs complete (including those found complete on resume)
        self.failed = 0  # attempts that did not complete
        self.started = time.monotonic()
        self.durations: list[float] = []
        self.running: dict[str, _Running | None] = {}
        self.last: dict[str, str] = {}
        self.done_by_target: dict[str, int] = {}
        self.hosts: dict[str, str] = {}  # target -> host (a farm)

    def host_counts(self) -> dict[str, tuple[int, int]]:
        """Per host: runs done this pass, targets running a run now."""
        out: dict[str, tuple[int, int]] = {}
        for target, host in self.hosts.items():
            done, busy = out.get(host, (0, 0))
            out[host] = (
                done + self.done_by_target.get(target, 0),
                busy + (self.running.get(target) is not None),
            )
        return out

    def eta_s(self) -> float | None:
        remaining = self.total - self.done
        if remaining <= 0 or not self.durations:
            return None
        lanes = max(1, len(self.running))
        return sum(self.durations) / len(self.durations) * remaining / lanes


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


class LiveProgress:
    """A rich live panel: a header line and one row per target."""

    def __init__(self, console: Console):
        self.console = console
        self.tally = _Tally()
        self.live = Live(self, console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)

    def __rich__(self) -> Group:
        t = self.tally
        with t.lock:
            head = Text.assemble(
                ("runs ", "bold"), f"{t.done}/{t.total}",
                ("  failed attempts ", "bold"), str(t.failed),
                ("  elapsed ", "bold"), _clock(time.monotonic() - t.started),
                ("  eta ", "bold"), _clock(t.eta_s()),
            )  # fmt: skip
            lines: list[Any] = [head]
            if t.hosts:
                parts = [f"{host} {done} done, {busy} running"
                         for host, (done, busy) in t.host_counts().items()]  # fmt: skip
                lines.append(Text.assemble(("hosts ", "bold"), printable("  ·  ".join(parts))))
            table = Table(box=None, header_style="bold", pad_edge=False)
            columns = ["target", *(["host"] if t.hosts else []), "done", "run", "tokens",
                       "tok/s", "time", "last"]  # fmt: skip
            for col in columns:
                right = col in ("done", "tokens", "tok/s")
                table.add_column(col, justify="right" if right else "left")
            for name, cur in t.running.items():
                where = [t.hosts.get(name, "")] if t.hosts else []
                done = str(t.done_by_target.get(name, 0))
                if cur is None:
                    _add_row(table, name, *where, done, "idle", "", "", "", t.last.get(name, ""))
                    continue
                steps = f"{cur.step}/{cur.steps}" if cur.steps else str(cur.step)
                _add_row(
                    table, name, *where, done, f"{cur.run} (attempt {cur.attempt})", steps,
                    _rate(cur.tok_s), _clock(time.monotonic() - cur.started),
                    t.last.get(name, ""),
                )  # fmt: skip
            lines.append(table)
        return Group(*lines)

    # ProgressSink
    def sweep_started(self, total: int, done: int, targets: Sequence[str]) -> None:
        with self.tally.lock:
            self.tally.total, self.tally.done = total, done
            self.tally.running = {name: None for name in targets}

    def target_hosts(self, hosts):
        with self.tally.lock:
            self.tally.hosts = dict(hosts)

    def run_started(self, target, run, attempt):
        with self.tally.lock:
            self.tally.running[target] = _Running(run.id, attempt, time.monotonic())

    def run_progress(self, target, run, state):
        with self.tally.lock:
            cur = self.tally.running.get(target)
            if cur is not None:
                cur.step, cur.steps, cur.tok_s = state.step, state.steps, state.tok_s

    def run_finished(self, target, run, record):
        _finish(self.tally, target, record)

    def message(self, text: str) -> None:
        self.console.print(literal(text), highlight=False)


def _add_row(table: Table, *cells: str) -> None:
    """A row of run ids, targets and engine errors: text from a config or an engine, literal."""
    table.add_row(*(literal(c) for c in cells))


def _finish(t: _Tally, target: str, record: dict[str, Any]) -> None:
    with t.lock:
        t.running[target] = None
        status = record.get("status")
        if status == "ok":
            t.done += 1
            t.done_by_target[target] = t.done_by_target.get(target, 0) + 1
            t.durations.append(float(record.get("duration_s") or 0.0))
        else:
            t.failed += 1
        rate = (record.get("stream") or {}).get("tok_s")
        t.last[target] = f"{record.get('run')}: {status}" + (
            f" {rate:.1f} tok/s" if status == "ok" and rate else ""
        )


class PlainProgress:
    """One line per event, for logs and non-terminals; running runs report every `every_s`."""

    def __init__(self, out: TextIO, every_s: float = 10.0):
        self.out = out
        self.every_s = every_s
        self.tally = _Tally()
        self._last_report: dict[str, float] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def _line(self, text: str) -> None:
        with self._lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {printable(text)}\n")
            self.out.flush()

    def sweep_started(self, total, done, targets):
        with self.tally.lock:
            self.tally.total, self.tally.done = total, done
            self.tally.running = {name: None for name in targets}
        self._line(f"sweep: {total} runs, {done} already complete, targets: {', '.join(targets)}")

    def target_hosts(self, hosts):
        with self.tally.lock:
            self.tally.hosts = dict(hosts)
        by_host: dict[str, list[str]] = {}
        for target, host in hosts.items():
            by_host.setdefault(host, []).append(target)
        for host, names in by_host.items():
            self._line(f"host {host}: targets {', '.join(names)}")

    def run_started(self, target, run, attempt):
        with self.tally.lock:
            self.tally.running[target] = _Running(run.id, attempt, time.monotonic())
        self._last_report[target] = time.monotonic()
        self._line(f"{target}: {run.id} attempt {attempt} started")

    def run_progress(self, target, run, state):
        now = time.monotonic()
        if now - self._last_report.get(target, 0.0) < self.every_s:
            return
        self._last_report[target] = now
        steps = f"{state.step}/{state.steps}" if state.steps else str(state.step)
        self._line(f"{target}: {run.id} token {steps}, {_rate(state.tok_s)} tok/s")

    def run_finished(self, target, run, record):
        _finish(self.tally, target, record)
        t = self.tally
        rate = (record.get("stream") or {}).get("tok_s")
        extra = f", {rate:.1f} tok/s" if rate else ""
        error = f" ({record['error']})" if record.get("error") else ""
        counts = ""
        with t.lock:
            if t.hosts:  # a farm: runs done by this target and by each host
                counts = f"; {target} {t.done_by_target.get(target, 0)}" + "".join(
                    f", {host} {done}" for host, (done, _) in t.host_counts().items()
                )
        where = f"@{t.hosts[target]}" if target in t.hosts else ""
        self._line(
            f"{target}{where}: {run.id} attempt {record.get('attempt')} {record.get('status')}"
            f"{error} in {record.get('duration_s', 0):.1f} s{extra} "
            f"[{t.done}/{t.total} done, eta {_clock(t.eta_s())}{counts}]"
        )

    def message(self, text):
        self._line(text)
