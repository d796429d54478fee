"""Benchmark: the default route views on a generated trace of 1.47 million rows (48 layers,
128 experts, top-6), against a straightforward pure-Python implementation of the same views
(``tests/oracles/route.py``, the reference script) measured in the same run: in process
(read, select, views; CPU time), for the DataFrame API and for the numpy columns the command
line uses, and end to end (``bmoe analyze route TRACE`` against ``python
tests/oracles/route.py TRACE`` in fresh processes, runs interleaved round by round: CPU time
including start-up and printing, and peak RSS; bmoe's output once to a pipe and once to a
file, the script's to a pipe). `--baseline DIR` adds another checkout's command to each
round, to a pipe and to a file (the time before a change); the commands' order turns each
round. Per round the ratios (the script's CPU over bmoe's, the baseline's over bmoe's, pipe
and file); min / median / max of `--repeat` rounds and the load average.

    python benchmarks/bench_route.py [--steps 5072] [--keep PATH] [--repeat 5] [--baseline DIR]

The trace is written with the project's RouteTraceWriter from a skewed router: per-layer
Zipf-like popularity plus a pull towards the previous step's experts (so reuse, overlap and
the working set look like a real model's, not uniform noise).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

# the compiled kernels built before their first use: no round measures numba's JIT
os.environ.setdefault("BMOE_KERNEL_BUILD", "wait")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


from bmoe.analyze import route  # noqa: E402
from bmoe.formats.route import (  # noqa: E402
    COLUMNS,
    RouteTraceWriter,
    read_route_columns,
    read_route_trace,
)
from tests.oracles import route as naive_route  # noqa: E402

N_LAYER, N_EXPERT, K = 48, 128, 6
EXPERT_BYTES = 3_538_944  # a 4-bit expert of a 30B-class model


def generate(path: Path, steps: int, prompt: int = 32, seed: int = 0) -> int:
    """Write a route trace of `prompt` prefill and `steps` decode steps; returns its rows."""
    rng = np.random.default_rng(seed)
    popularity = np.log(rng.zipf(1.3, size=(N_LAYER, N_EXPERT)).astype(np.float64))
    layer_ids = np.arange(N_LAYER)
    meta = {"model": "synthetic-48x128.gguf", "arch": "qwen3moe", "n_layer": N_LAYER,
            "n_expert": N_EXPERT, "n_expert_used": K}  # fmt: skip
    sizes = pd.DataFrame(
        {"layer": layer_ids, "expert_bytes": EXPERT_BYTES, "dense_bytes": 12_000_000}
    )
    prev = np.zeros((N_LAYER, N_EXPERT))
    rows = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        writer = RouteTraceWriter(fh, meta, sizes)
        chunk = 256
        total = prompt + steps
        for start in range(0, total, chunk):
            n = min(chunk, total - start)
            ids = np.empty((n, N_LAYER, K), dtype=np.int64)
            weights = np.empty((n, N_LAYER, K))
            for i in range(n):  # one token at a time: the pull towards the last step
                score = popularity + 1.5 * prev + rng.gumbel(size=(N_LAYER, N_EXPERT))
                top = np.argpartition(-score, K, axis=1)[:, :K]
                s = np.take_along_axis(score, top, axis=1)
                order = np.argsort(-s, axis=1)
                ids[i] = np.take_along_axis(top, order, axis=1)
                w = np.exp(np.take_along_axis(s, order, axis=1))
                weights[i] = w / w.sum(axis=1, keepdims=True)
                prev = np.zeros((N_LAYER, N_EXPERT))
                np.put_along_axis(prev, ids[i], 1.0, axis=1)
            step = np.repeat(np.arange(start, start + n), N_LAYER * K)
            residency = rng.choice(3, size=n * N_LAYER * K, p=[0.2, 0.75, 0.05])
            frame = pd.DataFrame(
                {
                    "turn": 0,
                    "phase": (step >= prompt).astype(np.int8),
                    "step": step,
                    "layer": np.tile(np.repeat(layer_ids, K), n),
                    "slot": np.tile(np.arange(K), n * N_LAYER),
                    "expert": ids.reshape(-1),
                    "weight": weights.reshape(-1).round(6),
                    "residency": residency,
                    "expert_bytes": np.where(residency == 0, EXPERT_BYTES, 0),
                    "dropped": 0,
                }
            )[list(COLUMNS)]
            writer.rows(frame)
            rows += len(frame)
    return rows


def timed(fn):
    """(result, CPU seconds of this process), untraced (tracing would slow the pure-Python
    side most)."""
    gc.collect()
    t0 = time.process_time()
    result = fn()
    return result, time.process_time() - t0


def peak_mib(fn) -> float:
    """Peak memory traced while `fn` runs (numpy and Python allocations), in MiB."""
    gc.collect()
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1048576


#: Runs a script or ``-m module`` and reports its own peak RSS (VmHWM of the new process image;
#: a fork's rusage would count the pages of this process too) on stderr at exit.
_MEASURED = """
import atexit, runpy, sys
def report():
    with open("/proc/self/status") as fh:
        hwm = next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM"))
    sys.stderr.write(f"\\nVmHWM {hwm}\\n")
