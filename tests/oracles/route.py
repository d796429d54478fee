"""A straightforward pure-Python implementation of the route views, written the way an ad-hoc
script would: dicts, sets and loops over rows. It is the speed baseline of
``bench_route.py`` and, being independent of ``bmoe.analyze.route``, its oracle in the tests.

Rows are dicts with the trace's columns; `sizes` maps layer -> one expert's bytes.
"""

from __future__ import annotations

import csv
import math
from collections import Counter, defaultdict

MARKS = (1, 2, 5, 10, 25, 50, 100, 200, 500, 1000)
LAGS = (1, 2, 4, 8)


def read_rows(path: str) -> tuple[list[dict], dict[int, int]]:
    """Rows and per-layer expert sizes of a route trace CSV, with the csv module."""
    sizes: dict[int, int] = {}
    rows: list[dict] = []
    with open(path, newline="") as fh:
        lines = (ln for ln in fh)
        header = None
        for line in lines:
            if line.startswith("#"):
                kv = dict(t.split("=", 1) for t in line[1:].split() if "=" in t)
                if "layer" in kv and "expert_bytes" in kv:
                    sizes[int(kv["layer"])] = int(kv["expert_bytes"])
                continue
            header = line.strip().split(",")
            break
        for rec in csv.reader(lines):
            row = dict(zip(header, rec, strict=True))
            for key in row:
                row[key] = float(row[key]) if key == "weight" else int(row[key])
            rows.append(row)
    return rows, sizes


def step_sequences(rows: list[dict]) -> dict[int, list[list[int]]]:
    """layer -> its cells ordered by (turn, step, phase), each cell's experts in slot order."""
    cells: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        key = (r["layer"], r.get("turn", 0), r["step"], r.get("phase", 1))
        cells[key].append((r.get("slot", 0), r["expert"]))
    seqs: dict[int, list[list[int]]] = defaultdict(list)
    for key in sorted(cells):
        seqs[key[0]].append([e for _, e in sorted(cells[key], key=lambda t: t[0])])
    return dict(sorted(seqs.items()))


def quantile(sorted_values: list[int], q: float) -> int:
    n = len(sorted_values)
    return sorted_values[min(n - 1, math.floor(q * n))]


def sanity(rows: list[dict], k: int) -> dict:
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        cells[(r.get("turn", 0), r.get("phase", 1), r["step"], r["layer"])].append(r)
    sums = [
        sum(r["weight"] for r in rs)
        for rs in cells.values()
        if all(not math.isnan(r["weight"]) for r in rs)
    ]
    per_layer = Counter(key[3] for key in cells)
    return {
        "rows": len(rows),
        "cells": len(cells),
        "steps": len({key[:3] for key in cells}),
        "layers": len(per_layer),
        "cells_not_k": sum(1 for rs in cells.values() if len(rs) != k),
        "steps_per_layer_min": min(per_layer.values()),
        "steps_per_layer_max": max(per_layer.values()),
        "weight_sum_min": min(sums) if sums else None,
        "weight_sum_max": max(sums) if sums else None,
    }


def hot(seqs: dict[int, list[list[int]]], top: int = 8) -> dict[int, tuple]:
    out = {}
    for layer, seq in seqs.items():
        counts = Counter(e for cell in seq for e in cell)  # insertion order = first routed
        best = counts.most_common(top)
        total = sum(counts.values())
        out[layer] = (
            len(counts),
            100.0 * sum(c for _, c in best) / total,
            " ".join(f"{e}:{c}" for e, c in best),
        )
    return out


def reuse(seqs: dict[int, list[list[int]]]) -> dict[int, tuple]:
    out = {}
    for layer, seq in seqs.items():
        last: dict[int, int] = {}
        dists: list[int] = []
        counts: Counter = Counter()
        for i, cell in enumerate(seq):
            for e in cell:
                if e in last:
                    dists.append(i - last[e])
                last[e] = i
                counts[e] += 1
        dists.sort()
        once = sum(1 for c in counts.values() if c == 1)
        if dists:
            out[layer] = (len(dists), quantile(dists, 0.5), quantile(dists, 0.9), dists[-1], once)
        else:
            out[layer] = (0, None, None, None, once)
    return out


