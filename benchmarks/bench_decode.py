"""Decode-trace analysis speed: a per-node compute trace of ~3000 nodes x 500 tokens (1.5M
rows) and an io trace of the same run, analysed by ``bmoe.analyze.op_traces`` and by a
straightforward pure-Python reading of the same files (what a stdlib script does), in the same
run.

    python benchmarks/bench_decode.py [--tokens 500] [--layers 58] [--keep DIR]

The traces are written with the project's own ComputeTraceWriter / IoTraceWriter into a
temporary directory. Prints each side's time, the ratio, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bmoe.analyze import op_traces as dec
from bmoe.formats.op_traces import (
    ComputeTraceWriter,
    IoTraceWriter,
    read_compute_trace,
    read_io_trace,
)

#: One qwen3moe layer as llama.cpp's graph names it (``{il}`` = layer), in execution order.
LAYER_NODES = [
    ("RMS_NORM", "norm-{il}", 1), ("MUL", "attn_norm-{il}", 1), ("MUL_MAT", "Qcur-{il}", 1),
    ("RESHAPE", "Qcur-{il}", 1), ("RMS_NORM", "norm-{il}", 1), ("MUL", "Qcur_normed-{il}", 1),
    ("ROPE", "Qcur-{il}", 1), ("MUL_MAT", "Vcur-{il}", 1), ("RESHAPE", "Vcur-{il}", 1),
    ("MUL_MAT", "Kcur-{il}", 1), ("RESHAPE", "Kcur-{il}", 1), ("RMS_NORM", "norm-{il}", 1),
    ("MUL", "Kcur_normed-{il}", 1), ("ROPE", "Kcur-{il}", 1), ("VIEW", "Kcur-{il} (view)", 0),
    ("SET_ROWS", "cache_k_l{il} (view)", 0), ("VIEW", "Vcur-{il} (view)", 0),
    ("SET_ROWS", "cache_v_l{il} (view)", 0), ("VIEW", "Qcur-{il} (view)", 0),
    ("PERMUTE", "Qcur-{il} (view) (permuted)", 0), ("VIEW", "cache_k_l{il} (view)", 0),
    ("PERMUTE", "cache_k_l{il} (view) (permuted)", 0), ("VIEW", "cache_v_l{il} (view)", 0),
    ("PERMUTE", "cache_v_l{il} (view) (permuted)", 0), ("FLASH_ATTN_EXT", "node_{n}", 0),
    ("RESHAPE", "kqv_out-{il}", 1), ("MUL_MAT", "node_{n}", 0), ("ADD", "ffn_inp-{il}", 1),
    ("RMS_NORM", "norm-{il}", 1), ("MUL", "ffn_norm-{il}", 1),
    ("MUL_MAT", "ffn_moe_logits-{il}", 1), ("SOFT_MAX", "ffn_moe_probs-{il}", 1),
    ("RESHAPE", "ffn_moe_probs-{il} (reshaped)", 0), ("ARGSORT", "ffn_moe_argsort-{il}", 1),
    ("VIEW", "ffn_moe_topk-{il}", 1), ("GET_ROWS", "ffn_moe_weights-{il}", 1),
    ("RESHAPE", "ffn_moe_weights-{il} (reshaped)", 0), ("SUM_ROWS", "ffn_moe_weights_sum-{il}", 1),
    ("CLAMP", "ffn_moe_weights_sum_clamped-{il}", 1), ("DIV", "ffn_moe_weights_norm-{il}", 1),
    ("RESHAPE", "ffn_moe_weights_norm-{il} (reshaped)", 0),
    ("RESHAPE", "ffn_norm-{il} (reshaped)", 0), ("MUL_MAT_ID", "ffn_moe_gate-{il}", 1),
    ("MUL_MAT_ID", "ffn_moe_up-{il}", 1), ("GLU", "ffn_moe_swiglu-{il}", 1),
    ("MUL_MAT_ID", "ffn_moe_down-{il}", 1), ("MUL", "ffn_moe_weighted-{il}", 1),
    ("VIEW", "ffn_moe_weighted-{il} (view)", 0), ("VIEW", "ffn_moe_weighted-{il} (view)", 0),
    ("ADD", "ffn_moe_out-{il}", 1), ("ADD", "l_out-{il}", 1),
]  # fmt: skip


def step_template(n_layer: int) -> pd.DataFrame:
    """One decode step's nodes: embedding, n_layer layers, final norm and LM head."""
    ops, names, layers = ["GET_ROWS"], ["embd"], [-1]
    for il in range(n_layer):
        for op, name, has_layer in LAYER_NODES:
            ops.append(op)
            names.append(name.format(il=il, n=len(ops) - 1))
            layers.append(il if has_layer else -1)
    ops += ["RMS_NORM", "MUL", "MUL_MAT"]
    names += ["norm", "result_norm", "result_output"]
    layers += [-1, -1, -1]
    return pd.DataFrame({"op": ops, "name": names, "layer": np.array(layers, np.int16)})


