"""Robustness audit: every CLI command on damaged and crafted inputs, counted.

Replays the audit behind the robustness contract with the files tests/hostile_inputs.py
generates from the real corpus, in families (``--families``, all by default):

- ``file``: truncations, byte flips, garbage lines, CRLF, BOM, binary, markup-looking text,
  preamble values set to empty / x / nan / huge / negative, ids beyond n_expert, sizes beyond
  int64, wall_ms of nan/inf/0, columns removed, a FIFO, /dev/zero, a runaway preamble value;
- ``sweep``: damaged copies of an archived sweep folder (control characters in its cells too);
- ``parquet``: each row file's Parquet form with a column dropped, renamed, stored as text,
  with NaN, nulls, values beyond int32 or nested lists; every ``bmoe.*`` metadata key
  missing or set to 1, null, garbage, deep JSON;
- ``text``: header names dropped, renamed, spelled with blanks; control characters in
  preamble values, cells and headers;
- ``profile``: device profiles with every value set to ±Infinity, NaN, null, text, 1e20,
  1e39, ..., sections of the wrong shape, deep nesting, Latin-1 and UTF-16 files, duplicate
  keys, a 10 MB caveat, through ``predict`` and ``sweep --dry-run``;
- ``config``: sweep configurations asking for unbounded work (grids of 10^4 to 10^6 cells,
  repeats / warmup / max_repeats of 1e9, prompt files that are devices, FIFOs, loops or 20 GB
  sparse files, TOML nested 10^5 deep, cache_mb = 1e308);
- ``special``: symlink loops, dangling links, directories, links to devices, a 20 GB sparse
  file that starts like a metrics CSV (``--sparse-gb``);
- ``writers``: every command that writes a file, over an existing file without --force and
  over its input (and a link to it) with --force;
- ``oversized``: 20 GB sparse route traces (no line, a header then NULs, rows then NULs), a
  few MB of Parquet declaring 200 M rows, fidelity references declaring vast arrays or
  inflating to 2 GiB (through ``run --fidelity-ref`` and a tune's ``fidelity_ref``);
- ``formulas``: text a spreadsheet runs (``=cmd|...``, ``+``, ``-``, ``@``, tab, CR) in a
  preamble and a sweep's cells, through every CSV output (``-f csv``, ``--csv``): any such
  cell written as it is counts;
- ``session``: each of ~40 hostile requests (nesting 200,000 deep, 5,000-digit numbers,
  lone surrogates, 64 MiB lines, wrong types, ...) alone in a ``bmoe run --session`` of a
  generated tiny model, then a valid one: answered for its id, the next served;
- ``tune``: tunes of that model, faulted (SIGKILL 1-3 times, a full disk at a completed run,
  then its hint followed and ``bmoe sweep`` of the folder refused, a torn last manifest line,
  duplicated ``ok`` lines), resumed to their end: runs lost, counted twice, over budget.

Each run goes through the CLI's main() in a worker process under an address-space cap
(``--memory-cap-gb``) with a per-run timeout; the worker's peak RSS mark is reset before
every run. Prints runs, tracebacks, internal errors (exit 3), hangs (killed at the timeout),
escapes (a control character on stdout, stderr or in a file a command rendered), overwrites
(a writer that changed the file it had to leave alone), formula cells, other exit codes, and
the largest peak RSS; the session and tune families run their own processes (the same cap).

With ``--rows N`` it also measures peak memory of ``validate``, ``analyze route``,
``analyze drop`` and ``analyze replay`` on an N-row route trace against the size of the
trace's DataFrame (the target: within 3x).

    nice python benchmarks/robustness.py              # every family (~59 k runs, ~2.5 h)
    python benchmarks/robustness.py --families file   # the first round's cases (~21 k runs)
    python benchmarks/robustness.py --every           # every command on every case
    python benchmarks/robustness.py --sample 300      # a quick run
    python benchmarks/robustness.py --rows 10000000   # and memory on 10 M rows
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

WORKER = r"""
import json, os, re, resource, sys
sys.path.insert(0, sys.argv[1])
cap = int(sys.argv[2])
if cap:  # the memory cap of the machine the audit stands for: a runaway read fails, alone
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from hostile_inputs import formula_cells, run_in_process
import bmoe.cli
bmoe.cli.register()
# what a terminal acts on: C0 controls but tab and newline, DEL, C1 controls
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
DATA = (".parquet", ".png", ".gguf")

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