def overlap(seqs: dict[int, list[list[int]]], lags=LAGS) -> dict:
    out: dict = {}
    pooled: dict[int, list[float]] = {g: [] for g in lags}
    for layer, seq in seqs.items():
        sets = [set(cell) for cell in seq]
        row = []
        for g in lags:
            vals = [100.0 * len(sets[i] & sets[i - g]) / len(sets[i]) for i in range(g, len(sets))]
            pooled[g].extend(vals)
            row.append(sum(vals) / len(vals) if vals else 0.0)
        out[layer] = tuple(row)
    out["ALL"] = tuple(sum(v) / len(v) if v else 0.0 for v in pooled.values())
    return out


def workset(seqs: dict[int, list[list[int]]], n_steps: int, sizes: dict[int, int]) -> dict:
    marks = [m for m in MARKS if m <= n_steps]
    if not marks or marks[-1] != n_steps:
        marks.append(n_steps)
    out: dict = {}
    union = 0.0
    for layer, seq in seqs.items():
        seen: set[int] = set()
        grow = []
        for cell in seq:
            seen.update(cell)
            grow.append(len(seen))
        out[layer] = {f"s{m}": grow[min(m, len(grow)) - 1] for m in marks}
        union += len(seen) * sizes.get(layer, float("nan")) / 1048576
    out["union_mib"] = union
    return out


def cache(rows: list[dict]) -> dict:
    counts: dict = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        counts[r["layer"]][r["residency"]] += 1
        counts["ALL"][r["residency"]] += 1
    return {
        layer: (*tuple(100.0 * c / sum(cs) for c in cs), sum(cs)) for layer, cs in counts.items()
    }


def entropy(rows: list[dict]) -> dict[int, tuple]:
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        cells[(r["layer"], r.get("turn", 0), r.get("phase", 1), r["step"])].append(r["weight"])
    per_layer: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for key, ws in cells.items():
        ws = [w for w in ws if not math.isnan(w)]
        total = sum(ws)
        if total <= 0:
            continue
        ps = [w / total for w in ws]
        h = -sum(p * math.log2(p) for p in ps if p > 0)
        per_layer[key[0]].append((h, 100.0 * max(ps)))
    return {
        layer: (sum(h for h, _ in v) / len(v), sum(t for _, t in v) / len(v))
        for layer, v in sorted(per_layer.items())
    }


def bytes_read(rows: list[dict], n_steps: int) -> dict:
    read: Counter = Counter()
    for r in rows:
        read[r["layer"]] += r["expert_bytes"]
    out = {layer: read[layer] / 1048576 for layer in sorted(read)}
    out["ALL"] = sum(read.values()) / 1048576
    out["mib_per_step"] = out["ALL"] / n_steps
    return out


def default_views(rows: list[dict], sizes: dict[int, int], k: int) -> dict:
    """The default view set, as the straightforward script computes it."""
    seqs = step_sequences(rows)
    n_steps = len({(r.get("turn", 0), r.get("phase", 1), r["step"]) for r in rows})
    return {
        "sanity": sanity(rows, k),
        "hot": hot(seqs),
        "reuse": reuse(seqs),
        "overlap": overlap(seqs),
        "workset": workset(seqs, n_steps, sizes),
        "cache": cache(rows),
        "entropy": entropy(rows),
        "bytes": bytes_read(rows, n_steps),
    }


def main(argv: list[str]) -> None:
    """``python naive_route.py TRACE``: the decode-phase default views, printed as a script
    would (the end-to-end baseline of ``bench_route.py``)."""
    rows, sizes = read_rows(argv[0])
    decode = [r for r in rows if r.get("phase", 1) == 1]
    del rows
    k = Counter((r.get("turn", 0), r["step"], r["layer"]) for r in decode).most_common(1)[0][1]
    for name, view in default_views(decode, sizes, k).items():
        print(f"=== {name} ===")
        items = view.items() if isinstance(view, dict) else enumerate(view)
        for key, value in items:
            print(key, value)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
