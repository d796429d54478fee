"""Benchmark: ``bmoe analyze replay`` as a whole command (a fresh process: start-up, reading
the trace, cutting the batches, the replays, printing) against libCacheSim's replay alone on
the same lookups, paired round by round, at 1 M lookups (the trace read whole) and at 100 M
(streamed, from CSV and from Parquet, with each command's peak RSS); then where the 1 M
command's time goes.

    python benchmarks/bench_replay_command.py [--rows 1000000] [--repeat 5]
        [--policies lru,s3fifo,arc] [--budgets 1000,2000,4000] [--baseline DIR]
        [--large-rows 100000000] [--large-repeat 3] [--dir DIR]

The trace is the corpus gemma route trace tiled to `--rows` rows (``tiled_trace.py``),
written as CSV. libCacheSim (its Python package; not a dependency of bmoe: without it the
benchmark says so and exits 0) replays the same lookups, one request per lookup, from an
oracleGeneral file written beforehand (the conversion not counted): its CPU time is that of
its ``process_trace`` calls alone, one per policy and budget. Each round runs the command
(its CPU time and peak RSS from the child's rusage) and then libCacheSim; `--baseline DIR`
adds the command of another checkout to each round (e.g. an older commit, to see a change).
The speed is libCacheSim's CPU time over the command's, per round (above 1: the whole
command takes less CPU than libCacheSim's replays alone); min / median / max and the load
average are printed.

The large case (`--large-rows`, 0 to skip it) writes the tiled trace block by block as CSV
(~33 bytes a row) and Parquet and libCacheSim's file (24 bytes a lookup) from the same
stream of batches: about 6 GB at 100 M rows in `--dir` (default the system's temporary
directory; refused when its disk has less room), removed at the end. Each of its rounds
runs ``--stream`` on the CSV and on the Parquet form, then libCacheSim.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_libcachesim import ORACLE, request_stream, write_oracle  # noqa: E402
from bench_stream import write_tiled  # noqa: E402
from tiled_trace import default_corpus, gemma_tiled  # noqa: E402

from bmoe.analyze import replay as rp  # noqa: E402
from bmoe.formats.route import write_route_trace  # noqa: E402

MIB = 1 << 20
LCS_NAMES = {"lru": "LRU", "lfu-incache": "LFU", "lfu": "LFU", "s3fifo": "S3FIFO",
             "s3fifo-libcachesim": "S3FIFO", "arc": "ARC", "belady": "Belady",
             "lfuda": "LFUDA", "sieve": "Sieve", "clock": "Clock", "random": "Random"}  # fmt: skip
#: bytes on disk per row of the large case: CSV, Parquet, libCacheSim's file (a lookup a row)
DISK_PER_ROW = 33 + 4 + ORACLE.itemsize

# the phases of the command, timed in a child process as the command runs them
PHASES = """
import os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
t = [time.process_time()]
out = []
def mark(label):
    now = time.process_time(); out.append((label, now - t[0])); t[0] = now
import numpy; mark("import numpy")
import bmoe.cli.replay; mark("import the CLI (typer, rich, bmoe)")
from bmoe.analyze import replay as rp
from bmoe.formats.route import read_route_columns
trace = read_route_columns(sys.argv[1], rp.REPLAY_COLUMNS); mark("read the CSV into columns")
b = rp.prepare_batches(trace); mark("cut the batches")
policies, budgets = sys.argv[2].split(","), [float(x) for x in sys.argv[3].split(",")]
rp.replay_curve(b, budgets[:1], policies, jobs=1, frame=False); mark("the replays at one budget")
rp.replay_curve(b, budgets, policies, jobs=1, frame=False); mark("the replays (every budget)")
for label, cpu in out:
    print(f"{cpu:.3f} {label}")
"""


#: runs ``bmoe ARGS`` and reports its own peak RSS (VmHWM of the new process image: a
#: fork's rusage would count this process's pages too) on stderr at exit
MEASURED = """
import atexit, sys
def peak():
    with open("/proc/self/status") as fh:
        hwm = next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM"))
    sys.stderr.write(f"\\nVmHWM {hwm}\\n")