def write_compute(path: Path, tokens: int, n_layer: int, rng: np.random.Generator) -> int:
    template = step_template(n_layer)
    n = len(template)
    meta = {"model": "bench.gguf", "arch": "qwen3moe", "n_layer": n_layer, "n_threads": 4}
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        writer = ComputeTraceWriter(fh, meta)
        for first in range(0, tokens, 50):
            k = min(50, tokens - first)
            block = pd.concat([template] * k, ignore_index=True)
            block.insert(0, "seq", np.tile(np.arange(n, dtype=np.int32), k))
            block.insert(0, "step", np.repeat(np.arange(first, first + k) + 100, n))
            block.insert(0, "phase", 1)
            block.insert(0, "turn", 0)
            block["wall_ns"] = rng.lognormal(9.5, 1.0, len(block)).astype(np.int64)
            block["majflt"] = (rng.random(len(block)) < 0.002).astype(np.int32) * 3
            writer.rows(
                block[["turn", "phase", "step", "seq", "layer", "op", "name", "wall_ns", "majflt"]]
            )
    return n


def write_io(path: Path, tokens: int, n_layer: int, rng: np.random.Generator) -> int:
    per_step = n_layer * 8 * 3  # 8 experts, 3 projections each
    meta = {"model": "bench.gguf", "arch": "qwen3moe", "n_layer": n_layer, "io_threads": 4}
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        writer = IoTraceWriter(fh, meta)
        rows = tokens * per_step
        layer = np.tile(np.repeat(np.arange(n_layer), 24), tokens)
        expert = rng.integers(0, 128, rows)
        proj = np.tile(np.arange(3), rows // 3)
        frame = pd.DataFrame(
            {
                "turn": 0,
                "phase": 1,
                "step": np.repeat(np.arange(tokens) + 100, per_step),
                "layer": layer,
                "expert": expert,
                "proj": proj,
                "lane": rng.integers(0, 4, rows),
                "spec": (rng.random(rows) < 0.1).astype(int),
                "offset": (layer * 128 + expert) * 3 * 1_572_864 + proj * 1_572_864,
                "req_bytes": 1_572_864,
                "read_bytes": 1_576_960,
                "latency_ns": rng.lognormal(13.0, 0.5, rows).astype(np.int64),
            }
        )
        writer.rows(frame)
    return per_step


# ----------------------------------------------------------------------------- baseline


def baseline_compute(path: Path) -> dict:
    """By op, faults, by layer and the summary, the way a stdlib script reads the file."""
    ns: dict = defaultdict(int)
    faults: dict = defaultdict(int)
    per_layer: dict = defaultdict(int)
    steps = set()
    nodes = 0
    with open(path, newline="") as fh:
        lines = (ln for ln in fh if not ln.startswith("#"))
        for row in csv.DictReader(lines):
            if row["phase"] != "1":
                continue
            wall = int(row["wall_ns"])
            ns[row["op"]] += wall
            faults[row["op"]] += int(row["majflt"])
            per_layer[int(row["layer"])] += wall
            steps.add((row["turn"], row["step"]))
            nodes += 1
    total = sum(ns.values())
    n = len(steps)
    return {
        "ms_per_token": total / n / 1e6,
        "nodes_per_step": nodes / n,
        "by_op": sorted(
            ((v / n / 1e6, 100 * v / total, faults[k] / n, k) for k, v in ns.items()), reverse=True
        ),
        "by_layer": {k: v / n / 1e6 for k, v in sorted(per_layer.items())},
    }


def baseline_io(path: Path) -> dict:
    lat = []
    runs = 0
    by_step: dict = defaultdict(list)
    read = req = busy = 0
    with open(path, newline="") as fh:
        lines = (ln for ln in fh if not ln.startswith("#"))
        for row in csv.DictReader(lines):
            if row["phase"] != "1":
                continue
            latency = int(row["latency_ns"])
            lat.append(latency)
            read += int(row["read_bytes"])
            req += int(row["req_bytes"])
            busy += latency
            by_step[(row["turn"], row["step"])].append((int(row["offset"]), int(row["req_bytes"])))
    for reads in by_step.values():
        reach = None
        for offset, size in sorted(reads):
            if reach is None or offset > reach:
                runs += 1
                reach = offset + size
            else:
                reach = max(reach, offset + size)
    lat.sort()
    n = len(lat)
    return {
        "p50": lat[min(n - 1, math.floor(0.5 * n))] / 1e3,
        "p99": lat[min(n - 1, math.floor(0.99 * n))] / 1e3,
        "lane_busy_mib_s": read / 2**20 / (busy / 1e9),
        "waste_pct": 100 * (read - req) / read,
        "runs_per_token": runs / len(by_step),
    }


# ----------------------------------------------------------------------------- main


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def bmoe_compute(path: Path) -> dict:
    trace = read_compute_trace(path)
    views = dec.analyze_compute(trace, top=None, class_by_layer=True)
    return {
        "ms_per_token": views["summary"]["ms_per_token"],
        "top_op_ms": float(views["by_op"]["ms_per_token"].iloc[0]),
        "layers": len(views["by_layer"]),
    }


def bmoe_io(path: Path) -> dict:
    views = dec.analyze_io(read_io_trace(path), adjacent=True)
    return {
        "p50": views["latency_us"]["p50"],
        "runs_per_token": views["adjacency"]["runs_per_token"],
    }


def baseline_compute_figures(path: Path) -> dict:
    base = baseline_compute(path)
    return {
        "ms_per_token": base["ms_per_token"],
        "top_op_ms": base["by_op"][0][0],
        "layers": len(base["by_layer"]),
    }


def baseline_io_figures(path: Path) -> dict:
    base = baseline_io(path)
    return {"p50": base["p50"], "runs_per_token": base["runs_per_token"]}


SIDES = {
    "bmoe-compute": bmoe_compute,
    "python-compute": baseline_compute_figures,
    "bmoe-io": bmoe_io,
    "python-io": baseline_io_figures,
}


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM: unlike ru_maxrss it is not inherited from
    the parent that forked us)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(side: str, path: Path) -> None:
    """Run one side in this (fresh) process; print its time, peak RSS and figures as JSON."""
    start = time.perf_counter()
    figures = SIDES[side](path)
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    print(json.dumps({"seconds": seconds, "peak_rss_mib": peak, "figures": figures}))