atexit.register(report)
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def child(argv: list[str], sink: str = "pipe", root: Path = ROOT) -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB) of one fresh Python process running `argv` (a script and
    its arguments, or ``-m module ...``) with the bmoe of `root`, its output written to a
    pipe this process drains (``pipe``) or to a file (``file``)."""
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _MEASURED, *argv],
            stdout=subprocess.PIPE if sink == "pipe" else out, stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=path), cwd=root,
        )  # fmt: skip
        if sink == "pipe":
            while proc.stdout.read(1 << 16):  # drained as `| cat` would (stderr stays small)
                pass
            proc.stdout.close()
        err = proc.stderr.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err[-500:]}")
    hwm = int(err.rsplit("VmHWM", 1)[1].split()[0])
    return usage.ru_utime + usage.ru_stime, hwm / 1024


def spread(values: list[float], digits: int = 2) -> str:
    med = float(np.median(values))
    return f"{min(values):.{digits}f} / {med:.{digits}f} / {max(values):.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5072, help="decode steps (5072: 1.47 M rows)")
    ap.add_argument("--keep", type=Path, help="write the trace here and keep it")
    ap.add_argument("--repeat", type=int, default=5, help="end-to-end rounds")
    ap.add_argument("--baseline", type=Path, help="another checkout's root, run alongside")
    args = ap.parse_args()
    for tree in [ROOT, *([args.baseline] if args.baseline else [])]:  # as an install has it
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "bmoe")], check=True)

    tmp = tempfile.TemporaryDirectory()
    path = args.keep or Path(tmp.name) / "bench.route.csv"
    t0 = time.perf_counter()
    n_rows = generate(path, args.steps)
    print(f"trace: {n_rows:,} rows ({path.stat().st_size / 1048576:.0f} MiB), "
          f"{N_LAYER} layers x {N_EXPERT} experts, top-{K}; written in "
          f"{time.perf_counter() - t0:.1f} s")  # fmt: skip

    import pyarrow as pa

    trace, t_read = timed(lambda: read_route_trace(path))
    arrow_peak = pa.default_memory_pool().max_memory() / 1048576
    selected, t_sel = timed(lambda: route.select(trace, "decode"))
    views, t_views = timed(lambda: route.route_views(selected))
    _, t_views2 = timed(lambda: route.route_views(selected))
    t_views = min(t_views, t_views2)
    m_read = peak_mib(lambda: read_route_trace(path))
    m_sel = peak_mib(lambda: route.select(trace, "decode"))
    m_views = peak_mib(lambda: route.route_views(selected))
    m_both = peak_mib(lambda: route.route_views(route.select(trace, "decode")))
    frame_mib = trace.rows.memory_usage(index=False).sum() / 1048576
    print(f"decode rows analysed: {len(selected.rows):,}; the trace as a DataFrame: "
          f"{frame_mib:.0f} MiB ({frame_mib * 1048576 / n_rows:.0f} bytes per row)")  # fmt: skip
    print()
    print("in process                 bmoe CPU   peak (traced)   pure Python CPU   ratio")
    trace = selected = None  # free them before the baseline builds its dicts
    gc.collect()
    (rows, sizes), t_nread = timed(lambda: naive_route.read_rows(str(path)))
    decode_rows, t_nsel = timed(lambda: [r for r in rows if r["phase"] == 1])
    ref, t_nviews = timed(lambda: naive_route.default_views(decode_rows, sizes, K))
    rows = decode_rows = None
    gc.collect()
    for name, ours, mem, theirs in (
        ("read", t_read, m_read, t_nread),
        ("select decode", t_sel, m_sel, t_nsel),
        ("default views", t_views, m_views, t_nviews),
    ):
        print(f"  {name:22} {ours:7.2f} s   {mem:7.0f} MiB   {theirs:12.2f} s   "
              f"{theirs / ours:6.1f}x")  # fmt: skip
    ours = t_read + t_sel + t_views
    theirs = t_nread + t_nsel + t_nviews
    print(f"  {'read + select + views':22} {ours:7.2f} s   {m_both:7.0f} MiB   {theirs:12.2f} s   "
          f"{theirs / ours:6.1f}x")  # fmt: skip
    print(f"  (arrow pool peak while reading: {arrow_peak:.0f} MiB)")
    columns, t_cread = timed(lambda: read_route_columns(path))
    m_cread = peak_mib(lambda: read_route_columns(path))
    chosen, t_csel = timed(lambda: route.select(columns, "decode", consume=True))
    _, t_cviews = timed(lambda: route.view_columns(chosen))
    bytes_row = sum(a.dtype.itemsize for a in chosen.columns.values())
    print(f"  numpy columns (the command line's path, no pandas; {bytes_row} bytes per row):")
    for name, mine, base in (
        ("read", t_cread, t_nread),
        ("select + views", t_csel + t_cviews, t_nsel + t_nviews),
        ("read + select + views", t_cread + t_csel + t_cviews, t_nread + t_nsel + t_nviews),
    ):
        print(f"    {name:20} {mine:7.2f} s                   {base:12.2f} s   "
              f"{base / mine:6.1f}x")  # fmt: skip
    print(f"  (peak traced while reading columns: {m_cread:.0f} MiB)")
    columns = chosen = None

    # the two agree (a benchmark of wrong answers would be worthless)
    reuse = views["reuse"].set_index("layer")
    for layer, expect in ref["reuse"].items():
        got = tuple(int(reuse.loc[layer, c]) for c in ("n_reuse", "p50", "p90", "max", "never_2nd"))
        assert got == expect, (layer, got, expect)
    assert abs(views["overlap"].iloc[-1]["lag_1"] - ref["overlap"]["ALL"][0]) < 1e-9
    ref = views = None
    gc.collect()

    print()
    ours = ["-m", "bmoe", "analyze", "route", str(path)]
    script = [str(ROOT / "tests/oracles/route.py"), str(path)]
    lines = {"bmoe | cat": ("pipe", ROOT), "bmoe > file": ("file", ROOT)}
    if args.baseline:
        lines["baseline bmoe | cat"] = ("pipe", args.baseline)
        lines["baseline bmoe > file"] = ("file", args.baseline)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in [*lines, "script"]}
    loads = []
    order = list(lines)
    for r in range(args.repeat):  # interleaved: a busy moment costs each side alike
        # the order turns each round: no command always runs first after the script
        for name in order[r % len(order) :] + order[: r % len(order)]:
            sink, root = lines[name]
            runs[name].append(child(ours, sink, root))
        runs["script"].append(child(script, "pipe"))
        loads.append(os.getloadavg()[0])
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f}" for k, v in runs.items())
              + f" CPU-s (load {loads[-1]:.1f})", flush=True)  # fmt: skip
    print(f"end to end, fresh processes, CPU-s min / median / max of {args.repeat} rounds "
          f"(load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs):")  # fmt: skip
    cpu = {k: [c for c, _ in v] for k, v in runs.items()}
    for name, values in cpu.items():
        label = "python tests/oracles/route.py | cat" if name == "script" else name
        print(f"  {label:<36} {spread(values)}   peak RSS {max(r for _, r in runs[name]):.0f} MiB")
    for name in lines:
        ratio = [b / a for a, b in zip(cpu[name], cpu["script"], strict=True)]
        print(f"  script / {name:<27} {spread(ratio, 1)}x")
    if args.baseline:
        for sink in ("| cat", "> file"):
            ratio = [b / a for a, b in zip(cpu[f"bmoe {sink}"], cpu[f"baseline bmoe {sink}"],
                                           strict=True)]  # fmt: skip
            print(f"  baseline / bmoe ({sink}){' ' * (21 - len(sink))}{spread(ratio, 2)}x")
    tmp.cleanup()


if __name__ == "__main__":
    main()
