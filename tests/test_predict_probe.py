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
