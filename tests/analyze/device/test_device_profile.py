"""The device profile itself (``bmoe.analyze.device``): :func:`build_profile` on runs made by
hand as DataFrames (no files), its figures checked against values worked out by hand here.

The model has 2 MoE layers and 1 MiB experts (v2's ``cache_cycle_mb`` of 4 MiB is one token's
2 layers x top-2), so a token's reads spread evenly over the 2 layers, one read batch a layer.
Serial runs (no ``--overlap``): a token's ``io_ms`` is ``batches x overhead + waves x latency``,
a wave being one request on each busy lane of a batch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bmoe.analyze.device import ProfileRun, build_profile
from bmoe.formats.metrics import MetricsRun

MIB = 1 << 20
N = 32  # tokens a run; even tokens read more than odd ones
EVEN = np.arange(N) % 2 == 0
PARAMS = {
    "model": "hand.gguf", "arch": "qwen3moe", "n_layer": 2, "n_expert": 8, "n_expert_used": 2,
    "threads": 2, "moe_stream": 1, "cache_mb": 3, "io_threads": 1, "overlap": 0, "prefetch": 0,
    "dense_weights": "mmap", "cache_cycle_mb": 4,
}  # fmt: skip


def run(name: str, reads, io_ms, compute_ms, **params) -> ProfileRun:
    """A run of `N` decode tokens from per-token reads, flash wait and compute; management
    takes 1 ms a token + 0.5 ms a read, the CPU time is two threads busy through compute."""
    reads, io, compute = (np.asarray(x, dtype=float) for x in (reads, io_ms, compute_ms))
    mgmt = 1.0 + 0.5 * reads
    frame = pd.DataFrame(
        {"step": np.arange(1, N + 1), "steps": N, "wall_ms": compute + io + mgmt, "io_ms": io,
         "compute_ms": compute, "read_bytes": reads * MIB, "cache_hit_pct": 50.0,
         "stall_ms": 0.0, "mgmt_ms": mgmt, "majflt": 0, "cpu_ms": compute * 2}
    )  # fmt: skip
    trailer = {"tokens": N, "tok/s": 1000 * N / float(frame["wall_ms"].sum())}
    return ProfileRun(MetricsRun(name, 2, {**PARAMS, **params}, frame, [trailer]))


def two_lane_counts():
    """One lane: 4 reads (2 a layer: 2 waves a layer, 4 in all) or 2 (2 waves), 0.5 ms a
    batch and 2 ms a wave: io 2 x 0.5 + 4 x 2 = 9 and 2 x 0.5 + 2 x 2 = 5 ms; compute 10 ms.
    Two lanes: 8 reads (4 a layer: 2 waves a layer) or 4 (1 wave a layer), 0.5 ms a batch and
    3 ms a wave (a request is slower beside another): io 1 + 4 x 3 = 13 and 1 + 2 x 3 = 7 ms;
    compute 12 ms on the heavy tokens and 16 on the light ones."""
    one = run("one-lane", np.where(EVEN, 4, 2), np.where(EVEN, 9.0, 5.0), np.full(N, 10.0))
    two = run("two-lanes", np.where(EVEN, 8, 4), np.where(EVEN, 13.0, 7.0),
              np.where(EVEN, 12.0, 16.0), io_threads=2)  # fmt: skip
    return build_profile([one, two])


def test_flash_fit_separates_batch_overhead_from_wave_latency_per_lane_count() -> None:
    flash = two_lane_counts().flash.set_index("lanes")
    assert list(flash.index) == [1, 2]
    assert (flash["req_bytes"] == MIB).all()  # one request per 1 MiB expert
    assert flash.loc[1, "latency_ms"] == pytest.approx(2.0)
    assert flash.loc[2, "latency_ms"] == pytest.approx(3.0)
    assert flash["batch_overhead_ms"].tolist() == pytest.approx([0.5, 0.5])
    # MiB/s: lanes x 1 MiB per wave latency: 1 / 2 ms = 500, 2 / 3 ms = 666.7
    assert flash["mib_s"].tolist() == pytest.approx([500.0, 2000.0 / 3])
    # reads: waves x lanes over the run: 16 tokens x 4 waves + 16 x 2 = 96, x 1 and x 2 lanes
    assert flash["reads"].tolist() == [96, 192]
    assert (flash["source"] == "io_ms").all()


def test_flash_percentiles_are_on_the_fitted_latency_scale() -> None:
    """The spread comes from io_ms per wave, scaled so its median is the fitted latency. One
    lane: 9 / 4 = 2.25 and 5 / 2 = 2.5 ms a wave, 16 of each: median 2.375, scale 2 / 2.375;
    the 10th percentile is 2.25 x that, the 90th 2.5 x. Two lanes: 13 / 4 = 3.25 and
    7 / 2 = 3.5, median 3.375, scale 3 / 3.375."""
    flash = two_lane_counts().flash.set_index("lanes")
    assert flash.loc[1, "latency_ms_p10"] == pytest.approx(2.25 * 2 / 2.375)
    assert flash.loc[1, "latency_ms_p90"] == pytest.approx(2.5 * 2 / 2.375)
    assert flash.loc[2, "latency_ms_p10"] == pytest.approx(3.25 * 3 / 3.375)
    assert flash.loc[2, "latency_ms_p90"] == pytest.approx(3.5 * 3 / 3.375)


def test_compute_per_token_is_the_mean_over_every_timed_token() -> None:
    """32 tokens of 10 ms, 16 of 12 and 16 of 16: (320 + 192 + 256) / 64 = 12 ms a token (the
    mean, as tok/s sums time), 10th percentile 10 (the 7th of 64 sorted), 90th 16 (the 57th).
    By read volume: the 2 and 4 MiB tokens of one lane average to 10 ms at their mean 3 MiB,
    the 4 and 8 MiB of two lanes to 14 ms at 6 MiB."""
    compute = two_lane_counts().compute
    assert compute["token_ms"] == pytest.approx(12.0)
    assert (compute["token_ms_p10"], compute["token_ms_p90"]) == pytest.approx((10.0, 16.0))
    assert compute["threads"] == 2
    assert compute["source"] == "compute_ms"
    assert compute["by_read"] == [
        {"read_mib": pytest.approx(3.0), "token_ms": pytest.approx(10.0)},
        {"read_mib": pytest.approx(6.0), "token_ms": pytest.approx(14.0)},
    ]


def test_management_is_a_per_token_cost_plus_a_per_read_one() -> None:
    prof = two_lane_counts()
    assert prof.mgmt["token_ms"] == pytest.approx(1.0)
    assert prof.mgmt["per_admit_ms"] == pytest.approx(0.5)
