"""The metrics CSV's known columns and ``# summary`` keys as the native engine prints them, and
when a run counts as finished: plain data (no pandas, no Arrow), shared by the full reader and
the quick one of ``bmoe info``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Decimal places the native engine prints per column (absent = integer).
ROW_PRECISION: dict[str, int] = {
    "wall_ms": 3, "io_ms": 3, "compute_ms": 3, "cache_hit_pct": 2, "stall_ms": 3, "mgmt_ms": 3,
    "cpu_ms": 3, "dense_resident_frac": 3, "majflt_mib": 2, "cache_budget_mib": 1, "rss_mib": 1,
    "rss_anon_mib": 1, "rss_file_mib": 1, "swap_mib": 1, "mem_available_mib": 1,
    "mem_free_mib": 1, "swap_free_mib": 1, "loop_overhead_ms": 3, "mtp_draft_ms": 3,
    "drain_ms": 3, "adopt_ms": 3, "ra_issue_ms": 3, "ra_wd_ms": 3,
}  # fmt: skip

#: Integer columns and the bits of the compact type they are read as.
INT_COLUMN_BITS: dict[str, int] = {
    "step": 32, "steps": 32, "read_bytes": 64, "majflt": 64, "turn": 16, "mtp_batch": 16,
}  # fmt: skip

#: Decimal places of the ``# summary`` keys the native engine prints (absent = integer or %g).
SUMMARY_PRECISION: dict[str, int] = {
    "s/tok": 3, "tok/s": 3, "read_MiB": 1, "io_s": 2, "compute_s/tok": 3, "io_s/tok": 3,
    "cache_hit_pct": 1, "load_s": 3, "prefill_s": 3, "prefill_tps": 2, "stall_s/tok": 3,
    "mgmt_s/tok": 3, "cache_resident_MiB": 1, "cache_budget_MiB": 1, "spec_recall_pct": 1,
    "spec_read_MiB": 1, "majflt/tok": 2, "cpu_s/tok": 4, "token_demand_MiB": 1,
    "layer_demand_MiB": 1, "loop_overhead_s/tok": 4, "mtp_draft_s/tok": 4, "ra_agree_pct": 1,
    "ra_gemv_ms/tok": 2, "ra_issue_ms/tok": 2, "ra_wd_ms/tok": 2, "drain_s/tok": 3,
    "adopt_s/tok": 3, "prefill_cpu_s": 3, "prefill_read_mib": 1, "prefill_io_s": 3,
    "prefill_stall_s": 3, "prefill_mgmt_s": 3, "prefill_dev_read_mib": 1,
    "prefill_dev_stall_s": 3, "row_table_MiB": 1, "row_resident_MiB": 1, "row_read_MiB": 1,
}  # fmt: skip


def run_unfinished(
    summaries: Sequence[Mapping[str, Any]], rows: int, steps: int | None, turns: int
) -> bool:
    """Whether a run did not finish: no ``# summary`` trailer, or rows other than the
    summaries' ``tokens`` add up to (one per turn of a session). A run the model ended at its
    end of sequence has fewer rows than ``steps`` and is finished. Without ``tokens`` (older
    files) the rows of a one-turn file (`turns`: distinct turns in the rows) are held against
    `steps`, the last row's target."""
    if not summaries:
        return True
    counts = [s.get("tokens") for s in summaries]
    if all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
        return rows != sum(counts)  # type: ignore[arg-type]
    if turns > 1:
        return False  # session: each turn has its own target
    return steps is not None and rows < steps
