"""Decode views as text: display precision and the notes that go with the compute and io
views (where the time of a streamed run shows up, how each trace granularity distorts)."""

from __future__ import annotations

#: Decimal places per column in table and markdown output.
DIGITS: dict[str, int] = {
    "ms_per_token": 2, "share_pct": 1, "majflt_per_token": 1, "nodes_per_token": 1,
    "fault_share_pct": 1, "reads_per_token": 1, "mib": 1, "mib_s": 0, "us_per_read": 1,
    "mib_per_token": 2, "busy_ms_per_token": 2, "runs_per_token": 1, "ceiling": 2,
    "traced_ms": 3, "wall_ms": 3, "io_ms": 3, "compute_ms": 3, "stall_ms": 3, "mgmt_ms": 3,
    "cpu_ms": 3, "traced_pct_of_wall": 1, "busy_ms": 3, "busiest_lane_ms": 3,
    "attention_ms": 3, "router_ms": 3, "expert_matmul_ms": 3, "dense_ffn_ms": 3, "norm_ms": 3,
    "other_ms": 3, "attention": 3, "router": 3, "expert matmul": 3, "dense FFN": 3, "norm": 3,
    "other": 3, "total": 3,
}  # fmt: skip

COMPUTE_NOTE = {
    "node": "measured, not a residual: each node was isolated and synchronized. The barrier "
    "that makes it measurable also inflates it; compare shares, not absolutes.",
    "layer": "one barrier per layer: coalescing and the expert prefetch survive, so these "
    "numbers sit close to an untraced run. No per-op detail inside a segment.",
}
STREAM_NOTE = (
    "In a streamed run (--moe-stream) the experts are staged at the routing barrier, and "
    "that wait is charged to the node after it (ffn_moe_weights in llama.cpp's MoE graph): "
    "'router' then carries the expert loading. With --metrics, router_ms sits next to io_ms."
)
IO_NOTE = "lane-busy bandwidth is read bytes over summed read latency, aggregated over lanes"

__all__ = ["COMPUTE_NOTE", "DIGITS", "IO_NOTE", "STREAM_NOTE"]