atexit.register(peak)
from bmoe.cli import main
sys.exit(main(sys.argv[1:]))
"""


def child(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(CPU seconds (user + system), peak RSS in MiB) of the bmoe command line `argv` run to
    completion in a child process."""
    proc = subprocess.Popen([sys.executable, "-c", MEASURED, *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(cwd)})  # fmt: skip
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"bmoe {' '.join(argv)} failed: {err[-500:]}")
    return usage.ru_utime + usage.ru_stime, int(err.rsplit("VmHWM", 1)[1].split()[0]) / 1024


def spread(values: list[float], digits: int = 3) -> str:
    med = statistics.median(values)
    return f"{min(values):.{digits}f} / {med:.{digits}f} / {max(values):.{digits}f}"


def libcachesim_cpu(lcs, stream: Path, policies: list[str], budgets: list[float]) -> float:
    """CPU seconds of libCacheSim's process_trace calls (one per policy and budget)."""
    used = 0.0
    for budget in budgets:
        for policy in policies:
            cache = getattr(lcs, LCS_NAMES[policy])(round(budget * MIB))
            reader = lcs.TraceReader(str(stream), lcs.TraceType.ORACLE_GENERAL_TRACE)
            start = time.process_time()
            cache.process_trace(reader)
            used += time.process_time() - start
    return used


