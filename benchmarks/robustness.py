"""Robustness audit: every CLI command on damaged and crafted inputs, counted.

Replays the audit behind the robustness contract with the files tests/hostile_inputs.py
generates from the real corpus (truncations, byte flips, garbage lines, CRLF, BOM, binary,
markup-looking text, preamble values set to empty / x / nan / huge / negative, ids beyond
n_expert, sizes beyond int64, wall_ms of nan/inf/0, columns removed), damaged copies of an
archived sweep folder, a FIFO and a runaway preamble value. Each run goes through the CLI's
main() in a worker process with a per-run timeout; the worker's peak RSS mark is reset before
every run. Prints runs, tracebacks, internal errors (exit 3), hangs (killed at the timeout),
other exit codes, and the largest peak RSS.

With ``--rows N`` it also measures peak memory of ``validate``, ``analyze route``,
``analyze drop`` and ``analyze replay`` on an N-row route trace against the size of the
trace's DataFrame (the target: within 3x).

    python benchmarks/robustness.py                   # the kind-matched commands on every case
    python benchmarks/robustness.py --every           # every command on every case (~23 k runs)
    python benchmarks/robustness.py --sample 300      # a quick run
    python benchmarks/robustness.py --rows 10000000   # and memory on 10 M rows
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from hostile_inputs import run_in_process
import bmoe.cli
bmoe.cli.register()

def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0

def reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass

print(json.dumps({"ready": hwm_kib()}), flush=True)
for line in sys.stdin:
    args = json.loads(line)
    reset_hwm()
    r = run_in_process(args)
    err = r.err.strip().splitlines()
    print(json.dumps({"code": r.code, "traceback": r.traceback, "err": err[-1] if err else "",
                      "hwm_kib": hwm_kib()}), flush=True)
"""


class Worker:
    """A Python process running CLI commands in-process, one per line of its stdin."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(ROOT / "tests")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.base_kib = json.loads(self.proc.stdout.readline())["ready"]

    def run(self, args: list[str], timeout: float) -> dict | None:
        """The run's outcome, or None when it did not finish in `timeout` seconds."""
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"code": "died", "traceback": None, "err": ""}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def special_cases(folder: Path) -> list[tuple[str, Path]]:
    """A FIFO nobody writes to, and a device: every command must refuse them, not block."""
    fifo = folder / "fifo.route.csv"
    os.mkfifo(fifo)
    return [("fifo", fifo), ("device", Path("/dev/zero"))]


