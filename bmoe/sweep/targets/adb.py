"""An Android device over adb as a target (``kind = "adb"``)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from bmoe.sweep.checking import Checker
from bmoe.sweep.targets.base import RemoteTarget, TargetError, TargetKind, TargetSpec
from bmoe.sweep.tomltext import KeyPath


class AdbTarget(RemoteTarget):
    """An Android device: ``adb [-s SERIAL] shell``, ``push`` and ``pull``."""

    def _adb(self) -> list[str]:
        base = [self.spec.adb]
        if self.spec.serial:
            base += ["-s", self.spec.serial]
        return base

    def command(self, remote):
        return [*self._adb(), "shell", remote]

    def push(self, local, remote):
        res = subprocess.run([*self._adb(), "push", str(local), remote], capture_output=True,
                             stdin=subprocess.DEVNULL, timeout=300)  # fmt: skip
        if res.returncode != 0:
            raise TargetError(f"target {self.name}: adb push failed: "
                              + res.stderr.decode("utf-8", "replace").strip())  # fmt: skip

    def fetch(self, run_dir, names, staging):
        got = []
        for name in names:
            remote = str(PurePosixPath(run_dir) / name)
            dest = staging / name
            res = subprocess.run([*self._adb(), "pull", remote, str(dest)], capture_output=True,
                                 stdin=subprocess.DEVNULL, timeout=600)  # fmt: skip
            if res.returncode == 0 and dest.is_file():
                got.append(name)
        return got


def _check(
    check: Checker, table: Mapping[str, Any], key: KeyPath, fields: dict[str, Any], engine: str
) -> None:
    if "serial" in table:
        fields["serial"] = check.string(table["serial"], (*key, "serial"))
    if "adb" in table:
        fields["adb"] = check.string(table["adb"], (*key, "adb"))
    fields.setdefault("workdir", "/data/local/tmp/bmoe")
    fields.setdefault("kill_strays", "name")
    if "binary" not in fields and engine == "native":
        raise check.fail(key, "an adb target needs 'binary' (bmoe-cli on the device)")


def _resolved(spec: TargetSpec) -> dict[str, Any]:
    item: dict[str, Any] = {"adb": spec.adb}
    if spec.serial:
        item["serial"] = spec.serial
    return item


KIND = TargetKind(
    name="adb",
    keys=("serial", "adb"),
    check=_check,
    default_name=lambda fields: f"adb-{fields.get('serial') or 'device'}",
    resolved=_resolved,
    transport=AdbTarget,
    no_embedded="the embedded engine runs where Python runs (local or ssh), not over adb",
)
