"""The metrics CSV's per-token columns and ``# summary`` keys: one table of the columns
(:data:`COLUMNS`: name, since which version, type or printed precision, role) from which
every other layer's list is derived, the summary keys' precision, and when a run counts as
finished. Plain data (no pandas, no Arrow), shared by the full reader, the quick one of
``bmoe info``, the writer, the analysis and the embedded engine. ``docs/adding-a-column.md``
says how a column is added."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: What a column is, which decides what the layers above do with it:
#: ``position`` where the token stands (step, target, turn); ``cost`` what the decode cost,
#: charged whole to a speculation group's first row (spread over the group when read);
#: ``gauge`` a reading taken at the token (the cumulative hit rate, the dense residency);
#: ``budget`` the cache budget in effect; ``memory`` the process's and the device's memory
#: as the platform reports it (0: it cannot); ``group`` the size of the group a row belongs
#: to.
ROLES = ("position", "cost", "gauge", "budget", "memory", "group")


@dataclass(frozen=True)
class Column:
    """One per-token column: `name`; `since`, the first ``bmoe_metrics`` version whose rows
    carry it (0: the files without a preamble); `role` (:data:`ROLES`); `digits`, the
    decimals it is printed with (a float), or `int_bits`, the bits of the compact integer it
    is read as (an integer), neither for a float printed as ``%g``; `native`, whether the
    native engine's header has it (the embedded engine writes the others only when the
    feature that measures them is on)."""

    name: str
    since: int
    role: str
    digits: int | None = None
    int_bits: int | None = None
    native: bool = True

    @property
    def is_int(self) -> bool:
        return self.int_bits is not None


#: Every known per-token column, in the native engine's order (then the embedded engine's own).
COLUMNS: tuple[Column, ...] = (
    Column("step", 0, "position", int_bits=32),
    Column("steps", 0, "position", int_bits=32),
    Column("wall_ms", 0, "cost", digits=3),
    Column("io_ms", 0, "cost", digits=3),
    Column("compute_ms", 0, "cost", digits=3),
    Column("read_bytes", 0, "cost", int_bits=64),
    Column("cache_hit_pct", 0, "gauge", digits=2),
    Column("stall_ms", 0, "cost", digits=3),
    Column("mgmt_ms", 0, "cost", digits=3),
    Column("majflt", 0, "cost", int_bits=64),
    Column("cpu_ms", 0, "cost", digits=3),
    Column("dense_resident_frac", 1, "gauge", digits=3),
    Column("turn", 1, "position", int_bits=16),
    Column("majflt_mib", 1, "cost", digits=2),
    Column("cache_budget_mib", 1, "budget", digits=1),
    Column("rss_mib", 1, "memory", digits=1),
    Column("rss_anon_mib", 1, "memory", digits=1),
    Column("rss_file_mib", 1, "memory", digits=1),
    Column("swap_mib", 1, "memory", digits=1),
    Column("mem_available_mib", 1, "memory", digits=1),
    Column("mem_free_mib", 1, "memory", digits=1),
    Column("swap_free_mib", 1, "memory", digits=1),
    Column("loop_overhead_ms", 2, "cost", digits=3),
    Column("mtp_batch", 2, "group", int_bits=16),
    Column("mtp_draft_ms", 2, "cost", digits=3),
    Column("drain_ms", 2, "cost", digits=3),
    Column("adopt_ms", 2, "cost", digits=3),
    Column("ra_issue_ms", 2, "cost", digits=3),
    Column("ra_wd_ms", 2, "cost", digits=3),
    # the embedded engine's own, under --fidelity-ref: KL(reference || run) of the next-token
    # distribution this token was chosen from, nats (the summary's fidelity_kl is their mean)
    Column("fidelity_kl", 2, "gauge", native=False),
)

BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}


def native_columns(version: int) -> list[str]:
    """The native engine's header of a ``bmoe_metrics`` `version` file (v0 files stop
    earlier still: 8, 9 or 11 of these)."""
    return [c.name for c in COLUMNS if c.native and c.since <= version]


def with_role(*roles: str) -> tuple[str, ...]:
    """The columns of `roles`, in table order."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown column role(s): {sorted(unknown)}")
    return tuple(c.name for c in COLUMNS if c.role in roles)


#: Decimal places the native engine prints per float column (absent = integer or ``%g``).
ROW_PRECISION: dict[str, int] = {c.name: c.digits for c in COLUMNS if c.digits is not None}
#: Integer columns and the bits of the compact type they are read as.
INT_COLUMN_BITS: dict[str, int] = {c.name: c.int_bits for c in COLUMNS if c.int_bits is not None}
#: Float columns (read as float64: metrics files are small, and it keeps printed digits exact).
FLOAT_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if not c.is_int)

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