def audit(args: argparse.Namespace, folder: Path) -> None:
    from hostile_inputs import (
        FILE_COMMANDS,
        argv,
        commands,
        file_cases,
        materialize,
        sweep_cases,
    )

    corpus = Path(os.environ.get("BMOE_CORPUS", ROOT.parent / "shared" / "corpus"))
    if not corpus.is_dir():
        sys.exit(f"no corpus at {corpus} (set BMOE_CORPUS)")
    cases = file_cases(corpus, big_value=args.big_mb << 20)
    sweep = ROOT / "bench-data" / "2026-11-29-small-traces"
    cases += sweep_cases(sweep)
    if args.sample:
        cases = random.Random(0).sample(cases, min(args.sample, len(cases)))
    jobs: list[tuple[str, str, list[str]]] = []
    for case in cases:
        path = materialize(case, folder)
        for i, (name, template) in enumerate(commands(case, args.every)):
            out = folder / f"{case.name}.out{i}"
            out.mkdir()
            jobs.append((f"{case.name} ({case.what})", name, argv(template, path, out)))
    for label, path in special_cases(folder):
        for name, template in FILE_COMMANDS.items():
            out = folder / f"{label}.{name}.out"
            out.mkdir()
            jobs.append((label, name, argv(template, path, out)))

    print(f"{len(cases)} cases + FIFO and device, {len(jobs)} runs, timeout {args.timeout:g} s")
    counts: collections.Counter = collections.Counter()
    problems: list[str] = []
    peak_kib = 0
    peak_run = ""
    started = time.monotonic()
    worker = Worker()
    base_kib = worker.base_kib
    try:
        for n, (label, name, cmd) in enumerate(jobs, 1):
            outcome = worker.run(cmd, args.timeout)
            counts["runs"] += 1
            if outcome is None:
                counts["hangs"] += 1
                problems.append(f"HANG {name} on {label}: bmoe {' '.join(cmd)}")
                worker.close()
                worker = Worker()
                continue
            if outcome["traceback"]:
                counts["tracebacks"] += 1
                last = outcome["traceback"].strip().splitlines()[-1]
                problems.append(f"TRACEBACK {name} on {label}: {last}")
            elif outcome["code"] == 3:
                counts["internal errors"] += 1
                problems.append(f"INTERNAL {name} on {label}: {outcome['err']}")
            elif outcome["code"] not in (0, 1, 2):
                counts[f"exit {outcome['code']}"] += 1
                problems.append(f"EXIT {outcome['code']} {name} on {label}: {outcome['err']}")
                if outcome["code"] == "died":
                    worker.close()
                    worker = Worker()
                    continue
            else:
                counts[f"exit {outcome['code']}"] += 1
            if outcome["hwm_kib"] > peak_kib:
                peak_kib, peak_run = outcome["hwm_kib"], f"{name} on {label}"
            if args.progress and n % 500 == 0:
                print(f"  {n}/{len(jobs)} runs, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        worker.close()
    for line in problems[: args.show]:
        print(line)
    if len(problems) > args.show:
        print(f"... and {len(problems) - args.show} more")
    print()
    print(f"runs             {counts['runs']}")
    for key in ("tracebacks", "internal errors", "hangs"):
        print(f"{key:<16} {counts[key]}")
    for key in sorted(k for k in counts if k.startswith("exit")):
        print(f"{key:<16} {counts[key]}")
    print(f"peak RSS         {peak_kib / 1024:.0f} MiB ({peak_run}); worker at rest "
          f"{base_kib / 1024:.0f} MiB")  # fmt: skip
    print(f"time             {time.monotonic() - started:.0f} s")
    if args.check and (counts["tracebacks"] or counts["internal errors"] or counts["hangs"]):
        sys.exit(1)


def write_trace(path: Path, rows: int) -> None:
    """A decode route trace of about `rows` rows (48 layers, top-8), with the project's writer."""
    import numpy as np
    import pandas as pd

    from bmoe.formats.route import RouteTraceWriter

    layers, k, n_expert = 48, 8, 128
    rng = np.random.default_rng(0)
    meta = {"model": "synthetic.gguf", "arch": "qwen3moe", "n_layer": layers,
            "n_expert": n_expert, "n_expert_used": k}  # fmt: skip
    sizes = pd.DataFrame({"layer": np.arange(layers), "expert_bytes": 4_336_640,
                          "dense_bytes": 25_165_824})  # fmt: skip
    steps = max(1, rows // (layers * k))
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        writer = RouteTraceWriter(fh, meta, sizes)
        block = 200
        for first in range(0, steps, block):
            n = min(block, steps - first) * layers * k
            cell = np.arange(n) // k
            residency = rng.integers(0, 2, n)
            writer.rows(
                pd.DataFrame({
                    "turn": 0, "phase": 1, "step": 30 + first + cell // layers,
                    "layer": cell % layers, "slot": np.arange(n) % k,
                    "expert": rng.integers(0, n_expert, n),
                    "weight": np.round(rng.random(n) / k, 6).astype(np.float32),
                    "residency": residency,
                    "expert_bytes": np.where(residency == 0, 4_336_640, 0), "dropped": 0,
                })
            )  # fmt: skip


def memory(args: argparse.Namespace, folder: Path) -> None:
    from bmoe.formats.route import read_route_trace

    path = folder / "big.route.csv"
    t0 = time.monotonic()
    write_trace(path, args.rows)
    frame = read_route_trace(path).rows
    frame_mib = frame.memory_usage(deep=True).sum() / 2**20
    print(f"\nroute trace of {len(frame)} rows written in {time.monotonic() - t0:.0f} s; "
          f"its DataFrame {frame_mib:.0f} MiB")  # fmt: skip
    del frame
    runs = {
        "info (the read)": ["info", str(path), "--format", "json"],
        "validate": ["validate", str(path)],
        "analyze route": ["analyze", "route", str(path), "--format", "json"],
        "analyze drop": ["analyze", "drop", str(path), "--format", "json"],
        "analyze replay": ["analyze", "replay", str(path), "--budgets", "64,512",
                           "--policies", "lru", "--format", "json"],
    }  # fmt: skip
    print(f"{'command':<16} {'exit':>4} {'seconds':>8} {'peak MiB':>9} {'over rest':>9} "
          f"{'x frame':>7}")  # fmt: skip
    for name, cmd in runs.items():
        worker = Worker()
        t0 = time.monotonic()
        outcome = worker.run(cmd, args.timeout * 60)
        took = time.monotonic() - t0
        worker.close()
        if outcome is None:
            print(f"{name:<16} hang (over {args.timeout * 60:g} s)")
            continue
        peak = outcome["hwm_kib"] / 1024
        over = peak - worker.base_kib / 1024
        print(f"{name:<16} {outcome['code']!s:>4} {took:8.1f} {peak:9.0f} {over:9.0f} "
              f"{over / frame_mib:7.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", action="store_true", help="every command on every case")
    parser.add_argument("--sample", type=int, default=0, help="only this many cases (random)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per run")
    parser.add_argument("--big-mb", type=int, default=50, help="size of the runaway value")
    parser.add_argument("--rows", type=int, default=0, help="also measure memory on N rows")
    parser.add_argument("--show", type=int, default=40, help="problem lines to print")
    parser.add_argument("--progress", action="store_true", help="a line every 500 runs")
    parser.add_argument("--check", action="store_true", help="exit 1 on any problem")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bmoe-robustness-"))
    try:
        audit(args, folder)
        if args.rows:
            memory(args, folder)
    finally:
        if args.keep:
            print(f"files kept in {folder}")
        else:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