def escape(r, out, files):
    for name, text in (("stdout", r.out), ("stderr", r.err)):
        m = CONTROL.search(text)
        if m:
            return f"{name}: {text[max(0, m.start() - 30):m.end() + 10]!r}"
    if not files or not out:
        return ""
    for root, _dirs, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            if name.endswith(DATA) or os.path.islink(path):
                continue
            with open(path, "rb") as fh:
                text = fh.read(1 << 24).decode("utf-8", "replace")
            m = CONTROL.search(text)
            if m:
                return f"{name}: {text[max(0, m.start() - 30):m.end() + 10]!r}"
    return ""

def formulas(r, args, out):
    # cells of the CSV a command printed (-f csv) or wrote (*.csv under out) a spreadsheet runs
    printed = "csv" in args and ("-f" in args or "--format" in args)
    found = formula_cells(r.out) if printed else []
    for root, _dirs, names in os.walk(out) if out else ():
        for name in names:
            if name.endswith(".csv"):
                with open(os.path.join(root, name), encoding="utf-8", errors="replace") as fh:
                    found += formula_cells(fh.read(1 << 24))
    return found[:3]

print(json.dumps({"ready": hwm_kib()}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    reset_hwm()
    r = run_in_process(job["args"])
    err = r.err.strip().splitlines()
    print(json.dumps({"code": r.code, "traceback": r.traceback, "err": err[-1] if err else "",
                      "hwm_kib": hwm_kib(), "escape": escape(r, job["out"], job["files"]),
                      "formulas": formulas(r, job["args"], job["out"]) if job.get("csv")
                      else []}),
          flush=True)
"""


class Worker:
    """A Python process running CLI commands in-process, one per line of its stdin."""

    def __init__(self, cap_bytes: int = 0) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
        self.cap = cap_bytes
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(ROOT / "tests"), str(cap_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.base_kib = json.loads(self.proc.stdout.readline())["ready"]

    def run(
        self, args: list[str], timeout: float, out: Path | None = None, files: bool = True
    ) -> dict | None:
        """The run's outcome, or None when it did not finish in `timeout` seconds. The files
        written under `out` are searched for control characters when `files`, and the CSV
        the command printed or wrote for formula cells."""
        csv = "csv" in args or "--csv" in args
        job = {"args": args, "out": str(out) if out else "", "files": files, "csv": csv}
        self.proc.stdin.write(json.dumps(job) + "\n")
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


#: Case families (``--families``): the first round's, the second's, then the third's.
FAMILIES = ("file", "sweep", "parquet", "text", "profile", "config", "special", "writers",
            "oversized", "formulas", "session", "tune")  # fmt: skip
#: Commands whose files in the output folder are data, not rendered text (convert writes the
#: input's bytes back, control characters included).
DATA_COMMANDS = ("convert", "convert-csv")


def cases_of(families: set[str], corpus: Path, args: argparse.Namespace) -> list:
    import hostile_inputs as h

    sweep = ROOT / "bench-data" / "2026-11-29-small-traces"
    made = {
        "file": lambda: h.file_cases(corpus, big_value=args.big_mb << 20),
        "sweep": lambda: h.sweep_cases(sweep),
        "parquet": lambda: h.parquet_cases(corpus),
        "text": lambda: h.text_cases(corpus),
        "profile": lambda: h.profile_cases(corpus),
        "config": h.config_cases,
        "special": lambda: h.special_cases(corpus, args.sparse_gb),
        "oversized": lambda: h.oversized_cases(corpus, args.sparse_gb),
        "formulas": lambda: h.formula_cases(corpus, sweep),
    }
    return [case for family in FAMILIES if family in families and family in made
            for case in made[family]()]  # fmt: skip


def writer_jobs(corpus: Path, folder: Path) -> list[tuple[str, str, list[str], Path]]:
    """Every writer onto an existing file without --force, and onto its input (and a link to
    it) with --force: (label, writer, argv, the file that must come out unchanged)."""
    from hostile_inputs import WRITERS, writer_inputs, writer_scenarios

    scratch = folder / "writers"
    inputs = writer_inputs(corpus, scratch, ROOT / "bench-data" / "2026-11-29-small-traces")
    jobs = []
    for name in WRITERS:
        for scenario, cmd, keep in writer_scenarios(name, scratch, inputs):
            jobs.append((scenario, name, cmd, keep))
    return jobs


def tiny_model(folder: Path) -> Path:
    """The generated tiny model the third round's engine runs use (made once)."""
    from bmoe.engine.synth import synth_model

    path = folder / "tiny.gguf"
    if not path.is_file():
        synth_model(path, "tiny")
    return path


#: A child process running ``bmoe ARGS`` under the address-space cap, its peak RSS written
#: to stderr at exit; with BMOE_AUDIT_FULL_AT=k the disk is "full" at the k-th completed run.
LAUNCHER = r"""
import atexit, os, resource, sys
cap = int(sys.argv[1])
if cap:
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            os.write(2, f"\nBMOE_AUDIT_HWM {line.split()[1]}\n".encode())
atexit.register(hwm)
if os.environ.get("BMOE_AUDIT_FULL_AT"):
    sys.path.insert(0, os.environ["BMOE_AUDIT_TESTS"])
    from hostile_inputs import inject_full_disk
    inject_full_disk(int(os.environ["BMOE_AUDIT_FULL_AT"]))
from bmoe.cli import main
sys.exit(main(sys.argv[2:]))
"""


class Child:
    """``bmoe ARGS`` in a process of its own session (killed with its engines)."""

    def __init__(self, args: list, cap: int, stdin: bytes | None = None, full_at: int = 0):
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100",
                   BMOE_AUDIT_TESTS=str(ROOT / "tests"))  # fmt: skip
        if full_at:
            env["BMOE_AUDIT_FULL_AT"] = str(full_at)
        self.args = [str(a) for a in args]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(cap), *self.args], cwd=ROOT, env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self.stdin = stdin
        self.out = self.err = b""

    def wait(self, timeout: float) -> bool:
        """Whether it ended within `timeout` seconds (else it is killed: a hang)."""
        try:
            self.out, self.err = self.proc.communicate(self.stdin, timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            self.out, self.err = self.proc.communicate()
            return False

    def kill(self) -> None:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    @property
    def hwm_kib(self) -> int:
        m = re.search(rb"BMOE_AUDIT_HWM (\d+)", self.err)
        return int(m.group(1)) if m else 0

    @property
    def stderr(self) -> str:
        return re.sub(r"\n?BMOE_AUDIT_HWM \d+\n", "", self.err.decode("utf-8", "replace"))


class Tally:
    """Counts, problem lines and the largest peak RSS of an audit part."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.problems: list[str] = []
        self.peak_kib = 0
        self.peak_run = ""

    def problem(self, key: str, line: str) -> None:
        self.counts[key] += 1
        self.problems.append(line)

    def peak(self, kib: int, run: str) -> None:
        if kib > self.peak_kib:
            self.peak_kib, self.peak_run = kib, run

    def child(self, child: Child, label: str, ended: bool) -> None:
        """A child's hang, traceback, internal error, escape and peak."""
        err = child.stderr
        if not ended:
            self.problem("hangs", f"HANG {label}: bmoe {' '.join(child.args)[:200]}")
        if "Traceback (most recent call last)" in err:
            self.problem("tracebacks", f"TRACEBACK {label}: {err.strip().splitlines()[-1]}")
        elif "internal error:" in err or child.proc.returncode == 3:
            line = next((ln for ln in err.splitlines() if "internal error" in ln), err[-200:])
            self.problem("internal errors", f"INTERNAL {label}: {line}")
        for name, text in (("stdout", child.out.decode("utf-8", "replace")), ("stderr", err)):
            m = CONTROL.search(text)
            if m:
                bad = text[max(0, m.start() - 30) : m.end() + 10]
                self.problem("escapes", f"ESCAPE {label} {name}: {bad!r}")
        self.peak(child.hwm_kib, label)


#: What a terminal acts on: C0 controls but tab and newline, DEL, C1 controls.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def session_audit(args: argparse.Namespace, model: Path, tally: Tally) -> None:
    """Each hostile request alone in a ``bmoe run --session``, then a valid one: answered for
    its id (or -1), the next served, the session still up."""
    import hostile_inputs as h

    from bmoe.formats import protocol

    cap = args.memory_cap_gb << 30
    for n, (label, line, rid, answer) in enumerate(h.SESSION_REQUESTS):
        good = h.SESSION_GOOD % (1000 + n)
        feed = line + b"\n" + good + b"\n" + b'{"cmd":"close"}\n'
        child = Child(["run", "-m", model, "-n", "2", "-t", "1", "--session"], cap, feed)
        ended = child.wait(args.timeout * 2)
        tally.counts["session requests"] += 1
        tally.child(child, f"session {label}", ended)
        events = [e for e in protocol.iter_events(child.out.splitlines())
                  if e.tag in ("ERROR", "DONE")]  # fmt: skip
        got = [(e.tag, e.data.get("id")) for e in events]
        if got[:1] != [(answer, rid)]:
            tally.problem("unanswered", f"UNANSWERED session {label}: {got[:2]} ({answer} {rid})")
        if got[1:] != [("DONE", 1000 + n)]:
            tally.problem("next dropped", f"DROPPED session {label}: {got[1:]}")
        if child.proc.returncode != 0:
            tally.problem("sessions died", f"DIED session {label}: exit {child.proc.returncode}")


def _sweep_root(output: Path) -> Path | None:
    found = [p for p in output.iterdir() if p.is_dir()] if output.is_dir() else []
    return found[0] if len(found) == 1 else None


#: The tune fault scenarios, in the order they run (``--tune-trials`` takes the first N).
TUNE_SCENARIOS = ("kill", "full-disk", "torn", "duplicated", "kill", "full-disk", "torn",
                  "kill", "duplicated", "full-disk", "kill", "torn")  # fmt: skip


def tune_audit(args: argparse.Namespace, folder: Path, model: Path, tally: Tally) -> None:
    """Tunes of the tiny model, each faulted: SIGKILL (1-3 times), a full disk at a random
    completed run (then its hint followed, and ``bmoe sweep`` of the folder refused), a torn
    last manifest line after a kill, the ok lines duplicated after a kill; each resumed to
    its end and its folder checked (:func:`hostile_inputs.tune_problems`)."""
    import shlex
    import signal

    import hostile_inputs as h

    rng = random.Random(0)
    cap = args.memory_cap_gb << 30
    budget = 7
    for trial, scenario in enumerate(TUNE_SCENARIOS[: args.tune_trials]):
        base = folder / f"tune-{trial}"
        base.mkdir()
        cfg = base / "tune.toml"
        cfg.write_text(h.tune_text(model, base / "out", budget), encoding="utf-8")
        label = f"tune {trial} ({scenario})"
        tally.counts["tune trials"] += 1
        faults = 0
        if scenario == "full-disk":
            child = Child(["tune", cfg, "--plain"], cap, full_at=rng.randint(1, 4))
            tally.child(child, label, child.wait(args.tune_timeout))
            errors = [ln for ln in child.stderr.splitlines() if ln.startswith("error:")]
            hint = re.search(r"resume with: (bmoe tune .*)\)$", errors[-1]) if errors else None
            root = _sweep_root(base / "out")
            if child.proc.returncode != 2 or len(errors) != 1 or hint is None or root is None:
                tally.problem("wrong hints", f"HINT {label}: exit {child.proc.returncode}, "
                                             f"{errors[-1:] or child.stderr[-200:]}")  # fmt: skip
                continue
            faults = 1
            before = (root / "sweep.toml").read_bytes()
            sweep = Child(["sweep", root, "--plain"], cap)
            tally.child(sweep, f"{label} sweep DIR", sweep.wait(args.timeout))
            if sweep.proc.returncode != 2 or (root / "sweep.toml").read_bytes() != before:
                tally.problem("wrong hints", f"SWEEP {label}: bmoe sweep of the tune folder "
                                             f"exit {sweep.proc.returncode}")  # fmt: skip
            resumed = Child([*shlex.split(hint.group(1))[1:], "--plain"], cap)
            tally.child(resumed, f"{label} resumed", resumed.wait(args.tune_timeout))
            final = resumed
        else:
            kills = rng.randint(1, 3) if scenario == "kill" else 1
            target: Path = cfg
            final = None
            for k in range(kills + 1):
                child = Child(["tune", target, "--plain"], cap)
                if k < kills:
                    try:
                        child.proc.wait(timeout=rng.uniform(3.0, 20.0))
                    except subprocess.TimeoutExpired:
                        os.killpg(child.proc.pid, signal.SIGKILL)
                        faults += 1
                    child.wait(60)
                    tally.peak(child.hwm_kib, label)
                    root = _sweep_root(base / "out")
                    if root is not None:  # resumed by its folder from now on
                        target = root
                        if (root / "manifest.jsonl").is_file() and k == 0:
                            if scenario == "torn":
                                h.tear_manifest(root, rng)
                            elif scenario == "duplicated":
                                h.duplicate_ok_lines(root)
                    continue
                tally.child(child, label, child.wait(args.tune_timeout))
                final = child
        root = _sweep_root(base / "out")
        if final is None or root is None:
            tally.problem("tunes failed", f"FAILED {label}: no folder")
            continue
        if final.proc.returncode not in (0, 1):
            tally.problem("tunes failed", f"FAILED {label}: exit {final.proc.returncode}: "
                                          f"{final.stderr.strip().splitlines()[-1:]}")  # fmt: skip
        tally.counts["tune faults"] += faults
        for key, value in h.tune_problems(root, budget, faults).items():
            if value:
                tally.problem(f"runs {key}" if key != "state" else "tune states wrong",
                              f"TUNE {label}: {value} {key}")  # fmt: skip


def audit(args: argparse.Namespace, folder: Path) -> None:
    from hostile_inputs import FILE_COMMANDS, argv, commands, fixtures, materialize

    corpus = Path(os.environ.get("BMOE_CORPUS", ROOT.parent / "shared" / "corpus"))
    if not corpus.is_dir():
        sys.exit(f"no corpus at {corpus} (set BMOE_CORPUS)")
    families = set(args.families.split(","))
    unknown = families - set(FAMILIES)
    if unknown:
        sys.exit(f"unknown families {sorted(unknown)} (choose from {', '.join(FAMILIES)})")
    cases = cases_of(families, corpus, args)
    if args.sample:
        cases = random.Random(0).sample(cases, min(args.sample, len(cases)))
    extra = fixtures(corpus, folder)
    model = tiny_model(folder) if families & {"oversized", "session", "tune"} else None
    extra["model"] = model
    jobs: list[tuple[str, str, list[str], Path]] = []
    for case in cases:
        path = materialize(case, folder)
        for i, (name, template) in enumerate(commands(case, args.every)):
            out = folder / f"{case.name}.out{i}"
            out.mkdir()
            jobs.append((f"{case.name} ({case.what})", name, argv(template, path, out, extra), out))
    if "file" in families:
        for label, path in special_cases(folder):
            for name, template in FILE_COMMANDS.items():
                out = folder / f"{label}.{name}.out"
                out.mkdir()
                jobs.append((label, name, argv(template, path, out, extra), out))
    writers = writer_jobs(corpus, folder) if "writers" in families else []

    cap = args.memory_cap_gb << 30
    print(f"{len(cases)} cases ({', '.join(sorted(families))}), {len(jobs) + len(writers)} runs "
          f"({len(writers)} of writers), timeout {args.timeout:g} s, memory cap "
          f"{args.memory_cap_gb or 'none'} GiB", flush=True)  # fmt: skip
    tally = Tally()
    counts, problems = tally.counts, tally.problems
    started = time.monotonic()
    worker = Worker(cap)
    base_kib = worker.base_kib
    try:
        for n, (label, name, cmd, out) in enumerate(jobs, 1):
            outcome = worker.run(cmd, args.timeout, out, files=name not in DATA_COMMANDS)
            counts["runs"] += 1
            if outcome is None:
                counts["hangs"] += 1
                problems.append(f"HANG {name} on {label}: bmoe {' '.join(cmd)}")
                worker.close()
                worker = Worker(cap)
                continue
            if outcome.get("escape"):
                counts["escapes"] += 1
                problems.append(f"ESCAPE {name} on {label}: {outcome['escape']}")
            if outcome.get("formulas"):
                counts["formula cells"] += 1
                problems.append(f"FORMULA {name} on {label}: {outcome['formulas']!r}")
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
                    worker = Worker(cap)
                    continue
            else:
                counts[f"exit {outcome['code']}"] += 1
            tally.peak(outcome["hwm_kib"], f"{name} on {label}")
            if args.progress and n % 500 == 0:
                print(f"  {n}/{len(jobs)} runs, {time.monotonic() - started:.0f} s", flush=True)
        for scenario, name, cmd, keep in writers:
            before = keep.read_bytes()
            outcome = worker.run(cmd, args.timeout, None, files=False)
            counts["runs"] += 1
            if outcome is None:
                counts["hangs"] += 1
                problems.append(f"HANG {name} ({scenario}): bmoe {' '.join(cmd)}")
                worker.close()
                worker = Worker(cap)
                continue
            if keep.read_bytes() != before or outcome["code"] != 2:
                counts["overwrites"] += 1
                problems.append(f"OVERWRITE {name} ({scenario}): exit {outcome['code']} "
                                f"{outcome['err']}")  # fmt: skip
            elif outcome["traceback"]:
                counts["tracebacks"] += 1
            else:
                counts[f"exit {outcome['code']}"] += 1
            tally.peak(outcome["hwm_kib"], f"{name} ({scenario})")
    finally:
        worker.close()
    worker_peak = (tally.peak_kib, tally.peak_run)
    tally.peak_kib, tally.peak_run = 0, ""
    if "session" in families and model is not None:
        session_audit(args, model, tally)
        print(f"  sessions done, {time.monotonic() - started:.0f} s", flush=True)
    if "tune" in families and model is not None:
        tune_audit(args, folder, model, tally)
    child_peak = (tally.peak_kib, tally.peak_run)
    for line in problems[: args.show]:
        print(line)
    if len(problems) > args.show:
        print(f"... and {len(problems) - args.show} more")
    print()
    print(f"runs             {counts['runs']}")
    bad = ("tracebacks", "internal errors", "hangs", "escapes", "overwrites", "formula cells")
    for key in bad:
        print(f"{key:<16} {counts[key]}")
    for key in sorted(k for k in counts if k.startswith("exit")):
        print(f"{key:<16} {counts[key]}")
    if "session" in families:
        third = ("session requests", "unanswered", "next dropped", "sessions died")
        print("  ".join(f"{k} {counts[k]}" for k in third))
    if "tune" in families:
        third = (
            "tune trials",
            "tune faults",
            "tunes failed",
            "wrong hints",
            "runs lost",
            "runs counted twice",
            "runs over budget",
            "runs unreadable",
            "tune states wrong",
        )
        print("  ".join(f"{k} {counts[k]}" for k in third))  # fmt: skip
    print(f"peak RSS         {worker_peak[0] / 1024:.0f} MiB ({worker_peak[1]}); worker at rest "
          f"{base_kib / 1024:.0f} MiB")  # fmt: skip
    if child_peak[0]:
        print(f"peak RSS (child) {child_peak[0] / 1024:.0f} MiB ({child_peak[1]}; a tune's "
              "engine processes not included)")  # fmt: skip
    print(f"time             {time.monotonic() - started:.0f} s")
    bad_third = ("unanswered", "next dropped", "sessions died", "tunes failed", "wrong hints",
                 "runs lost", "runs counted twice", "runs over budget", "runs unreadable",
                 "tune states wrong")  # fmt: skip
    if args.check and any(counts[k] for k in (*bad, *bad_third)):
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
    parser.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help=f"case families to run (default all: {','.join(FAMILIES)})",
    )
    parser.add_argument(
        "--sparse-gb",
        type=int,
        default=20,
        help="size of the sparse file that starts like a metrics CSV",
    )
    parser.add_argument(
        "--memory-cap-gb", type=int, default=4, help="address-space cap of the worker (0: none)"
    )
    parser.add_argument(
        "--tune-trials", type=int, default=len(TUNE_SCENARIOS), help="faulted tunes to run"
    )
    parser.add_argument(
        "--tune-timeout", type=float, default=900.0, help="seconds for one tune process"
    )
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
