"""The flash probe through the local target: dd O_DIRECT reads at sizes and lane counts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bmoe.errors import BmoeError
from bmoe.sweep.probe import probe, target_spec


def test_target_spec_names_the_transports() -> None:
    assert target_spec("local").kind == "local"
    adb = target_spec("adb:R5CT")
    assert (adb.kind, adb.serial) == ("adb", "R5CT")
    ssh = target_spec("ssh:me@phone:2222")
    assert (ssh.kind, ssh.user, ssh.host, ssh.port) == ("ssh", "me", "phone", 2222)
    with pytest.raises(BmoeError, match="name a target"):
        target_spec("usb")


def test_local_probe_measures_every_size_and_lane_count(tmp_path: Path) -> None:
    data = tmp_path / "blob.bin"
    data.write_bytes(os.urandom(2 << 20))
    table = probe("local", str(data), tmp_path / "state", [65536, 131072], [1, 2],
                  reads=4, repeats=2)  # fmt: skip
    assert sorted(zip(table["lanes"], table["req_bytes"], strict=True)) == [
        (1, 65536), (1, 131072), (2, 65536), (2, 131072),
    ]  # fmt: skip
    assert (table["latency_ms"] > 0).all()
    assert (table["latency_ms_p10"] <= table["latency_ms_p90"]).all()
    assert table["reads"].tolist() == [8, 16, 8, 16]  # reads per lane x lanes x repeats


def test_probe_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BmoeError, match="cannot read"):
        probe("local", str(tmp_path / "nope.bin"), tmp_path / "state", [4096], [1])


def test_probe_replaces_the_flash_latencies_and_keeps_the_engine_overhead() -> None:
    import pandas as pd

    from bmoe.analyze.device import with_probe
    from tests.analyze.device.test_predict import round_profile

    flash = [
        {"lanes": 1, "req_bytes": 1 << 20, "latency_ms": 2.0, "batch_overhead_ms": 0.5, "reads": 1},
        {"lanes": 4, "req_bytes": 1 << 20, "latency_ms": 4.0, "batch_overhead_ms": 1.5, "reads": 1},
    ]
    probed = pd.DataFrame(
        {"lanes": [1, 2, 4], "req_bytes": [1 << 20] * 3, "latency_ms": [1.0, 1.5, 3.0],
         "latency_ms_p10": [0.9, 1.4, 2.8], "latency_ms_p90": [1.1, 1.6, 3.2],
         "batch_overhead_ms": 0.0, "mib_s": [1000.0, 1300.0, 1300.0], "reads": [9, 9, 9]}
    )  # fmt: skip
    out = with_probe(round_profile(flash=flash), probed, "local (blob.bin)")
    assert out.flash["latency_ms"].tolist() == [1.0, 1.5, 3.0]
    # the overhead at 2 lanes interpolates the runs' 0.5 (1 lane) and 1.5 (4 lanes)
    assert out.flash["batch_overhead_ms"].tolist() == pytest.approx([0.5, 0.5 + 1 / 3, 1.5])
    assert "probe on local (blob.bin)" in out.caveats[-1]


class _TimedTarget:
    """A target whose file is 1 MiB and whose probe runs take the given times (ns), in turn."""

    name = "timed"

    def __init__(self, elapsed_ns: list[int]) -> None:
        self.elapsed = list(elapsed_ns)

    def shell(self, script: str, args: list[str], timeout: float = 60.0):
        import subprocess

        from bmoe.sweep.probe import SIZE_SCRIPT

        out = str(1 << 20) if script == SIZE_SCRIPT else str(self.elapsed.pop(0))
        return subprocess.CompletedProcess(args, 0, out.encode(), b"")


def test_probe_rows_are_the_profile_flash_rows() -> None:
    """The probe's row is the one the profile's flash table is made of (one builder): three
    repeats of 2 lanes x 4 reads of 4 KiB taking 4, 16 and 8 ms are 1, 4 and 2 ms a request."""
    import numpy as np

    from bmoe.analyze.device.flash import flash_row
    from bmoe.sweep.probe import probe_flash

    table = probe_flash(
        _TimedTarget([4_000_000, 16_000_000, 8_000_000]), "blob", [4096], [2], reads=4, repeats=3
    )
    row = table.iloc[0].to_dict()
    assert row == flash_row(2, 4096, 2.0, np.array([1.0, 4.0, 2.0]), 24)
    assert row["latency_ms"] == pytest.approx(2.0)  # the median (the mean is 2.33)
    # percentiles by linear interpolation over 1, 2, 4: 1 + 0.2 x 1 and 2 + 0.8 x 2
    assert (row["latency_ms_p10"], row["latency_ms_p90"]) == pytest.approx((1.2, 3.6))
    # two lanes each moving 4 KiB in 2 ms: 8 KiB / 2 ms = 4000 KiB/s = 3.90625 MiB/s
    assert row["mib_s"] == pytest.approx(3.90625)
    assert row["reads"] == 24 and row["batch_overhead_ms"] == 0.0 and "source" not in row
