"""Run-level views as text: the printed precision of each figure (the native engine's,
where it prints one)."""

from __future__ import annotations

#: Printed precision per column (the native engine's, where it prints one).
DIGITS = {
    "tok_s_mean": 3, "tok_s_min": 3, "tok_s_max": 3, "tok_s_median": 3, "tok_s_p5": 3,
    "tok_s_p95": 3, "steady_tok_s_mean": 3, "tok_s_effective": 3, "prefill_tps": 2,
    "ttft_s": 3, "cache_hit_pct": 1, "read_mib_per_token": 2, "steady_read_mib_per_token": 2,
    "stall_ms_per_token": 1, "mgmt_ms_per_token": 1, "peak_rss_gb": 2, "mem_floor_gb": 2,
    "cpu_temp_start_c": 1, "cpu_temp_max_c": 1, "batt_temp_max_c": 1, "rows_rss_max_gb": 2,
    "rows_swap_max_gb": 2, "rows_mem_available_min_gb": 2, "majflt_per_token": 2,
    "token_demand_mib": 1, "prefetch_read_mib": 1, "prefetch_useful_pct": 1, "drop_pct": 1,
    "ms_per_token": 1, "pct_of_wall": 1, "a": 3, "b": 3, "delta": 3, "delta_pct": 1,
    "ci_low": 3, "ci_high": 3, "loop_overhead_ms_per_token": 2, "draft_ms_per_token": 2,
    "tokens_per_decode": 2, "draft_acceptance_pct": 1, "drafted_steps_pct": 1,
}  # fmt: skip

__all__ = ["DIGITS"]