def measure(side: str, path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", side, str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(name: str, what_bmoe: str, what_python: str, ours: dict, theirs: dict) -> None:
    for key, value in theirs["figures"].items():
        got = ours["figures"][key]
        assert abs(got - value) <= 1e-9 * max(1.0, abs(value)), f"{name} {key}: {got} != {value}"
    ratio = theirs["seconds"] / ours["seconds"]
    print(f"{name}: bmoe {ours['seconds']:6.2f} s, peak RSS {ours['peak_rss_mib']:4.0f} MiB "
          f"({what_bmoe})")  # fmt: skip
    pad = " " * len(name)
    rss = theirs["peak_rss_mib"]
    print(f"{pad}  pure Python {theirs['seconds']:6.2f} s, peak RSS {rss:4.0f} MiB "
          f"({what_python})  -> bmoe {ratio:.1f}x faster")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--layers", type=int, default=58, help="58 layers = 2962 nodes/token")
    parser.add_argument("--keep", type=Path, help="write the traces here and keep them")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        ct, it = where / "bench.compute.csv", where / "bench.io.csv"
        t, nodes = timed(write_compute, ct, args.tokens, args.layers, rng)
        print(f"compute trace: {nodes} nodes x {args.tokens} tokens = {nodes * args.tokens:,} "
              f"rows, {ct.stat().st_size / 2**20:.0f} MiB (written in {t:.1f} s)")  # fmt: skip
        t, per_step = timed(write_io, it, args.tokens, args.layers, rng)
        print(f"io trace: {per_step} reads x {args.tokens} tokens = {per_step * args.tokens:,} "
              f"rows, {it.stat().st_size / 2**20:.0f} MiB (written in {t:.1f} s)")  # fmt: skip
        print("each side runs in its own process; times include reading the file")
        compare(
            "compute", "every view: by op, faults, by layer, by class, class x layer",
            "by op, faults, by layer", measure("bmoe-compute", ct), measure("python-compute", ct),
        )  # fmt: skip
        compare(
            "io", "every view, with --adjacent", "latency, bandwidth, waste, adjacency",
            measure("bmoe-io", it), measure("python-io", it),
        )  # fmt: skip


if __name__ == "__main__":
    main()