def paired(
    label: str,
    commands: dict[str, list[str]],
    trees: dict[str, Path],
    lcs,
    stream: Path,
    policies: list[str],
    budgets: list[float],
    repeat: int,
) -> None:
    """`repeat` rounds, each running every command (in each tree) and then libCacheSim;
    prints CPU, peak RSS and the speeds against libCacheSim, per round."""
    cpu: dict[str, list[float]] = {}
    peak: dict[str, list[float]] = {}
    loads = []
    for r in range(repeat):
        line = []
        for tree, root in trees.items():
            for name, argv in commands.items():
                key = f"{tree} {name}".strip()
                used, rss = child(argv, root)
                cpu.setdefault(key, []).append(used)
                peak.setdefault(key, []).append(rss)
                line.append(f"{key} {used:.2f}")
        cpu.setdefault("libcachesim", []).append(libcachesim_cpu(lcs, stream, policies, budgets))
        loads.append(os.getloadavg()[0])
        print(f"  round {r + 1}: " + ", ".join([*line, f"libcachesim {cpu['libcachesim'][-1]:.2f}"])
              + f" (load {loads[-1]:.1f})", flush=True)  # fmt: skip
    print(f"{label}: CPU-s, min / median / max of {repeat} rounds; load {min(loads):.1f}-"
          f"{max(loads):.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    lcs_runs = cpu["libcachesim"]
    print(f"  {'libCacheSim process_trace calls':<38} {spread(lcs_runs)}")
    for key, values in cpu.items():
        if key == "libcachesim":
            continue
        speed = [b / a for a, b in zip(values, lcs_runs, strict=True)]
        print(f"  {'bmoe ' + key:<38} {spread(values)}   speed vs libCacheSim "
              f"{spread(speed, 2)}x   peak RSS {max(peak[key]):.0f} MiB")  # fmt: skip


def large_case(args, lcs, policies: list[str], budgets: list[float], trees) -> None:
    """The trace tiled to `args.large_rows` rows, streamed from CSV and from Parquet."""
    rows = int(args.large_rows)
    room = shutil.disk_usage(args.dir or tempfile.gettempdir()).free
    need = rows * DISK_PER_ROW
    if room < 1.2 * need:
        print(f"\n{rows:,} rows: skipped, {need / 1e9:.1f} GB needed, "
              f"{room / 1e9:.1f} GB free in {args.dir or tempfile.gettempdir()}")  # fmt: skip
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as name:
        tmp = Path(name)
        csv, parquet = tmp / "large.route.csv", tmp / "large.route.parquet"
        stream = tmp / "large.oracleGeneral.bin"
        start = time.perf_counter()
        write_tiled(rows, csv, parquet)
        n = write_stream_oracle(csv, stream)
        print(f"\n{rows:,} rows, {n:,} lookups (CSV {csv.stat().st_size / 1e9:.2f} GB, Parquet "
              f"{parquet.stat().st_size / 1e9:.2f} GB, written in "
              f"{time.perf_counter() - start:.0f} s); --stream")  # fmt: skip
        base = ["analyze", "replay", "--stream", "--policies", args.policies, "--budgets",
                args.budgets]  # fmt: skip
        commands = {"--stream CSV": [*base, str(csv)], "--stream Parquet": [*base, str(parquet)]}
        paired(f"{rows:,} rows", commands, trees, lcs, stream, policies, budgets,
               args.large_repeat)  # fmt: skip


def write_stream_oracle(csv: Path, dest: Path) -> int:
    """libCacheSim's file of the lookups a streamed replay of `csv` makes, chunk by chunk
    (ids: the stream's key ids; no next accesses: these policies read none); their count."""
    from bmoe.analyze import replay_stream
    from bmoe.formats.route import iter_route_columns, read_route_head

    head = read_route_head(csv)
    sizes = head.expert_bytes()
    layers = np.array(sorted(sizes), dtype=np.int64)
    part_of = np.full(int(layers.max()) + 1, -1, dtype=np.int64)
    part_of[layers] = np.arange(len(layers))
    cut = replay_stream._Blocks(head, part_of, rp.preamble_count(head.meta, "n_expert"))
    done = 0
    with open(dest, "wb") as fh:
        blocks = iter_route_columns(csv, 1 << 18, rp.REPLAY_COLUMNS)
        for rows, first, last in replay_stream._whole_groups(blocks):
            chunk = cut.cut(rows, first, last)
            if chunk is None:
                continue
            records = np.empty(len(chunk.look), dtype=ORACLE)
            records["time"] = np.arange(done, done + len(chunk.look), dtype=np.uint32)
            records["id"] = chunk.look
            records["size"] = np.repeat(chunk.size, np.diff(chunk.bounds))
            records["next"] = -1
            fh.write(records.tobytes())
            done += len(chunk.look)
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--policies", default="lru,s3fifo,arc")
    ap.add_argument("--budgets", default="1000,2000,4000", help="MiB, comma-separated")
    ap.add_argument("--baseline", type=Path, help="another checkout's root, run alongside")
    ap.add_argument("--large-rows", type=float, default=100e6, help="0: no large case")
    ap.add_argument("--large-repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, help="where the large case's files go")
    ap.add_argument("--corpus", type=Path, default=default_corpus())
    args = ap.parse_args()
    try:
        import libcachesim as lcs
    except ImportError:
        print("libcachesim is not installed (pip install libcachesim): nothing to compare")
        return
    policies = args.policies.split(",")
    budgets = [float(b) for b in args.budgets.split(",")]
    missing = [p for p in policies if p not in LCS_NAMES]
    if missing:
        sys.exit(f"libCacheSim has no counterpart of {', '.join(missing)}")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "bmoe")], check=True)
    trees = {"": ROOT} | ({"baseline": args.baseline} if args.baseline else {})

    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "tiled.route.csv"
        trace = gemma_tiled(args.rows, args.corpus)
        write_route_trace(trace, csv)
        batches = rp.prepare_batches(trace)
        stream = Path(tmp) / "stream.oracleGeneral.bin"
        write_oracle(stream, *request_stream(batches))
        n = len(batches.look)
        del trace, batches
        command = ["analyze", "replay", str(csv), "--policies", args.policies, "--budgets",
                   args.budgets]  # fmt: skip
        for root in trees.values():  # build or load every kernel before timing
            child(command, root)
        print(f"{args.rows:,} rows, {n:,} lookups; {', '.join(policies)} at {args.budgets} MiB; "
              f"libcachesim {lcs.__version__}")  # fmt: skip
        paired(f"{args.rows:,} rows", {"command": command}, trees, lcs, stream, policies,
               budgets, args.repeat)  # fmt: skip
        print()
        print("where the command's time goes (one run of its phases, CPU-s):")
        done = subprocess.run(
            [sys.executable, "-c", PHASES, str(csv), args.policies, args.budgets],
            check=True, capture_output=True, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        print("\n".join(f"  {line}" for line in done.stdout.splitlines()))
    if args.large_rows:
        large_case(args, lcs, policies, budgets, trees)


if __name__ == "__main__":
    main()
